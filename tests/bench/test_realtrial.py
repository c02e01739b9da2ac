"""The real-time trial's pure parts and its client (``python -m
bench.routing.realtrial`` runs the routers themselves; these tests need
neither them nor the vllm-router binary)."""

from __future__ import annotations

import argparse
import dataclasses
import os
from pathlib import Path

import pytest
import yaml
from aiohttp import web
from kinference_simulators import vllm
from kinference_simulators.testing import serve

from bench.routing import realtrial
from bench.routing.realtrial import Outcome
from bench.routing.workloads import SimRequest
from kinference_common.compiler import compile_documents
from kinference_common.manifests import load_text


def test_the_arrivals_are_the_same_for_a_seed_and_have_the_trials_shape() -> None:
    a = realtrial.arrivals(7, 18.0, 20.0)
    b = realtrial.arrivals(7, 18.0, 20.0)
    assert [(r.time, r.text, r.output_len) for r in a] == [(r.time, r.text, r.output_len) for r in b]
    other = realtrial.arrivals(8, 18.0, 20.0)
    assert [r.time for r in other] != [r.time for r in a]
    # Poisson at 18/s over 20 s: 360 expected (sd 19)
    assert 280 < len(a) < 440
    assert all(0 <= x.time < y.time < 20.0 for x, y in zip(a, a[1:]))
    assert {r.output_len for r in a} == {32}
    assert len({r.group for r in a}) == 16
    # ~2,000-token system prompt + ~200-token question
    assert all(2100 <= r.prompt_tokens <= 2300 for r in a)
    # two requests of a group share exactly their system prompt (the question starts with a unique chunk)
    g = [r for r in a if r.group == a[0].group]
    other_question = next(r for r in g if r.text != g[0].text)
    common = len(os.path.commonprefix([g[0].text, other_question.text]))
    assert 8000 <= common < 8000 + 64  # 2,000 tokens of 4 characters, then each question's own first chunk
    assert all(r.text[:8000] != a[0].text[:8000] for r in a if r.group != a[0].group)


def test_quantile_is_nearest_rank() -> None:
    xs = [float(i) for i in range(1, 11)]  # 1..10, shuffled order must not matter
    assert realtrial.quantile(list(reversed(xs)), 0.5) == 5.0
    assert realtrial.quantile(xs, 0.9) == 9.0  # not 10: 0.9 * 10 is 9.000000000000002 in floats
    assert realtrial.quantile(xs, 0.99) == 10.0
    assert realtrial.quantile(xs, 0.0) == 1.0
    assert realtrial.quantile([], 0.5) is None
    assert realtrial.quantile([3.0], 0.99) == 3.0


def test_other_group_counts_change_the_groups_and_keep_sixteen_as_it_was() -> None:
    sixteen = realtrial.arrivals(7, 18.0, 20.0, 16)
    assert [r.text for r in sixteen] == [r.text for r in realtrial.arrivals(7, 18.0, 20.0)]
    for groups in (8, 32):
        reqs = realtrial.arrivals(7, 18.0, 20.0, groups)
        assert len({r.group for r in reqs}) == groups  # 360 requests: every group is drawn
        assert [r.text for r in reqs] == [r.text for r in realtrial.arrivals(7, 18.0, 20.0, groups)]


def _req(group: int, prefix: int = 2000, at: float = 0.0) -> SimRequest:
    return SimRequest(id="r", time=at, text="", prompt_tokens=prefix + 200, output_len=32, group=group,
                      prefix_tokens=prefix)


