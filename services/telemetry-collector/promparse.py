"""Specialised Prometheus text-format parsers for vLLM and DCGM exporter pages.

A general parser (``prometheus_client.parser``) builds every family, sample
and label dict of a page; a vLLM page is mostly histogram buckets the
collector never reads. These parsers hand one compiled regular expression the
whole body: it only stops, in C, on the lines of the families we read, so a
60 KB page costs a few dozen Python-level steps rather than a thousand.

Both parsers are total: any byte string in, a result out (missing families
are ``None``), never an exception. They take ``bytes`` so no decode is spent
on the buckets. Series whose value is not a finite number are skipped.

vLLM: every series carries ``engine`` (and ``model_name``); counts are summed
over series, KV-cache use is averaged. Old and new names are both read
(TELEMETRY.md): ``gpu_cache_usage_perc`` / ``kv_cache_usage_perc``,
``gpu_prefix_cache_*`` / ``prefix_cache_*``; the new name wins when a page
holds both. ``_created`` series and ``_bucket`` lines are never matched.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

# ------------------------------------------------------------------ labels

_LABEL = re.compile(rb'([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\\n]|\\.)*+)"')


def parse_labels(raw: bytes | None) -> dict[str, str]:
    """``a="1",b="x\\"y"`` -> ``{"a": "1", "b": 'x"y'}`` (escapes undone)."""
    if not raw:
        return {}
    out: dict[str, str] = {}
    for m in _LABEL.finditer(raw):
        v = m.group(2)
        if b"\\" in v:
            v = v.replace(b"\\n", b"\n").replace(b'\\"', b'"').replace(b"\\\\", b"\\")
        out[m.group(1).decode("ascii")] = v.decode("utf-8", "replace")
    return out


def _value(raw: bytes) -> float | None:
    try:
        v = float(raw)
    except ValueError:
        return None
    return v if math.isfinite(v) else None


# -------------------------------------------------------------------- vLLM

# slot indices of VllmSample's accumulated values
_RUNNING, _WAITING, _KV_NEW, _KV_OLD, _PQ_NEW, _PH_NEW, _PQ_OLD, _PH_OLD = range(8)
(_PREEMPT, _PROMPT, _PROMPT_LOCAL, _TTFT_SUM, _TTFT_COUNT, _QUEUE_SUM, _QUEUE_COUNT,
 _PREFILL_SUM, _PREFILL_COUNT, _KVC_SUM, _KVC_COUNT, _GEN) = range(8, 20)
_NSLOTS = 20
_CACHE_CONFIG = -1
_PROMPT_BY_SOURCE = -2

_VLLM_NAMES: dict[bytes, int] = {
    b"num_requests_running": _RUNNING,
    b"num_requests_waiting": _WAITING,
    b"kv_cache_usage_perc": _KV_NEW,
    b"gpu_cache_usage_perc": _KV_OLD,
    b"prefix_cache_queries_total": _PQ_NEW,
    b"prefix_cache_queries": _PQ_NEW,
    b"prefix_cache_hits_total": _PH_NEW,
    b"prefix_cache_hits": _PH_NEW,
    b"gpu_prefix_cache_queries_total": _PQ_OLD,
    b"gpu_prefix_cache_queries": _PQ_OLD,
    b"gpu_prefix_cache_hits_total": _PH_OLD,
    b"gpu_prefix_cache_hits": _PH_OLD,
    b"num_preemptions_total": _PREEMPT,
    b"num_preemptions": _PREEMPT,
    b"prompt_tokens_total": _PROMPT,
    b"prompt_tokens": _PROMPT,
    b"prompt_tokens_by_source_total": _PROMPT_BY_SOURCE,
    b"prompt_tokens_by_source": _PROMPT_BY_SOURCE,
    b"generation_tokens_total": _GEN,
    b"generation_tokens": _GEN,
    b"time_to_first_token_seconds_sum": _TTFT_SUM,
    b"time_to_first_token_seconds_count": _TTFT_COUNT,
    b"request_queue_time_seconds_sum": _QUEUE_SUM,
    b"request_queue_time_seconds_count": _QUEUE_COUNT,
    b"request_prefill_time_seconds_sum": _PREFILL_SUM,
    b"request_prefill_time_seconds_count": _PREFILL_COUNT,
    b"request_prefill_kv_computed_tokens_sum": _KVC_SUM,
    b"request_prefill_kv_computed_tokens_count": _KVC_COUNT,
    b"cache_config_info": _CACHE_CONFIG,
}



