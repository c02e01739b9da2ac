"""``python -m bench.hotpath`` (make bench-hotpath) measures what a router runs:
the keyed block hashes of a router with replica sync, over a long system
message when asked, with the hashing shown on its own row (memoised, as the
router runs it, and afresh) and not counted twice in the total."""

from __future__ import annotations

import re

import pytest

from bench import hotpath
from kinference_common.request_body import parse


def rows(text: str) -> dict[str, float]:
    return {m.group(1).strip(): float(m.group(2)) for m in re.finditer(r"^(\S.*?|  \S.*?)\s+([\d.]+)\s+\d+$", text,
                                                                      re.MULTILINE)}


def test_system_prompt_has_the_length_asked() -> None:
    assert hotpath.system_prompt(0) == hotpath.SYSTEM
    long = hotpath.system_prompt(16384)
    assert len(long) == 16384 and long != hotpath.system_prompt(8192)
    assert parse(hotpath.body(1, long), chat=True).texts[0] == long


@pytest.mark.parametrize("chars,blocks", [(0, 0), (16384, 64)])
def test_hotpath_reports_the_hashing_it_does(capsys: pytest.CaptureFixture[str], chars: int, blocks: int) -> None:
    hotpath.main(["--iterations", "50", "--rounds", "1", "--system-chars", str(chars)])
    out = capsys.readouterr().out
    assert f"{blocks} blocks hashed per request" in out
    r = rows(out)
    steps = ("parse", "engine request", "decide", "trace", "record")
    assert set(steps) | {"block hashes", "(unmemoised)", "total"} <= set(r), out
    # the hashing is a part of the engine request, not a step added again
    assert r["total"] == pytest.approx(sum(r[s] for s in steps), abs=0.05)
    if blocks:
        # 64 keyed blocks hashed afresh cost more than a whole engine request
        # that resumes the system message's chain from the memo
        assert r["(unmemoised)"] > r["engine request"] > r["block hashes"], out