def test_sources_tell_cold_starts_from_waiting_behind_them() -> None:
    reqs = [_req(0, at=0.0), _req(1, at=0.1), _req(0, at=1.0), _req(1, at=1.1), _req(0, at=1.2), _req(0, at=1.3),
            _req(1, at=2.0)]
    outs = [
        Outcome(0.30, 1.0, sent=0.0, pod="a", cached=0),      # group 0's first
        Outcome(0.30, 1.0, sent=0.1, pod="b", cached=0),      # group 1's first
        Outcome(0.05, 1.0, sent=1.0, pod="a", cached=1984),   # warm, nothing cold in flight
        Outcome(0.40, 1.0, sent=1.1, pod="c", cached=16),     # group 1 again, on a pod without it
        Outcome(0.20, 1.0, sent=1.2, pod="c", cached=1984),   # warm, while c prefills group 1
        Outcome(None, None, "HTTP 503", sent=1.3),           # failed
        Outcome(0.03, 1.0, sent=2.0),                        # no pod, no usage: the router dropped them
    ]
    assert realtrial.sources(reqs, outs) == ["group_first", "group_first", "warm", "cold", "behind_cold", None,
                                             "unknown"]
    assert realtrial.slowest(outs) == [3]  # 6 answered: the p99 is the slowest
    assert realtrial.slowest(outs, 0.5) == [3, 0, 1, 4]  # the p50 (3rd of 6) and every slower one
    assert realtrial.slowest([Outcome(None, None, "x")]) == []
    eight_hundred = [Outcome(0.001 * i, 1.0) for i in range(800)]
    assert len(realtrial.slowest(eight_hundred)) == 9  # the 792nd and the 8 above it


def test_attribute_compares_the_same_requests_across_routers() -> None:
    reqs = [_req(g % 4, at=g * 0.1) for g in range(199)]  # the p99 is the 198th of 199: two at or above it
    slow = [Outcome(0.02, 1.0, sent=i * 0.1, pod="a", cached=1984) for i in range(199)]
    slow[150] = Outcome(0.90, 1.0, sent=15.0, pod="b", cached=0)  # cold on a pod without its group
    slow[151] = Outcome(0.80, 1.0, sent=15.1, pod="b", cached=1984)  # behind it
    peer = [Outcome(0.03, 1.0, sent=i * 0.1, pod="a", cached=1984) for i in range(199)]
    peer[10] = Outcome(0.50, 1.0, sent=1.0, pod="a", cached=1984)
    att = realtrial.attribute(reqs, {"kinference": slow, "vllm_router_cache_aware": peer})
    mine = att["routers"]["kinference"]
    assert mine["tail"] == 2 and mine["tail_min_ttft_s"] == 0.80
    assert mine["sources"] == {"group_first": 0, "early": 0, "cold": 1, "behind_cold": 1, "warm": 0, "unknown": 0}
    assert mine["all_sources"]["group_first"] == 4
    same = att["same_requests"]["vllm_router_cache_aware"]
    assert same["ttft_p50_s"] == 0.03 and same["also_in_its_tail"] == 0
    assert same["sources"]["warm"] == 2
    text = realtrial.tail_table(att)
    assert "| kinference | 2 | 800 | 0 | 0 | 1 | 1 | 0 | 0 |" in text
    assert "kinference's slowest 2 under vllm_router_cache_aware: TTFT p50 30 ms, 0 also" in text


def row(router: str, p50: float, p99: float, rest: float | None = None) -> dict:
    return {"router": router, "ttft_p50_s": p50, "ttft_p99_s": p99, "ttft_p99_after_first_s": rest}


