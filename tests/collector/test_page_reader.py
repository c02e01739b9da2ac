"""VllmReader: an endpoint's pages read from the shape of its last full parse,
with the result :func:`parse_vllm` gives."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from kinference_collector import pages
from kinference_collector.promparse import _VLLM_LINE, VllmReader, VllmSample, _fold, _role, parse_vllm
from kinference_simulators.fleet import PodLoad, vllm_template

_TEMPLATE = vllm_template("meta-llama/Llama-3.1-8B-Instruct", 8192)


def _fleet(rate: float) -> bytes:
    return _TEMPLATE.fill(PodLoad(rate=rate).values())


def _page(engines: int, running: int, waiting: int, kv: float, advance: int) -> bytes:
    p = pages.VllmPage(engines=engines, running=running, waiting=waiting, kv_usage=kv)
    p.advance(advance)
    return pages.render_vllm(p).encode()


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(0.0, 400.0), min_size=2, max_size=25))
def test_page_after_page_the_reader_reads_what_a_full_parse_reads(rates: list[float]) -> None:
    """The fleet's pages with loads moving at every scrape: values that grow
    digits move every later series, and each is still found and read."""
    r = VllmReader(full_every=1000)
    for rate in rates:
        body = _fleet(rate)
        assert r.parse(body) == parse_vllm(body)
    # the first two in full (the shape is followed once two full parses agree), the rest followed
    assert r._since_full == max(0, len(rates) - 2)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 300), st.integers(0, 300), st.floats(0.0, 1.0), st.integers(0, 10**7)),
                min_size=2, max_size=12))
def test_two_engines_pages_with_counters_of_any_size(loads: list[tuple[int, int, float, int]]) -> None:
    r = VllmReader(full_every=1000)
    for running, waiting, kv, advance in loads:
        body = _page(2, running, waiting, kv, advance)
        assert r.parse(body) == parse_vllm(body)
    assert r._since_full == max(0, len(loads) - 2)  # all but the first two read from the shape


def _edited(body: bytes, old: bytes, new: bytes) -> bytes:
    assert old in body, old
    return body.replace(old, new, 1)


def test_a_page_of_another_shape_is_parsed_in_full_at_once() -> None:
    base = _fleet(3.0)
    model = b'model_name="meta-llama/Llama-3.1-8B-Instruct"'
    running = next(line for line in base.split(b"\n") if line.startswith(b"vllm:num_requests_running"))
    name, _, value = running.rpartition(b" ")
    for edit in (
        base.replace(model, b'model_name="other"'),  # another model at the same address
        _edited(base, running + b"\n", b""),  # a series gone
        _edited(base, running, name + b" " + value + b" 1700000000000"),  # a timestamp after the value
        _edited(base, running, name + b"   " + value),  # more blanks before the value
        _edited(base, running, name + b" {x=\"1\"} 7"),  # a brace where the value was
        _edited(base, running, name + b" NaN"),  # a value that is no number
        b"",
    ):
        r = VllmReader()
        r.parse(base)
        r.parse(base)
        assert r._since_full == 0  # the shape holds: the next page is followed
        assert r.parse(edit) == parse_vllm(edit)
        assert r.parse(base) == parse_vllm(base)  # the series back: not read from the edit's shape


def test_a_gained_series_is_read_at_the_next_full_parse() -> None:
    """What the reader does not see at once: a series that appears between two
    full parses, counted from the next (at most ``full_every`` pages on)."""
    base = _fleet(3.0)
    running = next(line for line in base.split(b"\n") if line.startswith(b"vllm:num_requests_running"))
    extra = running.replace(b'engine="0"', b'engine="1"').rpartition(b" ")[0] + b" 5"
    gained = _edited(base, running, running + b"\n" + extra)
    full = parse_vllm(gained)
    r = VllmReader(full_every=4)
    r.parse(base)
    r.parse(base)
    seen = [r.parse(gained).running for _ in range(5)]
    assert seen[:3] == [parse_vllm(base).running] * 3  # three pages from the shape, the fourth in full
    assert seen[3:] == [full.running] * 2 and full.running == parse_vllm(base).running + 5


# a page of what the fleet's pages lack: lines without labels, a duplicated
# series, a value over 64 characters, a timestamp, CRLF line ends
_ODD = (b"# HELP vllm:num_requests_running x\r\n"
        b"vllm:num_requests_running 3\r\n"
        b'vllm:num_requests_waiting{engine="0"} 2 1700000000000\n'
        b'vllm:num_requests_waiting{engine="0"} 1\n'
        b'vllm:kv_cache_usage_perc{engine="0"}\t0.25\n'
        b"vllm:prompt_tokens_total " + b"1" * 70 + b"\n"
        b'vllm:cache_config_info{block_size="16",num_gpu_blocks="100"} 1\n'
        b'vllm:prompt_tokens_by_source_total{source="local_compute"} 9\n')


def _held_subsequence(reader: VllmReader, page: bytes) -> VllmSample:
    """What following the reader's shape may give for ``page``: the full
    parse's matches whose line up to the value is the shape's next, in order."""
    body = b"\n" + page
    shape = reader._prefixes or []
    roles, raws, k = [], [], 0
    for m in _VLLM_LINE.finditer(body):
        if k < len(shape) and body[m.start():m.start(3)] == shape[k]:
            roles.append(_role(m.group(1), m.group(2)))
            raws.append(m.group(3))
            k += 1
    return _fold(roles, raws) if k == len(shape) else parse_vllm(page)


@settings(max_examples=400, deadline=None)
@given(st.sampled_from(["fleet", "odd"]), st.integers(0, 40_000), st.integers(0, 40),
       st.one_of(st.binary(max_size=40),
                 st.lists(st.sampled_from([b"{", b"}", b'"', b" ", b"\t", b"\r", b"\n", b"7", b"1e3",
                                           b"vllm:num_requests_running", b'{engine="1"}', b"NaN"]),
                          max_size=6).map(b"".join)))
def test_any_edit_reads_as_a_full_parse_or_as_the_held_series_of_one(kind: str, at: int, cut: int,
                                                                     insert: bytes) -> None:
    """An edited page reads as the full parse does, or, when its shape is
    followed, as the full parse's matches of the held series in order (what
    it lacks is only series the page gained)."""
    base = _fleet(3.0) if kind == "fleet" else _ODD
    at = at % (len(base) + 1)
    edit = base[:at] + insert + base[at + cut:]
    r = VllmReader()
    r.parse(base)
    r.parse(base)
    held = _held_subsequence(r, edit)
    got, full = r.parse(edit), parse_vllm(edit)
    assert got in (full, held), (at, cut, insert)


def test_the_odd_page_is_followed_as_it_is_parsed() -> None:
    r = VllmReader()
    for _ in range(4):
        assert r.parse(_ODD) == parse_vllm(_ODD)
    assert r._since_full == 2
    s = parse_vllm(_ODD)
    assert s.waiting == 3 and s.prompt_tokens == float("1" * 64)  # both series of the duplicate; 64 digits read


def test_a_label_set_after_the_blank_of_an_unlabelled_line_is_read_in_full() -> None:
    """``vllm:num_requests_running 3`` held, then ``... {engine="1"} 5``: the
    held bytes still match, but what follows is a label set, not the value."""
    r = VllmReader()
    r.parse(_ODD)
    r.parse(_ODD)
    edit = _ODD.replace(b"vllm:num_requests_running 3", b'vllm:num_requests_running {engine="1"} 5')
    assert parse_vllm(edit).running == 5
    assert r.parse(edit) == parse_vllm(edit)


def test_a_label_set_that_did_not_close_keeps_no_shape() -> None:
    """The full parse reads ``{engine="1" 3`` as the value (no number: skipped);
    a shape ending at the name would then read ``vllm:num_requests_running7``,
    a line the full parse does not match."""
    a = (b'vllm:num_requests_running{engine="0"} 1\n'
         b'vllm:num_requests_waiting{engine="0"} 0\n'
         b'vllm:num_requests_running{engine="1" 3\n')
    b = a.replace(b'vllm:num_requests_running{engine="1" 3', b"vllm:num_requests_running7")
    r = VllmReader()
    r.parse(a)
    r.parse(a)
    assert r._prefixes is None
    assert r.parse(b) == parse_vllm(b) and parse_vllm(b).running == 1


def test_a_page_of_many_series_keeps_no_shape() -> None:
    body = b"vllm:num_requests_waiting 0\n" + b"".join(
        b'vllm:num_requests_running{engine="%d"} 1\n' % i for i in range(VllmReader.MAX_SERIES + 1))
    r = VllmReader()
    assert r.parse(body).running == VllmReader.MAX_SERIES + 1
    assert r._prefixes is None
    assert r.parse(body) == parse_vllm(body)
    assert r._prefixes is None


def test_a_page_that_is_not_vllm_yet_does_not_hide_the_one_that_follows() -> None:
    """A pod's address answering something else first (a proxy, a starting
    process): the vLLM page after it is read in full, never from the empty shape."""
    r = VllmReader()
    for _ in range(3):
        assert not r.parse(b"# nothing here yet\n").looks_like_vllm
    assert r.parse(_fleet(3.0)) == parse_vllm(_fleet(3.0))
    assert r.parse(_fleet(3.0)).looks_like_vllm


def test_a_page_of_long_label_sets_keeps_no_shape() -> None:
    body = (b"vllm:num_requests_waiting 0\n"
            b'vllm:num_requests_running{engine="0",x="%s"} 1\n' % (b"a" * VllmReader.MAX_SHAPE_BYTES))
    r = VllmReader()
    for _ in range(3):
        assert r.parse(body).running == 1
        assert r._prefixes is None


def test_a_reader_that_parses_every_page_in_full_keeps_no_shape() -> None:
    """At intervals of 1.5 s and more every page is parsed in full: building a
    shape nobody follows would cost a quarter of a parse more."""
    r = VllmReader(full_every=1)
    for rate in (1.0, 2.0, 3.0):
        assert r.parse(_fleet(rate)) == parse_vllm(_fleet(rate))
    assert r._prefixes is None
