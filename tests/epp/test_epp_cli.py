"""kinference-router's Endpoint Picker flags."""

from __future__ import annotations

import pytest

from kinference_router.__main__ import parse_args, run


def test_epp_flags_parse_with_their_defaults() -> None:
    args = parse_args(["--pool", "default/p", "--epp-port", "9002", "--egress-port", "8082"])
    assert (args.epp_port, args.epp_host, args.egress_port, args.epp_fallbacks) == (9002, "127.0.0.1", 8082, 0)
    assert args.egress_address is None and not args.epp_conformance_hooks
    assert parse_args([]).epp_port is None and parse_args([]).egress_port is None  # off by default


async def test_an_epp_serves_exactly_one_pool(capsys: pytest.CaptureFixture[str]) -> None:
    assert await run(parse_args(["--source", "kubernetes", "--epp-port", "9002"])) == 1
    assert "--epp-port and --egress-port need --pool" in capsys.readouterr().err