def test_goal_is_the_issues_and_the_sweep_names_each_run() -> None:
    rows = [row("kinference", 0.030, 0.150), row("vllm_router_cache_aware", 0.039, 0.200),
            row("vllm_router_round_robin", 0.190, 0.450)]
    g = realtrial.goal(rows)
    assert g == {"best_peer": "vllm_router_cache_aware", "p99_ratio": 0.75, "p50_ratio": 0.769, "met": True}
    rows[0] = row("kinference", 0.030, 0.296)
    assert realtrial.goal(rows)["met"] is False
    assert realtrial.goal(rows[:1]) is None
    # p50 against the best p50 of the peers, not the p50 of the peer best at p99
    mixed = [row("kinference", 0.035, 0.100), row("vllm_router_cache_aware", 0.040, 0.200),
             row("vllm_router_round_robin", 0.030, 0.500)]
    assert realtrial.goal(mixed)["p50_ratio"] == pytest.approx(1.167) and realtrial.goal(mixed)["met"] is False
    # without each group's first request: against the peer best at that, which may be another one
    rows = [row("kinference", 0.030, 0.296, 0.040), row("vllm_router_cache_aware", 0.039, 0.200, 0.060),
            row("vllm_router_round_robin", 0.190, 0.450, 0.055)]
    g = realtrial.goal(rows)
    assert (g["best_peer_after_first"], g["p99_after_first_ratio"], g["met_after_first"]) == (
        "vllm_router_round_robin", 0.727, True)
    runs = [{"groups": 8, "seed": 1, "rows": rows, "goal": g},
            {"groups": 32, "seed": 1, "rows": rows[1:], "goal": realtrial.goal(rows[1:])}]
    text = realtrial.sweep_table(runs)
    assert ("| 8 | 1 | 30 / 296 / 40 | 39 / 200 / 60 | 190 / 450 / 55 | - | 1.48x vllm_router_cache_aware | "
            "missed | 0.73x vllm_router_round_robin | met | - | - |") in text
    assert "| 32 | 1 | - | 39 / 200 / 60 | 190 / 450 / 55 | - | - | - | - | - | - | - |" in text
    slower = [row("kinference", 0.045, 0.100, 0.040)] + rows[1:]  # p99 met, p50 not
    assert "| 0.50x vllm_router_cache_aware | missed (p50 1.15x) |" in realtrial.sweep_table(
        [{"groups": 8, "seed": 2, "rows": slower, "goal": realtrial.goal(slower)}])
    assert realtrial.worst_lines(runs) == [
        "p99 against the best vllm-router policy: worst 1.48x; goal (<= 0.80x, p50 no worse) met on 0 of 1 runs",
        "p99 without each group's first against the best vllm-router policy: worst 0.73x; goal (<= 0.80x, "
        "p50 no worse) met on 1 of 1 runs"]


def test_summarize_leaves_each_groups_first_out_of_the_rest_of_the_tail() -> None:
    reqs = [_req(i % 5) for i in range(200)]  # requests 0-4 are their groups' first
    outs = [Outcome(0.5 if i < 5 else 0.01 * (1 + i % 10), 1.0) for i in range(200)]
    row = realtrial.summarize("x", outs, {}, reqs)
    assert row["ttft_p99_s"] == 0.5 and row["ttft_p99_after_first_s"] == pytest.approx(0.10)
    assert realtrial.summarize("x", outs, {})["ttft_p99_after_first_s"] is None
    back = realtrial.outcomes_of(row)
    assert [(o.ttft, o.pod, o.cached) for o in back[:2]] == [(0.5, None, None), (0.5, None, None)]


def test_seed_and_groups_take_lists() -> None:
    assert realtrial._ints("1,2, 3") == [1, 2, 3]
    for bad in ("", "x", "0", "2,-1"):
        with pytest.raises(argparse.ArgumentTypeError):
            realtrial._ints(bad)


def test_summarize_counts_errors_and_keeps_them_out_of_e2e() -> None:
    outcomes = [Outcome(0.01 * i, 0.1 * i) for i in range(1, 100)] + [Outcome(None, None, "HTTP 503"),
                                                                     Outcome(0.5, 9.0, "stream ended without [DONE]")]
    row = realtrial.summarize("x", outcomes, {"queries": 200.0, "hits": 150.0, "preemptions": 3.0,
                                              "served": [50.0, 51.0]})
    assert row["requests"] == 101 and row["errors"] == 2
    assert row["error_samples"] == ["HTTP 503", "stream ended without [DONE]"]
    assert row["ttft_p50_s"] == pytest.approx(0.50)  # 100 first chunks: the 0.5 of the broken stream counts
    assert row["e2e_p99_s"] == pytest.approx(9.9)  # 99 e2e values: the broken stream's 9.0 would make it 9.8
    assert row["ttft_s"][-2:] == [None, 0.5] and row["e2e_s"][-2:] == [None, None]  # per request, in order
    assert row["prefix_hit_rate"] == 0.75 and row["preemptions"] == 3 and row["served_per_pod"] == [50, 51]
    empty = realtrial.summarize("y", [], {})
    assert empty["ttft_p99_s"] is None and empty["prefix_hit_rate"] is None