def _trie(words: list[bytes]) -> bytes:
    """An alternation of ``words`` as a prefix tree (``a(?:b|c)``), which the
    regex engine rejects a non-matching line with in a few steps."""
    root: dict[int, dict] = {}  # type: ignore[type-arg]
    for w in words:
        node = root
        for ch in w:
            node = node.setdefault(ch, {})
        node[-1] = {}

    def build(node: dict) -> bytes:  # type: ignore[type-arg]
        alts = [re.escape(bytes([ch])) + build(node[ch]) for ch in sorted(k for k in node if k >= 0)]
        if not alts:
            return b""
        group = b"(?:" + b"|".join(alts) + b")"
        return group + b"?" if -1 in node else group

    return build(root)


# The lookahead requires the name to end there (``{`` or blank), which
# rejects ``_bucket``, ``_created`` and ``num_requests_waiting_by_reason``.
_SERIES_TAIL = (
    rb")(?=[{ \t])[ \t]*+(?:\{("
    rb'[^"}\n]*+(?:"[^"\\\n]*+(?:\\.[^"\\\n]*+)*+"[^"}\n]*+)*+'
    rb")\})?+[ \t]*+([^ \t\r\n]{1,64})"
)
_VLLM_LINE = re.compile(
    rb"\nvllm:("
    + _trie(list(_VLLM_NAMES))
    + _SERIES_TAIL
)


@dataclass(slots=True)
class VllmSample:
    """What one vLLM page said, summed over ``engine`` series. None = absent."""

    running: float | None = None
    waiting: float | None = None
    #: average over engines; new name preferred
    kv_cache_usage: float | None = None
    block_size: int | None = None
    #: sum over engines of num_gpu_blocks * block_size (or kv_cache_size_tokens)
    kv_capacity_tokens: int | None = None
    prefix_queries: float | None = None
    prefix_hits: float | None = None
    preemptions: float | None = None
    prompt_tokens: float | None = None
    #: prompt_tokens_by_source{source="local_compute"}
    prompt_local_compute: float | None = None
    generation_tokens: float | None = None
    ttft_sum: float | None = None
    ttft_count: float | None = None
    queue_sum: float | None = None
    queue_count: float | None = None
    prefill_sum: float | None = None
    prefill_count: float | None = None
    kv_computed_sum: float | None = None
    kv_computed_count: float | None = None
    #: how many series were read (for tests and sanity)
    series: int = 0

    @property
    def looks_like_vllm(self) -> bool:
        """A page that is a vLLM page at all: its core gauges are there."""
        return self.running is not None and self.waiting is not None


def parse_vllm(body: bytes) -> VllmSample:
    """Parse a vLLM ``/metrics`` body; never raises."""
    hits = _VLLM_LINE.findall(b"\n" + body)
    return _fold([_role(name, labels) for name, labels, _ in hits], [raw for _, _, raw in hits])


#: what a series counts for: its slot, and for ``cache_config_info`` the
#: (block size, KV tokens) its labels say, for ``prompt_tokens_by_source``
#: whether it is the local compute
_Role = tuple[int, "tuple[int | None, int | None] | bool | None"]


def _role(name: bytes, labels: bytes | None) -> _Role:
    slot = _VLLM_NAMES[name]
    if slot == _CACHE_CONFIG:
        return slot, _labels_say(b"c", labels, _cache_config)
    if slot == _PROMPT_BY_SOURCE:
        return slot, _labels_say(b"s", labels, _local_compute)
    return slot, None


