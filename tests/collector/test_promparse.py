"""The specialised parsers on the real exposition formats (TELEMETRY.md) and on fuzz."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from kinference_collector import pages
from kinference_collector.promparse import (
    VllmSample,
    is_dcgm_blank,
    parse_dcgm,
    parse_labels,
    parse_vllm,
)

# The example lines of TELEMETRY.md, verbatim.
TELEMETRY_EXAMPLE = b"""\
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="zai-org/GLM-4.5"} 9.75010481363281e-06
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="zai-org/GLM-4.5"} 32.0
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{le="0.02",model_name="meta-llama/Llama-3.1-8B-Instruct"} 13.0
vllm:time_to_first_token_seconds_count{model_name="meta-llama/Llama-3.1-8B-Instruct"} 140.0
"""


def test_telemetry_md_example() -> None:
    s = parse_vllm(TELEMETRY_EXAMPLE)
    assert s.kv_cache_usage == pytest.approx(9.75010481363281e-06)
    assert s.prefix_queries == 32.0
    assert s.ttft_count == 140.0
    assert s.ttft_sum is None  # bucket lines are not sums
    assert s.running is None and not s.looks_like_vllm


def test_realistic_page_matches_prometheus_client() -> None:
    p = pages.VllmPage(engines=2, running=7, waiting=3, kv_usage=0.25, block_size=16, num_gpu_blocks=1000)
    p.advance(40, prompt=2000, hit=0.25, ttft=0.3, queue=0.1, prefill=0.15)
    p.preemptions = 6
    text = pages.render_vllm(p)
    s = parse_vllm(text.encode())
    # the reference parser's view of the same page
    ref: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        for smp in fam.samples:
            if smp.name.endswith("_created"):
                continue
            if smp.name == "vllm:kv_cache_usage_perc":
                ref[smp.name] = ref.get(smp.name, 0.0) + smp.value / 2
            else:
                ref[smp.name] = ref.get(smp.name, 0.0) + smp.value
    assert s.running == ref["vllm:num_requests_running"] == 7
    assert s.waiting == ref["vllm:num_requests_waiting"] == 3
    assert s.kv_cache_usage == pytest.approx(ref["vllm:kv_cache_usage_perc"]) == pytest.approx(0.25)
    assert s.prefix_queries == pytest.approx(ref["vllm:prefix_cache_queries_total"])
    assert s.prefix_hits == pytest.approx(ref["vllm:prefix_cache_hits_total"])
    assert s.preemptions == pytest.approx(ref["vllm:num_preemptions_total"]) == pytest.approx(6)
    assert s.ttft_sum == pytest.approx(ref["vllm:time_to_first_token_seconds_sum"]) == pytest.approx(12.0)
    assert s.ttft_count == pytest.approx(ref["vllm:time_to_first_token_seconds_count"]) == pytest.approx(40)
    assert s.prefill_sum == pytest.approx(ref["vllm:request_prefill_time_seconds_sum"])
    assert s.queue_sum == pytest.approx(ref["vllm:request_queue_time_seconds_sum"])
    assert s.kv_computed_sum == pytest.approx(ref["vllm:request_prefill_kv_computed_tokens_sum"])
    assert s.prompt_local_compute == pytest.approx(40 * 2000 * 0.75)
    # two engines, each 1000 blocks of 16 tokens
    assert s.block_size == 16 and s.kv_capacity_tokens == 32000
    assert s.looks_like_vllm


def test_old_names_are_read() -> None:
    p = pages.VllmPage(old_names=True, running=1, waiting=2, kv_usage=0.5)
    p.advance(10)
    s = parse_vllm(pages.render_vllm(p).encode())
    assert s.kv_cache_usage == 0.5
    assert s.prefix_queries == pytest.approx(10_000) and s.prefix_hits == pytest.approx(5000)


def test_new_name_wins_when_both_present() -> None:
    body = (b'vllm:gpu_cache_usage_perc{engine="0"} 0.9\n'
            b'vllm:kv_cache_usage_perc{engine="0"} 0.3\n'
            b'vllm:gpu_prefix_cache_queries_total{engine="0"} 99\n'
            b'vllm:prefix_cache_queries_total{engine="0"} 10\n'
            b'vllm:prefix_cache_hits_total{engine="0"} 4\n')
    s = parse_vllm(body)
    assert s.kv_cache_usage == 0.3
    assert (s.prefix_queries, s.prefix_hits) == (10.0, 4.0)


def test_engines_sum_counts_and_average_kv() -> None:
    body = b"\n".join([
        b'vllm:num_requests_running{engine="0",model_name="m"} 3',
        b'vllm:num_requests_running{engine="1",model_name="m"} 4',
        b'vllm:num_requests_waiting{engine="0",model_name="m"} 1',
        b'vllm:num_requests_waiting{engine="1",model_name="m"} 0',
        b'vllm:num_requests_waiting_by_reason{engine="0",model_name="m",reason="capacity"} 50',
        b'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.2',
        b'vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.6',
        b'vllm:num_preemptions_total{engine="0",model_name="m"} 2',
        b'vllm:num_preemptions_created{engine="0",model_name="m"} 1.7e9',
        b'vllm:num_preemptions_total{engine="1",model_name="m"} 5',
    ])
    s = parse_vllm(body)
    assert (s.running, s.waiting) == (7.0, 1.0)
    assert s.kv_cache_usage == pytest.approx(0.4)
    assert s.preemptions == 7.0  # _created skipped


def test_counters_without_total_suffix_and_timestamps() -> None:
    body = (b"vllm:num_requests_running 1 1700000000000\n"
            b"vllm:num_requests_waiting   2\r\n"
            b'vllm:prompt_tokens{engine="0"} 123\n')
    s = parse_vllm(body)
    assert (s.running, s.waiting, s.prompt_tokens) == (1.0, 2.0, 123.0)


def test_cache_config_labels_and_kv_cache_size_tokens() -> None:
    body = (b'vllm:cache_config_info{block_size="32",engine="0",num_gpu_blocks="100"} 1.0\n'
            b'vllm:cache_config_info{block_size="32",engine="1",kv_cache_size_tokens="5000",num_gpu_blocks="None"} 1.0\n')
    s = parse_vllm(body)
    assert s.block_size == 32
    assert s.kv_capacity_tokens == 3200 + 5000


def test_label_values_with_escapes_and_braces() -> None:
    assert parse_labels(rb'a="x\"}y",b="1\\2",c="line\nnext"') == {"a": 'x"}y', "b": "1\\2", "c": "line\nnext"}
    body = b'vllm:num_requests_running{model_name="we}ird\\"name",engine="0"} 5\nvllm:num_requests_waiting 1\n'
    assert parse_vllm(body).running == 5.0


def _escaped(v: str) -> str:
    return v.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.from_regex(r"[a-z_][a-z0-9_]{0,8}", fullmatch=True).filter(lambda k: k != "block_size"),
                       st.text(alphabet=st.sampled_from('ab}{"\\\n =,x'), max_size=12), max_size=5),
       st.integers(1, 10**6), st.integers(1, 512))
def test_any_quoted_label_values_read_as_prometheus_client_reads_them(
        labels: dict[str, str], value: int, block: int) -> None:
    """Label values holding quotes, backslashes, braces and newlines (escaped
    as the text format says) neither end a label set early nor hide a series."""
    rendered = ",".join(f'{k}="{_escaped(v)}"' for k, v in labels.items())
    info = ",".join(filter(None, [rendered, f'block_size="{block}"', 'num_gpu_blocks="10"']))
    text = (f"vllm:num_requests_running{{{rendered}}} {value}\n"
            f"vllm:cache_config_info{{{info}}} 1.0\n"
            f"vllm:num_requests_waiting{{{rendered}}} 2\n")
    [ref] = [s for f in text_string_to_metric_families(text) for s in f.samples
             if s.name == "vllm:cache_config_info"]
    assert ref.labels == {**labels, "block_size": str(block), "num_gpu_blocks": "10"}
    assert parse_labels(info.encode()) == ref.labels
    s = parse_vllm(text.encode())
    assert (s.running, s.waiting, s.series) == (value, 2.0, 3)
    assert (s.block_size, s.kv_capacity_tokens) == (block, block * 10)


@pytest.mark.parametrize("bad", [
    b"", b"\x00\xff\xfe", b"vllm:num_requests_running NaN\n", b"vllm:num_requests_running +Inf\n",
    b"vllm:num_requests_running{engine=\"0\" 5\n", b"vllm:num_requests_running {} abc\n",
    b"<html>502 Bad Gateway</html>", b"vllm:num_requests_running" + b"9" * 100000,
])
def test_malformed_pages_yield_nothing(bad: bytes) -> None:
    s = parse_vllm(bad)
    assert s.running is None and s.series == 0


def test_first_line_without_comments() -> None:
    assert parse_vllm(b"vllm:num_requests_running 4").running == 4.0


# --------------------------------------------------------------------- DCGM


def test_dcgm_default_labels_and_pod_mapping() -> None:
    gpus = [
        pages.Gpu(0, "GPU-a", "ns1", "llama-0", util_percent=50, fb_used=40000, fb_free=40000, fb_reserved=500),
        pages.Gpu(1, "GPU-b", "ns1", "llama-0", util_percent=90, fb_used=10000, fb_free=70000, fb_reserved=500, xid=79),
        pages.Gpu(2, "GPU-c"),  # not assigned to a pod
    ]
    out = {g.key: g for g in parse_dcgm(pages.render_dcgm(gpus).encode())}
    assert len(out) == 3
    a = out["node-a/GPU-a/"]
    assert (a.namespace, a.pod, a.util_percent, a.xid) == ("ns1", "llama-0", 50.0, 0)
    assert a.memory_usage == pytest.approx(40000 / 80500)
    assert out["node-a/GPU-b/"].xid == 79
    assert out["node-a/GPU-c/"].pod == ""


@pytest.mark.parametrize("host,pod,ns", [
    ("Hostname", "pod", "namespace"),
    ("hostname", "pod_name", "pod_namespace"),
    ("hostname", "exported_pod", "exported_namespace"),
])
def test_dcgm_label_variants(host: str, pod: str, ns: str) -> None:
    page = pages.render_dcgm([pages.Gpu(0, "GPU-x", "team", "p-1", util_percent=12)], host, pod, ns)
    (g,) = parse_dcgm(page.encode())
    assert (g.hostname, g.namespace, g.pod, g.util_percent) == ("node-a", "team", "p-1", 12.0)


def test_dcgm_blank_sentinels_are_missing() -> None:
    page = pages.render_dcgm([pages.Gpu(0, "GPU-x", "n", "p", util_percent=9.223372036854775794e18,
                                        fb_used=2147483647.0)])
    (g,) = parse_dcgm(page.encode())
    assert g.util_percent is None and g.fb_used is None and g.memory_usage is None
    assert is_dcgm_blank(9.223372036854775e18) and is_dcgm_blank(140737488355328.0)
    assert not is_dcgm_blank(100.0)


def test_dcgm_old_uuid_label_keys_gpus() -> None:
    body = (b'DCGM_FI_DEV_GPU_UTIL{gpu="0",uuid="GPU-1",pod_name="p",pod_namespace="n"} 10\n'
            b'DCGM_FI_DEV_GPU_UTIL{gpu="1",uuid="GPU-2",pod_name="p",pod_namespace="n"} 20\n')
    assert sorted(g.util_percent or 0 for g in parse_dcgm(body)) == [10.0, 20.0]


# ---------------------------------------------------------------------- fuzz

_lines = st.one_of(
    st.binary(max_size=200),
    st.builds(
        lambda name, labels, value: b"%s%s %s" % (name, labels, value),
        st.sampled_from([b"vllm:num_requests_running", b"vllm:kv_cache_usage_perc",
                         b"vllm:cache_config_info", b"vllm:prompt_tokens_by_source_total",
                         b"DCGM_FI_DEV_GPU_UTIL", b"DCGM_FI_DEV_XID_ERRORS", b"vllm:foo"]),
        st.one_of(st.just(b""), st.binary(max_size=60).map(lambda b: b"{" + b + b"}"),
                  st.text(max_size=30).map(lambda t: ('{block_size="%s",pod="%s"}' % (t, t)).encode())),
        st.one_of(st.floats().map(lambda f: repr(f).encode()), st.binary(max_size=20),
                  st.integers().map(lambda i: str(i).encode())),
    ),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(_lines, max_size=40))
def test_fuzz_never_raises_and_is_bounded(lines: list[bytes]) -> None:
    body = b"\n".join(lines)
    s = parse_vllm(body)
    assert isinstance(s, VllmSample)
    assert s.series <= body.count(b"\n") + 1
    for v in (s.running, s.waiting, s.kv_cache_usage, s.prefix_queries):
        assert v is None or math.isfinite(v)
    if s.kv_capacity_tokens is not None:
        assert 0 < s.kv_capacity_tokens < (1 << 40) * (body.count(b"\n") + 1) ** 2
    gpus = parse_dcgm(body)
    assert len(gpus) <= body.count(b"\n") + 1
    for g in gpus:
        assert g.util_percent is None or math.isfinite(g.util_percent)
        m = g.memory_usage
        assert m is None or 0.0 <= m <= 1.0


@settings(max_examples=100, deadline=None)
@given(st.binary(max_size=5000))
def test_fuzz_arbitrary_bytes(body: bytes) -> None:
    parse_vllm(body)
    parse_dcgm(body)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 64), st.one_of(st.integers(1, 10**6), st.just("None")),
                          st.integers(1, 10**6), st.sampled_from(["local_compute", "local_cache_hit", "x"])),
                min_size=1, max_size=4))
def test_label_memo_answers_what_a_fresh_read_does(series: list[tuple[int, object, int, str]]) -> None:
    """The memo of label sets (a pod's are the same at every scrape) gives what
    reading them afresh gives, the first time, the second, and after it was emptied."""
    from kinference_collector import promparse

    body = b"".join(
        b'vllm:cache_config_info{block_size="%d",engine="%d",kv_cache_size_tokens="%d",num_gpu_blocks="%s"} 1.0\n'
        b'vllm:prompt_tokens_by_source_total{engine="%d",source="%s"} 7.0\n'
        % (bs, i, tokens, str(blocks).encode(), i, source.encode())
        for i, (bs, blocks, tokens, source) in enumerate(series))
    want_capacity = sum(bs * blocks if isinstance(blocks, int) else tokens for bs, blocks, tokens, _ in series)
    want_local = 7.0 * sum(1 for *_, source in series if source == "local_compute")
    promparse._LABEL_MEMO.clear()
    for _ in range(2):
        s = parse_vllm(body)
        assert s.block_size == series[-1][0]
        assert s.kv_capacity_tokens == want_capacity
        assert s.prompt_local_compute == (want_local if want_local else None)


def test_label_memo_is_bounded() -> None:
    from kinference_collector import promparse

    for i in range(promparse._LABEL_MEMO_MAX + 10):
        parse_vllm(b'vllm:cache_config_info{block_size="16",num_gpu_blocks="%d"} 1.0\n' % (i + 1))
    assert 0 < len(promparse._LABEL_MEMO) <= promparse._LABEL_MEMO_MAX
    # a long label set (a page's are bounded only by the body's cap) is read, not kept
    promparse._LABEL_MEMO.clear()
    long = b'vllm:cache_config_info{block_size="16",num_gpu_blocks="7",x="%s"} 1.0\n' % (b"a" * 5000)
    assert parse_vllm(long).kv_capacity_tokens == 112
    assert not promparse._LABEL_MEMO