def test_table_has_a_line_per_router_in_milliseconds() -> None:
    rows = [realtrial.summarize("kinference", [Outcome(0.031, 0.4)], {"queries": 4.0, "hits": 3.0}),
            realtrial.summarize("nobody", [Outcome(None, None, "HTTP 500")], {})]
    lines = realtrial.table(rows).splitlines()
    assert lines[0].startswith("| router | requests | TTFT p50 ms")
    assert lines[2] == "| kinference | 1 | 31 | 31 | 31 | 400 | 0.750 | 0 | 0 |"
    assert lines[3] == "| nobody | 1 | - | - | - | - | - | 0 | 1 |"


def test_the_trial_policy_compiles_to_one_rule_with_its_tie_break(tmp_path: Path) -> None:
    res = compile_documents(load_text(realtrial.MANIFESTS, "trial"))
    assert not res.errors
    stack = realtrial.TrialStack(tmp_path / "run", 700, sim_ports=[4001, 4002])
    stack.prepare()
    assert (tmp_path / "run" / "manifests" / "trial.yaml").read_text() == realtrial.MANIFESTS
    eps = yaml.safe_load((tmp_path / "run" / "endpoints.yaml").read_text())["endpoints"]
    assert [(e["workerSet"], e["pod"], e["address"]) for e in eps] == [
        ("trial", "pod-0", "127.0.0.1:4001"), ("trial", "pod-1", "127.0.0.1:4002")]
    # the stack's ports are make run's, shifted by the offset
    assert stack._ports() == [4922, 8790, 8783, 9791, 8780, 8781]
    policy = next(d for d in yaml.safe_load_all(realtrial.MANIFESTS) if d["kind"] == "InferencePolicy")
    route = policy["spec"]["rules"][0]["route"]
    assert len(policy["spec"]["rules"]) == 1
    assert route["select"] == [{"type": "Local", "minimize": "PredictedTTFT"}]
    assert route["tieBreak"] == ["PrefixAffinity", "LeastInFlight", "Random"]


def test_routers_flag_names_what_it_does_not_know() -> None:
    assert realtrial._routers("kinference, direct_round_robin") == ["kinference", "direct_round_robin"]
    with pytest.raises(argparse.ArgumentTypeError, match="unknown router.*nginx.*known: kinference"):
        realtrial._routers("kinference,nginx")


async def test_replay_streams_round_robin_and_records_failures_without_raising() -> None:
    reqs = realtrial.arrivals(3, 40.0, 0.2)[:4]
    for r in reqs:
        r.output_len = 2
    cfg = vllm.VllmSimConfig(model="m", speed_profile="fast", time_scale=50.0, seed=1, prompt_tokens_details=True,
                             system_fingerprint="pod-0")

    async def refuse(request: web.Request) -> web.Response:
        return web.json_response({"error": "busy"}, status=503)

    down = web.Application()
    down.router.add_post("/v1/completions", refuse)
    async with serve(vllm.make_app(cfg)) as up, serve(down) as busy:
        urls = [str(up.make_url("/v1/completions")), str(busy.make_url("/v1/completions"))]
        got = await realtrial.replay(urls, reqs)
    # even requests went to the simulator, odd ones to the refusing server
    assert [o.error for o in got] == [None, "HTTP 503", None, "HTTP 503"]
    assert all(o.ttft is not None and o.e2e is not None and o.e2e >= o.ttft for o in got[::2])
    assert all(o.ttft is None for o in got[1::2])
    # who answered and what it had cached, from the fingerprint and the usage chunk
    assert [o.pod for o in got] == ["pod-0", None, "pod-0", None]
    assert got[0].cached == 0 and got[2].cached is not None
    assert all(o.sent is not None for o in got) and got[2].sent > got[0].sent