def _fold(roles: list[_Role], raws: list[bytes]) -> VllmSample:
    """The sample of a page's matched series (their roles and values, in page order)."""
    sums = [0.0] * _NSLOTS
    counts = [0] * _NSLOTS
    block_size: int | None = None
    capacity = 0
    have_capacity = False
    local = 0.0
    have_local = False
    n = 0
    for (slot, extra), raw in zip(roles, raws):
        v = _value(raw)
        if v is None:
            continue
        n += 1
        if slot >= 0:
            sums[slot] += v
            counts[slot] += 1
        elif slot == _CACHE_CONFIG:
            bs, tokens = extra  # type: ignore[misc]
            if bs is not None:
                block_size = bs
            if tokens is not None:
                capacity += tokens
                have_capacity = True
        elif extra:  # prompt tokens by source: the local compute
            local += v
            have_local = True

    def total(slot: int) -> float | None:
        return sums[slot] if counts[slot] else None

    def mean(slot: int) -> float | None:
        return sums[slot] / counts[slot] if counts[slot] else None

    kv = mean(_KV_NEW)
    if kv is None:
        kv = mean(_KV_OLD)
    pq, ph = total(_PQ_NEW), total(_PH_NEW)
    if pq is None:
        pq, ph = total(_PQ_OLD), total(_PH_OLD)
    return VllmSample(
        running=total(_RUNNING),
        waiting=total(_WAITING),
        kv_cache_usage=kv,
        block_size=block_size,
        kv_capacity_tokens=capacity if have_capacity else None,
        prefix_queries=pq,
        prefix_hits=ph,
        preemptions=total(_PREEMPT),
        prompt_tokens=total(_PROMPT),
        prompt_local_compute=local if have_local else None,
        generation_tokens=total(_GEN),
        ttft_sum=total(_TTFT_SUM),
        ttft_count=total(_TTFT_COUNT),
        queue_sum=total(_QUEUE_SUM),
        queue_count=total(_QUEUE_COUNT),
        prefill_sum=total(_PREFILL_SUM),
        prefill_count=total(_PREFILL_COUNT),
        kv_computed_sum=total(_KVC_SUM),
        kv_computed_count=total(_KVC_COUNT),
        series=n,
    )


#: a series' value as the line pattern reads it (the end of ``_SERIES_TAIL``),
#: but not one that begins with ``{``: after a line's old bytes that ended in
#: blanks, the pattern might read a brace there as a label set
_VALUE = re.compile(rb"[^ \t\r\n{][^ \t\r\n]{0,63}")
#: what a well-formed line's bytes before its value end in: a blank or the label set's brace
_VALUE_AFTER = frozenset(b" \t}")


