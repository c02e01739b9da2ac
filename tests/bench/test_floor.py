"""The TTFT floors of the fleet benchmark (bench/routing/floor.py): the idle
floor is the cost model's own arithmetic (chunking included), no router's
measured TTFT ever goes below it, and the floors are deterministic."""

from __future__ import annotations

import pytest

from bench.routing import floor, run
from bench.routing.fleet import PodLoad, PodSpec, fleet, simulate
from bench.routing.workloads import SimRequest, TextFactory, generate
from kinference_simulators.profiles import get_profile

H100 = get_profile("h100")
#: sim time is a sum of step lengths: a request alone can land an ulp under its floor
ULP = 1e-9


def _request(rid: str, tokens: int, *, t: float = 0.0, prefix: int = 0, text: str | None = None) -> SimRequest:
    import random

    text = text if text is not None else TextFactory(7).text(random.Random(rid), tokens)
    return SimRequest(rid, t, text, len(text) // 4, 8, prefix_tokens=prefix)


def test_idle_floor_of_a_long_prompt_is_two_chunks_of_the_h100_cost_model() -> None:
    req = _request("long", 12_000)
    assert req.prompt_tokens == 12_000
    (f,) = floor.request_floors([req], [PodSpec("p", "ws", "m")])
    # budget 8,192 tokens a step: 8,192 then 3,808, each step 6 ms + 60 us a token
    assert f.cached_tokens == 0
    assert f.idle_s == pytest.approx((0.006 + 8192 * 0.00006) + (0.006 + 3808 * 0.00006), abs=1e-12)
    assert f.loaded_s == f.idle_s  # no run, no carried decodes


def test_idle_floor_takes_the_fastest_profile_serving_the_model() -> None:
    req = _request("a", 4_992)
    assert req.prompt_tokens == 4_992
    (f,) = floor.request_floors([req], [PodSpec("p", "ws", "m", "a10g", 4096)])
    # a10g: 2,048 tokens a step -> 2,048 + 2,048 + 896, each step 12 ms + 400 us a token
    assert f.idle_s == pytest.approx(3 * 0.012 + 4992 * 0.0004, abs=1e-12)
    (g,) = floor.request_floors([req], [PodSpec("p", "ws", "m", "a10g", 4096), PodSpec("q", "ws", "m")])
    assert g.idle_s == pytest.approx(0.006 + 4992 * 0.00006, abs=1e-12)  # the h100 pod is the floor


def test_shareable_prefix_is_whole_blocks_and_a_repeat_hits_all_but_the_last_block() -> None:
    first = _request("r0", 2_304, prefix=2_050)  # declared prefix, not a multiple of 16
    again = _request("r1", 0, t=1.0, text=first.text)
    other = _request("r2", 300, t=2.0, text=first.text[: 2_050 * 4] + "x" * 1_000)
    assert first.prompt_tokens == 2_304
    cached = floor.cached_tokens([first, again, other])
    assert cached["r0"] == 2_048  # 128 whole blocks of the 2,050 declared
    assert cached["r1"] == 2_288  # everything but the block with the last token
    assert cached["r2"] == 2_048  # shares 2,050 tokens with r0: 128 whole blocks
    floors = {f.request_id: f.idle_s for f in floor.request_floors([first, again, other], [PodSpec("p", "ws", "m")])}
    assert floors["r0"] == pytest.approx(0.006 + (2_304 - 2_048) * 0.00006, abs=1e-12)
    assert floors["r1"] == pytest.approx(0.006 + 16 * 0.00006, abs=1e-12)


def test_a_request_alone_on_an_idle_pod_takes_exactly_its_idle_floor() -> None:
    reqs = [_request("solo", 12_000, t=0.5), _request("later", 3_000, t=20.0)]
    res = simulate(reqs, [PodSpec("p", "ws", "m")], [run.make_router("round_robin")], seed=1)
    floors = {f.request_id: f.idle_s for f in floor.request_floors(reqs, res.pods)}
    for o in res.outcomes:
        assert o.ttft == pytest.approx(floors[o.req.id], abs=ULP)


def test_pod_load_counts_only_the_window_and_weights_decodes_by_time() -> None:
    load = PodLoad(window_seconds=10.0)
    load.add(-1.0, 2.0, 4, 400, (0.0, 10.0))  # half inside
    load.add(5.0, 1.0, 2, 100, (0.0, 10.0))
    load.add(10.0, 1.0, 9, 900, (0.0, 10.0))  # after the window
    assert load.busy_seconds == pytest.approx(2.0)
    assert load.mean_decodes == pytest.approx((4 * 1.0 + 2 * 1.0) / 10.0)
    c = floor.Carried.of([load, PodLoad(window_seconds=10.0)])
    assert c.decodes == pytest.approx(0.3)
    assert c.context_tokens == pytest.approx((400 + 100) / 6.0)
    assert c.busy_fraction == pytest.approx(0.1)


SPEC = {
    "shared_prefix": (run.WorkloadSpec("shared_prefix", lambda: fleet(4, blocks=2048), 8.0, 0.5, warmup=1.0), 40.0),
    "chat": (run.WorkloadSpec("chat", lambda: fleet(4, blocks=2048), 8.0, 2.0, warmup=1.0), 6.0),
    "multiturn": (run.WorkloadSpec("multiturn", lambda: fleet(4, blocks=2048), 8.0, 1.0, warmup=1.0), 10.0),
}


@pytest.fixture(scope="module")
def runs() -> dict[tuple[str, str], tuple]:
    out = {}
    for w, (spec, rate) in SPEC.items():
        reqs = generate(w, 3, rate, spec.duration)
        for name in run.ROUTERS:
            res = simulate(reqs, spec.pods(), [run.make_router(name)], seed=3, window=(spec.warmup, spec.duration))
            out[w, name] = (res, run.metrics(res, spec))
    return out


def test_no_router_ever_answers_a_request_faster_than_its_idle_floor(runs: dict) -> None:
    for (w, name), (res, _) in runs.items():
        floors = {f.request_id: f for f in floor.measured_floors(res, SPEC[w][0].warmup)}
        assert len(floors) > 20, (w, name)
        closest = float("inf")
        for o in res.outcomes:
            f = floors.get(o.req.id)
            if f is None:
                continue
            assert o.ttft >= f.idle_s - ULP, (w, name, o.req.id, o.ttft, f)
            assert f.loaded_s >= f.idle_s
            closest = min(closest, o.ttft / f.idle_s)
        if w == "chat":
            assert closest < 1.02, name  # the bound is (nearly) reached, not just respected


def test_rows_carry_the_floors_the_same_idle_floor_for_every_router(runs: dict) -> None:
    for w in SPEC:
        rows = [m for (ww, _), (_, m) in runs.items() if ww == w]
        idle = {(m["idle_floor_p50_s"], m["idle_floor_p99_s"]) for m in rows}
        assert len(idle) == 1, w
        for m in rows:
            assert 0 < m["idle_floor_p50_s"] <= m["idle_floor_p99_s"] <= m["ttft_p99_s"]
            assert m["idle_floor_p50_s"] <= m["ttft_p50_s"]
            assert m["idle_floor_p99_s"] <= m["loaded_floor_p99_s"]
            (carried,) = m["fleet_carried"].values()
            assert carried["decodes_per_pod"] > 0 and 0 < carried["busy_fraction"] <= 1.0


def test_floors_are_deterministic(runs: dict) -> None:
    spec, rate = SPEC["chat"]
    reqs = generate("chat", 3, rate, spec.duration)
    res = simulate(reqs, spec.pods(), [run.make_router("kinference")], seed=3, window=(spec.warmup, spec.duration))
    again = floor.measured_floors(res, spec.warmup)
    assert again == floor.measured_floors(runs["chat", "kinference"][0], spec.warmup)
    assert again == floor.measured_floors(res, spec.warmup)


def test_headline_names_the_floor_and_whether_the_target_is_under_it() -> None:
    def row(router: str, p99: float, idle: float = 0.5, loaded: float = 0.55) -> dict:
        return {"workload": "chat", "router": router, "load": 0.8, "replicas": 1, "scrape_interval_s": 0.1,
                "ttft_p50_s": 0.3, "ttft_p99_s": p99, "goodput": 10.0, "idle_floor_p99_s": idle,
                "loaded_floor_p99_s": loaded}

    (h,) = run.headline([row("round_robin", 0.6, loaded=0.56), row("least_queue", 0.52), row("kinference", 0.51)])
    assert h["best_peer_p99"] == "least_queue"
    assert h["idle_floor_p99_s"] == 0.5 and h["loaded_floor_p99_s"] == 0.55
    assert h["best_peer_over_floor"] == pytest.approx(1.04)
    assert h["target_p99_s"] == pytest.approx(0.364) and h["target_below_floor"] is True
    (h,) = run.headline([row("least_queue", 2.0), row("kinference", 0.51)])
    assert h["target_below_floor"] is False


def test_the_restated_goal_takes_the_highest_of_its_three_bounds() -> None:
    def row(router: str, p99: float, p50: float = 0.3, goodput: float = 10.0, idle: float = 0.5,
            loaded: float = 0.55) -> dict:
        return {"workload": "chat", "router": router, "load": 0.9, "replicas": 1, "scrape_interval_s": 0.1,
                "ttft_p50_s": p50, "ttft_p99_s": p99, "goodput": goodput, "idle_floor_p99_s": idle,
                "loaded_floor_p99_s": loaded}

    # 0.7 x 0.52 = 0.364, 1.05 x idle 0.5 = 0.525, loaded floor 0.55: the loaded floor binds
    (h,) = run.headline([row("least_queue", 0.52), row("kinference", 0.55)])
    assert h["goal_p99_s"] == pytest.approx(0.55) and h["met"] is True and h["missed"] == []
    (h,) = run.headline([row("least_queue", 0.52), row("kinference", 0.60, p50=0.32, goodput=9.0)])
    assert h["met"] is False
    assert h["missed"] == ["p99 1.09x the target", "goodput x0.900", "p50 x1.07"]
    # a peer far above the floors: 0.7x the peer binds
    (h,) = run.headline([row("least_queue", 2.0), row("kinference", 1.5)])
    assert h["goal_p99_s"] == pytest.approx(1.4) and h["missed"] == ["p99 1.07x the target"]
    # without floors (an old results file): 0.7x the best peer alone
    (h,) = run.headline([row("least_queue", 1.0, idle=None, loaded=None),  # type: ignore[arg-type]
                         row("kinference", 0.7, idle=None, loaded=None)])  # type: ignore[arg-type]
    assert h["goal_p99_s"] == pytest.approx(0.7) and h["met"] is True


def test_declared_prefix_is_a_real_shared_prefix_of_the_text() -> None:
    for w in ("shared_prefix", "multiturn"):
        reqs = generate(w, 2, 20.0, 6.0)
        by_group: dict[int, list[SimRequest]] = {}
        for r in reqs:
            assert 0 < r.prefix_tokens < r.prompt_tokens, (w, r.id)
            by_group.setdefault(r.group, []).append(r)
        if w == "shared_prefix":
            for rs in by_group.values():
                assert len({r.text[: r.prefix_tokens * 4] for r in rs}) == 1
        else:
            for rs in by_group.values():  # each turn's declared prefix is the previous turn's prompt
                for prev, cur in zip(rs, rs[1:]):
                    assert cur.prefix_tokens == prev.prompt_tokens and cur.text.startswith(prev.text)
    assert all(r.prefix_tokens == 0 for r in generate("chat", 2, 5.0, 4.0))


def test_floors_need_a_pod_for_the_model() -> None:
    with pytest.raises(ValueError, match="no pod serves model 'n'"):
        floor.request_floors([SimRequest("x", 0.0, "a" * 400, 100, 4, model="n")], [PodSpec("p", "ws", "m")])