def test_three_replicas_get_ports_of_their_own_and_a_goal_line(tmp_path) -> None:
    """``kinference_3``: three router processes, no port shared with each other
    or the rest of the stack; its goal judged and said apart from one replica's."""
    stack = realtrial.TrialStack(tmp_path / "s", 700, sim_ports=[9001, 9002], routers=3)
    stack.prepare()
    routers = [p for p in stack.plan("h100", 1.0) if p.name.startswith("router")]
    assert [p.name for p in routers] == ["router", "router-1", "router-2"]
    ports = stack._ports()
    assert len(ports) == len(set(ports))
    for k, p in enumerate(routers):
        assert str(stack.router_port(k)) in p.argv and str(stack.router_port(k, "admin")) in p.argv
    rows = [row("kinference_3", 0.030, 0.100, 0.040), row("vllm_router_cache_aware", 0.039, 0.200, 0.060)]
    run = {"groups": 8, "seed": 1, "rows": rows, "goal": realtrial.goal(rows),
           "goal_3": realtrial.goal(rows, "kinference_3")}
    assert run["goal"] is None and run["goal_3"]["met"]
    assert realtrial.all_worst_lines([run])[0] == (
        "kinference_3 (three replicas): p99 against the best vllm-router policy: worst 0.50x; goal (<= 0.80x, "
        "p50 no worse) met on 1 of 1 runs")


def _asked(group: int, question: int, at: float) -> SimRequest:
    """A trial-shaped request with real text: its group's 2,000-token system
    prompt (4 characters a token), then one of the group's 200-token questions."""
    text = f"system prompt of group {group} ".ljust(8000, ".") + f"question {question} ".ljust(800, "?")
    return SimRequest(id=f"{group}/{question}/{at}", time=at, text=text, prompt_tokens=2200, output_len=2,
                      group=group, prefix_tokens=2000)


def test_floors_are_the_cold_start_the_wait_for_it_or_a_warm_prefill() -> None:
    """A group's first prefills its whole prompt (h100: 6 ms a step plus 60 us
    a token); a later request of the group sent while that could still be
    running waits for it or prefills the whole prompt elsewhere, whichever
    is sooner; after it, only its own question is prefilled, and a question
    asked before only its last block."""
    cold, warm = 0.006 + 2200 * 0.00006, 0.006 + 200 * 0.00006  # 0.138 s and 0.018 s
    repeat = 0.006 + 8 * 0.00006  # 2,192 of its 2,200 tokens are in whole blocks; the last token's is not reused
    reqs = [_asked(0, 1, 0.0), _asked(0, 2, 0.05), _asked(0, 3, 0.001), _asked(1, 1, 0.06), _asked(0, 4, 0.2),
            _asked(0, 4, 0.4), _asked(0, 1, 0.06)]
    got = realtrial.floors(reqs)
    assert [f.early for f in got] == [False, True, True, False, False, False, True]
    assert [f.ttft for f in got] == pytest.approx([cold, cold - 0.05 + warm, cold, cold, warm, repeat,
                                                   cold - 0.06 + repeat])
    row = realtrial.floor_row(reqs)
    assert row["router"] == "floor" and row["early"] == 3 and row["ttft_p99_s"] == pytest.approx(cold)
    # a prompt that shares nothing is cold whenever it comes
    assert realtrial.floors([_asked(0, 1, 0.0), _asked(1, 1, 5.0)])[1].ttft == pytest.approx(cold)


def test_a_longer_prompt_is_cached_chunk_by_chunk() -> None:
    """Over the step's token budget (8,192 on h100) a prompt is prefilled in
    chunks, and the blocks of the first chunk are cached when its step ends."""
    first = SimRequest(id="a", time=0.0, text="x" * 4 * 10000, prompt_tokens=10000, output_len=2)
    half = SimRequest(id="b", time=0.0, text="x" * 4 * 8192 + "y" * 4 * 100, prompt_tokens=8292, output_len=2)
    got = realtrial.floors([first, half])
    step1 = 0.006 + 8192 * 0.00006
    assert got[0].ttft == pytest.approx(step1 + 0.006 + 1808 * 0.00006)
    assert got[1].ttft == pytest.approx(step1 + 0.006 + 100 * 0.00006) and got[1].early
    # the engine: the second joins the first's second step, its own 100 tokens beside the first's 1,808
    first.engine_hashes = half.engine_hashes = None
    from bench.routing.fleet import prepare
    prepare([first, half])
    ttft = _engine_ttfts([first, half])
    assert ttft[0] >= got[0].ttft - 1e-9 and ttft[1] >= got[1].ttft - 1e-9