class VllmReader:
    """:func:`parse_vllm` for one endpoint's pages, which keep their shape.

    A vLLM page holds the same series, in the same order, at every scrape;
    only the values move. So after a full parse the reader keeps where each
    series it read began (the bytes of its line up to the value) and what the
    series counts for, and reads the next pages by checking those bytes where
    they should be (a value that grew a digit moves what follows by a byte;
    the place is then looked for nearby) and taking the value after them: a
    step per series read instead of the pattern's walk over every line. Same
    result as :func:`parse_vllm` (the same series, summed in the same order).
    A page where a series is not where it was (a restart, another model, an
    edited page) is parsed in full at once, and so is the next, until two
    full parses in a row find the same series: a shape is followed only once
    it is seen to hold. A series a page gains while its shape is followed is
    read from the next full parse: one page in every ``full_every`` is
    parsed in full (the collector makes that about once a second).
    """

    __slots__ = ("full_every", "_prefixes", "_places", "_roles", "_since_full")

    #: a page of more series than this, or whose series' lines up to their
    #: values take more bytes, is always parsed in full (real ones: ~20 series,
    #: ~2 KB), so a hostile page cannot make the reader keep much of it
    MAX_SERIES = 1024
    MAX_SHAPE_BYTES = 64 << 10
    #: how far from where it was a series is looked for before a full parse
    SLACK = 512

    def __init__(self, full_every: int = 10) -> None:
        #: one page in this many is parsed in full (1: every page)
        self.full_every = max(1, full_every)
        #: per series of the last full parse: its line up to the value, where it
        #: began (in the last page read), what it counts for
        self._prefixes: list[bytes] | None = None
        self._places: list[int] = []
        self._roles: list[_Role] = []
        self._since_full = 0

    def parse(self, body: bytes) -> VllmSample:
        """Parse a vLLM ``/metrics`` body; never raises."""
        if self.full_every == 1:  # every page in full: no shape to keep (it costs a quarter more)
            return parse_vllm(body)
        page = b"\n" + body
        if self._prefixes is not None and self._since_full + 1 < self.full_every:
            raws = self._follow(page)
            if raws is not None:
                self._since_full += 1
                return _fold(self._roles, raws)
        return self._full(page)

    def _full(self, page: bytes) -> VllmSample:
        prefixes, places, roles, raws = [], [], [], []
        for m in _VLLM_LINE.finditer(page):
            name, labels, raw = m.groups()
            start = m.start()
            prefixes.append(page[start:m.start(3)])
            places.append(start)
            roles.append(_role(name, labels))
            raws.append(raw)
        sample = _fold(roles, raws)
        held = prefixes == self._prefixes
        # a page that is no vLLM page (yet) gives no shape: the next is read in full;
        # nor does one where a line's bytes before its value end in the name (a label
        # set that did not close, read as the value): the pattern only matches a
        # name followed by a brace or a blank, which those bytes no longer check
        keep = (sample.looks_like_vllm and len(prefixes) <= self.MAX_SERIES
                and sum(map(len, prefixes)) <= self.MAX_SHAPE_BYTES
                and all(p[-1] in _VALUE_AFTER for p in prefixes))
        self._prefixes = prefixes if keep else None
        self._places, self._roles = (places, roles) if keep else ([], [])
        # a shape not seen twice in a row is not followed yet: the next page is parsed in full too
        self._since_full = 0 if held else self.full_every
        return sample

    def _follow(self, page: bytes) -> list[bytes] | None:
        """The values of the last full parse's series, found in ``page``; None
        when one is not there (the page is then parsed in full)."""
        raws = []
        prefixes, places = self._prefixes or [], self._places
        pos = 0  # nothing before the end of the last value is looked at again
        drift = 0
        find, starts, value = page.find, page.startswith, _VALUE.match
        slack = self.SLACK
        for k, prefix in enumerate(prefixes):
            at = places[k] + drift
            if at < pos or not starts(prefix, at):
                at = find(prefix, max(pos, at - slack), at + slack + len(prefix))
                if at < 0:
                    return None
                drift = at - places[k]
            places[k] = at
            m = value(page, at + len(prefix))
            if m is None:
                return None
            raws.append(m.group())
            pos = m.end()
        return raws


#: what the label sets of ``cache_config_info`` and ``prompt_tokens_by_source``
#: say, by their raw bytes: a pod's label sets are the same at every scrape,
#: and reading them was a quarter of a page's parse. Bounded (emptied when
#: full), so a page of ever-new labels cannot grow it.
_LABEL_MEMO: dict[bytes, tuple[int | None, int | None] | bool] = {}
_LABEL_MEMO_MAX = 4096
#: label sets longer than this are read afresh each time (real ones are a few
#: hundred bytes; a page's are bounded only by the body's cap)
_LABEL_MEMO_KEY_MAX = 1024
_T = TypeVar("_T")


def _labels_say(tag: bytes, raw: bytes | None, read: Callable[[dict[str, str]], _T]) -> _T:
    """``read`` of the label set ``raw``, memoised under ``tag`` (one per reader)."""
    key = tag + (raw or b"")
    hit = _LABEL_MEMO.get(key)
    if hit is not None:
        return hit  # type: ignore[return-value]
    value = read(parse_labels(raw))
    if len(key) <= _LABEL_MEMO_KEY_MAX:
        if len(_LABEL_MEMO) >= _LABEL_MEMO_MAX:
            _LABEL_MEMO.clear()
        _LABEL_MEMO[key] = value  # type: ignore[assignment]
    return value


def _cache_config(labels: dict[str, str]) -> tuple[int | None, int | None]:
    """``cache_config_info``'s (block size, KV capacity in tokens): blocks x
    block size, else ``kv_cache_size_tokens``."""
    bs = _int(labels.get("block_size"))
    blocks = _int(labels.get("num_gpu_blocks"))
    return bs, bs * blocks if bs is not None and blocks is not None else _int(labels.get("kv_cache_size_tokens"))