def _engine_ttfts(reqs: list[SimRequest]) -> list[float]:
    """The requests' TTFTs on one idle h100 pod of the engine's own scheduler
    (the simulators', offline: simulated time, deterministic)."""
    from kinference_simulators.profiles import get_profile
    from kinference_simulators.scheduler import Scheduler, SchedulerConfig

    sched = Scheduler(SchedulerConfig(num_gpu_blocks=realtrial.BLOCKS, max_model_len=16384,
                                      max_num_batched_tokens=8192, max_num_seqs=1024), get_profile("h100"))
    now, pending, ttft = 0.0, list(enumerate(reqs)), {}
    while pending or sched.has_work():
        while pending and pending[0][1].time <= now:
            i, r = pending.pop(0)
            sched.add_request(str(i), r.prompt_tokens, r.engine_hashes, 2, "length", r.time)
        if not sched.has_work():
            now = pending[0][1].time
            continue
        res = sched.step(now)
        for t in res.tokens:
            if t.index == 0:
                ttft[int(t.request_id)] = t.latency
        now = res.end
    return [ttft[i] for i in range(len(reqs))]


def test_the_engine_never_serves_a_request_under_its_floor() -> None:
    """The floors against the engine's own scheduler: each request of the
    trial's first two seconds at 8 groups (and one group's first asked again
    10 ms later) on an idle pod alone, or beside the earlier request it
    shares the most with. Never under the floor, and on it when nothing else
    runs there."""
    from bench.routing.fleet import prepare

    reqs = [r for r in realtrial.arrivals(4, 18.0, 45.0, 8) if r.time < 2.0]
    reqs = sorted([*reqs, dataclasses.replace(reqs[0], id="again", time=reqs[0].time + 0.01)], key=lambda r: r.time)
    prepare(reqs)  # the engine's block hashes of each prompt
    want = realtrial.floors(reqs)
    checked = 0
    for i, r in enumerate(reqs):
        # the earlier request it shares the longest block prefix with, if any
        def shared(j: int) -> int:
            n = 0
            for a, b in zip(reqs[j].engine_hashes, r.engine_hashes):  # type: ignore[arg-type]
                if a != b:
                    break
                n += 1
            return n
        best = max(range(i), key=shared, default=None)
        alone = best is None or shared(best) == 0
        got = _engine_ttfts([r] if alone else [reqs[best], r])[-1]
        assert got >= want[i].ttft - 1e-9, (i, r.id, got, want[i].ttft)
        if alone:
            assert got == pytest.approx(want[i].ttft, abs=1e-6)
        checked += not alone and want[i].early
    assert checked >= 3  # requests sent while their group's first prefilled, the repeat among them


def test_a_request_sent_during_its_groups_first_is_early_not_behind_a_cold_prefill() -> None:
    reqs = [_asked(0, 1, 0.0), _asked(0, 2, 0.05), _asked(0, 3, 0.06), _asked(0, 4, 1.0)]
    # floors: 138, 106 (wait 88 ms, then 18), 96 and 18 ms
    outs = [Outcome(0.14, 1.0, sent=0.0, pod="a", cached=0),
            Outcome(0.11, 1.0, sent=0.05, pod="a", cached=2000),   # waited for the first, as any router's would
            Outcome(0.14, 1.0, sent=0.06, pod="b", cached=0),      # prefilled it too, elsewhere: 44 ms over its floor
            Outcome(0.02, 1.0, sent=1.0, pod="b", cached=2000)]
    assert realtrial.sources(reqs, outs) == ["group_first", "early", "cold", "warm"]
    outs[2] = Outcome(0.11, 1.0, sent=0.06, pod="a", cached=2000)  # within 20 ms of its floor: early
    assert realtrial.sources(reqs, outs)[2] == "early"
    # an early request that prefilled the prompt itself keeps its pod busy as a cold one does
    outs[2] = Outcome(0.11, 1.0, sent=0.06, pod="b", cached=0)
    reqs[3], outs[3] = _asked(0, 4, 0.25), Outcome(0.05, 1.0, sent=0.25, pod="b", cached=2000)
    assert realtrial.sources(reqs, outs)[2:] == ["early", "warm"]  # b's prefill of it ended at 0.17
    reqs[3], outs[3] = _asked(0, 4, 0.15), Outcome(0.05, 1.0, sent=0.15, pod="b", cached=2000)
    assert realtrial.sources(reqs, outs)[3] == "behind_cold"