def _local_compute(labels: dict[str, str]) -> bool:
    """A ``prompt_tokens_by_source`` series of ``source="local_compute"``."""
    return labels.get("source") == "local_compute"


def _int(s: str | None) -> int | None:
    if s is None:
        return None
    try:
        v = int(float(s))
    except (ValueError, OverflowError):
        return None
    return v if 0 < v < 1 << 40 else None


# -------------------------------------------------------------------- DCGM

_DCGM_FIELDS = (b"GPU_UTIL", b"FB_USED", b"FB_FREE", b"FB_RESERVED", b"XID_ERRORS")
_DCGM_LINE = re.compile(
    rb"\nDCGM_FI_DEV_(" + b"|".join(_DCGM_FIELDS) + _SERIES_TAIL
)
_NAMESPACE_LABELS = ("namespace", "pod_namespace", "exported_namespace")
_POD_LABELS = ("pod", "pod_name", "exported_pod")
#: the most GPUs one page may describe (a hostile page cannot grow memory)
MAX_GPUS = 4096


def is_dcgm_blank(v: float) -> bool:
    """DCGM's "blank" sentinels (no value): int64 and int32 blanks, fp64 blank."""
    return v >= 9.0e18 or 2147483632.0 <= v <= 2147483647.0 or 1.4e14 <= v <= 1.41e14


@dataclass(slots=True)
class GpuSample:
    """One GPU of a DCGM page. Memory in MiB; None = absent or blank."""

    key: str
    namespace: str = ""
    pod: str = ""
    hostname: str = ""
    util_percent: float | None = None
    fb_used: float | None = None
    fb_free: float | None = None
    fb_reserved: float | None = None
    xid: int | None = None

    @property
    def memory_usage(self) -> float | None:
        if self.fb_used is None or self.fb_free is None:
            return None
        total = self.fb_used + self.fb_free + (self.fb_reserved or 0.0)
        return min(1.0, max(0.0, self.fb_used / total)) if total > 0 else None


def _label_ci(labels: dict[str, str], names: tuple[str, ...]) -> str:
    for n in names:
        v = labels.get(n)
        if v:
            return v
    return ""


def parse_dcgm(body: bytes) -> list[GpuSample]:
    """Parse a DCGM exporter page into one sample per GPU; never raises.

    Label spellings vary by release (TELEMETRY.md): ``Hostname``/``hostname``
    (matched without case), ``UUID``/``uuid``, ``pod``/``pod_name``/
    ``exported_pod``, ``namespace``/``pod_namespace``. A GPU is keyed by host
    and UUID (or index, or MIG instance).
    """
    gpus: dict[str, GpuSample] = {}
    for m in _DCGM_LINE.finditer(b"\n" + body):
        v = _value(m.group(3))
        if v is None or is_dcgm_blank(v):
            continue
        raw = parse_labels(m.group(2))
        labels = {k.lower(): val for k, val in raw.items()}
        host = labels.get("hostname", "")
        ident = labels.get("uuid") or labels.get("gpu") or labels.get("device") or ""
        mig = labels.get("gpu_i_id", "")
        key = f"{host}/{ident}/{mig}"
        g = gpus.get(key)
        if g is None:
            if len(gpus) >= MAX_GPUS:
                continue
            g = gpus[key] = GpuSample(key=key, hostname=host)
        ns = _label_ci(labels, _NAMESPACE_LABELS)
        pod = _label_ci(labels, _POD_LABELS)
        if pod:
            g.pod, g.namespace = pod, ns
        field = m.group(1)
        if field == b"GPU_UTIL":
            g.util_percent = v
        elif field == b"FB_USED":
            g.fb_used = v
        elif field == b"FB_FREE":
            g.fb_free = v
        elif field == b"FB_RESERVED":
            g.fb_reserved = v
        else:
            g.xid = int(v) if 0 <= v < 1 << 31 else None
    return list(gpus.values())