def test_the_goal_against_the_floor_says_where_no_router_could_meet_it() -> None:
    rows = [row("kinference", 0.021, 0.135), row("vllm_router_cache_aware", 0.024, 0.140),
            row("vllm_router_round_robin", 0.022, 0.147)]
    under = {"ttft_p99_s": 0.1261}  # 0.8x the best peer (0.112 s) is under it
    g = realtrial.goal(rows, floor=under)
    assert g["met"] is False and g["reachable"] is False
    assert g["p99_over_floor"] == pytest.approx(1.071) and g["met_at_floor"] is False  # 1.05x: 0.1324 s
    rows[0] = row("kinference", 0.021, 0.132)
    assert realtrial.goal(rows, floor=under)["met_at_floor"] is True
    assert realtrial.goal(rows, floor={"ttft_p99_s": 0.0175})["met_at_floor"] is False  # 0.112 s is the bar
    rows[0] = row("kinference", 0.025, 0.110)  # p99 under both, p50 over the best peer's
    assert realtrial.goal(rows, floor=under)["met_at_floor"] is False
    assert "reachable" not in realtrial.goal(rows)
    rows[0] = row("kinference", 0.021, 0.135)
    runs = [{"groups": 8, "seed": 1, "rows": rows, "floor": under, "goal": realtrial.goal(rows, floor=under)},
            {"groups": 8, "seed": 2, "rows": rows, "floor": {"ttft_p99_s": 0.0175},
             "goal": realtrial.goal(rows, floor={"ttft_p99_s": 0.0175})}]
    text = realtrial.sweep_table(runs)
    assert "| 126 | 0.96x vllm_router_cache_aware | missed |" in text
    assert "| 1.07x | missed (0.8x the best peer is under the floor) |" in text
    assert "| 18 | 0.96x vllm_router_cache_aware | missed | - | - | 7.71x | missed |" in text
    assert realtrial.worst_lines(runs)[-1] == (
        "p99 at most the larger of 0.80x the best peer's and 1.05x the floor's (p50 no worse): met on 0 of 2 runs; "
        "0.80x the best peer's p99 is under the floor's on 1 of them (no router could meet it there)")
    floor = {"router": "floor", "requests": 3, "ttft_p50_s": 0.007, "ttft_p90_s": 0.018, "ttft_p99_s": 0.1375,
             "early": 1}
    text = realtrial.table([], floor)
    assert "| floor | 3 | 7 | 18 | 138 | - | - | - | - |" in text and "1 requests arrived while a prefix" in text


async def test_the_simulator_never_answers_under_the_floor() -> None:
    """The floors are a bound on the simulators the trial runs (h100, real
    time): a group's first, a request of its group sent while it prefills
    and one sent after it, each at or above its floor."""
    reqs = [r for r in realtrial.arrivals(1, 18.0, 10.0, 2) if r.group == 0][:3]
    for r, at in zip(reqs, (0.0, 0.04, 0.4), strict=True):
        r.time, r.output_len = at, 2
    want = realtrial.floors(reqs)
    assert [f.early for f in want] == [False, True, False]
    cfg = vllm.VllmSimConfig(model="m", speed_profile="h100", time_scale=1.0, seed=1, prompt_tokens_details=True,
                             system_fingerprint="pod-0")
    async with serve(vllm.make_app(cfg)) as up:
        got = await realtrial.replay([str(up.make_url("/v1/completions"))], reqs)
    assert [o.error for o in got] == [None, None, None]
    assert got[1].cached is not None and got[1].cached >= 2000  # it waited for the first's blocks
    for o, f in zip(got, want, strict=True):
        assert o.ttft is not None and o.ttft >= f.ttft - 0.001, (o.ttft, f.ttft)
