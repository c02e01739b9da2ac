"""The vllm-router cross-check's comparison logic and the re-implemented
``cache_aware``'s decisions (``python -m bench.routing.crosscheck`` runs the
real binary; these tests need neither it nor a network)."""

from __future__ import annotations

import random
import re

import pytest
from kinference_simulators import vllm
from kinference_simulators.testing import serve

from bench.routing import crosscheck
from bench.routing.fleet import PodSpec, prepare
from bench.routing.peers import VllmRouterCacheAware
from bench.routing.workloads import SimRequest, TextFactory


def test_concentration_is_the_share_on_each_groups_busiest_pod() -> None:
    groups = [0, 1, 0, 0, 1, 1]
    assert crosscheck.concentration(["a", "b", "a", "a", "b", "b"], groups) == 1.0
    # group 0: a, c, a (2 of 3 on a); group 1: b, b, d (2 of 3 on b)
    assert crosscheck.concentration(["a", "b", "c", "a", "b", "d"], groups) == 4 / 6
    assert crosscheck.concentration([], []) == 1.0


def _side(picks: list[str], hit_rate: float) -> dict:
    served = [picks.count(p) for p in sorted(set(picks))]
    return {"picks": picks, "hit_rate": hit_rate, "served": served}


def test_compare_passes_like_with_like_and_fails_a_router_that_ignores_prefixes() -> None:
    rng = random.Random(1)
    groups = [rng.randrange(8) for _ in range(400)]
    sticky = [f"pod-{g % 4}" for g in groups]
    same = crosscheck.compare(_side(sticky, 0.95), _side(sticky, 0.95), groups, 1.0)
    assert same["within_tolerance"] and same["concentration_diff"] == 0.0
    # what the real router did without /tokenize: least-load for every request
    spread = [f"pod-{i % 4}" for i in range(400)]
    bad = crosscheck.compare(_side(spread, 0.88), _side(sticky, 0.95), groups, 0.57)
    assert bad["real_concentration"] < 0.5 and bad["simulated_concentration"] == 1.0
    assert bad["checks"] == {"hit_rate": False, "concentration": False, "explained": False}
    assert not bad["within_tolerance"]
    # the hit rate alone can agree while the decisions do not
    masked = crosscheck.compare(_side(spread, 0.95), _side(sticky, 0.95), groups, 1.0)
    assert masked["checks"]["hit_rate"] and not masked["within_tolerance"]
    assert not crosscheck.compare(_side(sticky, 0.95), _side(sticky, 0.95), groups, 0.97)["within_tolerance"]


def test_compare_names_mismatched_inputs() -> None:
    with pytest.raises(ValueError, match="expected 3"):
        crosscheck.compare(_side(["a", "b"], 0.9), _side(["a", "b", "a"], 0.9), [0, 1, 0], 1.0)


async def test_response_ids_name_the_simulator_that_answered() -> None:
    """The cross-check tells pods apart by the completion ids their --seed gives."""
    cfg = vllm.VllmSimConfig(model="m", speed_profile="fast", time_scale=50.0, seed=103)
    got = []
    async with serve(vllm.make_app(cfg)) as client:
        for _ in range(3):
            resp = await client.post("/v1/completions", json={"model": "m", "prompt": "hi", "max_tokens": 2,
                                                              "stream": True})
            first = next(line for line in (await resp.text()).splitlines() if line.startswith("data:"))
            got.append(re.search(r'"id":\s*"([^"]+)"', first).group(1))
    assert got == crosscheck._response_ids(103, 3)
    assert got != crosscheck._response_ids(100, 3)


def _group_requests(n: int, seed: int) -> list[SimRequest]:
    f = TextFactory(seed)
    rng = random.Random(seed)
    systems = [f.text(rng, 512, unique=False) for _ in range(3)]
    return [_req(i, systems[i % 3] + f.text(rng, 64)) for i in range(n)]


def test_explained_accepts_the_rules_own_picks_and_rejects_prefix_blind_ones() -> None:
    reqs = _group_requests(30, 6)
    # one at a time (each ends before the next is sent): the rule's own picks
    rule, keys = _router(crosscheck.PODS)
    own = [rule.pick(r, 0.0).rsplit("/", 1)[-1] for r in reqs]
    for r in reqs:
        rule.on_finished(r, 0.0)
    sent = [float(i) for i in range(30)]
    ended = [t + 0.5 for t in sent]
    assert len(set(own)) == 3  # three groups, three pods
    assert crosscheck.explained(reqs, own, sent, ended) == 1.0
    # round robin ignores the groups: many of its picks are not the rule's
    # (fewer as it goes, since every pod soon holds every group's prefix)
    blind = [f"pod-{i % crosscheck.PODS}" for i in range(30)]
    assert crosscheck.explained(reqs, blind, sent, ended) < 0.8
    # with every request still open the loads differ by far less than the
    # imbalance threshold (64), so the rule still follows each prefix
    overlapping = [t + 10.0 for t in sent]
    assert crosscheck.explained(reqs, own, sent, overlapping) == 1.0


def _router(n: int = 2) -> tuple[VllmRouterCacheAware, list[str]]:
    pods = [PodSpec(f"pod-{i}", "ws", "m") for i in range(n)]
    r = VllmRouterCacheAware()
    r.setup(pods, [], random.Random(0))
    return r, [p.key for p in pods]


def _req(i: int, text: str) -> SimRequest:
    r = SimRequest(f"r{i}", 0.0, text, len(text) // 4, 8)
    prepare([r])
    return r


def test_cache_aware_sends_a_new_prefix_to_the_least_loaded_pod_not_the_smallest_tree() -> None:
    """As measured on vllm-router 0.1.17: an idle pod with a big tree wins over
    a busy pod with a small one."""
    f = TextFactory(3)
    rng = random.Random(3)
    r, (a, b) = _router()
    small = _req(0, f.text(rng, 64))
    assert r.pick(small, 0.0) == a  # all equal: the first pod
    big = _req(1, f.text(rng, 2048))
    assert r.pick(big, 0.0) == b  # a is busy with `small`
    r.on_finished(big, 1.0)
    assert r.prefix.blocks(b) > r.prefix.blocks(a)
    new = _req(2, f.text(rng, 256))
    assert r.pick(new, 1.0) == b  # a still busy: the idle pod, though its tree is larger


def test_cache_aware_ties_on_load_go_to_the_pod_sent_fewest_requests() -> None:
    f = TextFactory(4)
    rng = random.Random(4)
    r, (a, b) = _router()
    for i in range(3):
        req = _req(i, f.text(rng, 256))
        r.pick(req, 0.0)
        r.on_finished(req, 0.0)
    # loads are 0 and 0; a was sent 2 (requests 0 and 2), b 1
    assert (r.routed[a], r.routed[b]) == (2, 1)
    assert r.pick(_req(9, f.text(rng, 256)), 1.0) == b


def test_cache_aware_follows_a_prefix_and_yields_only_when_imbalanced() -> None:
    f = TextFactory(5)
    rng = random.Random(5)
    system = f.text(rng, 1024, unique=False)
    r, (a, b) = _router()
    first = r.pick(_req(0, system + f.text(rng, 128)), 0.0)
    # 64 more of the group: all follow the prefix (64 - 0 is not above the threshold)
    for i in range(1, 65):
        assert r.pick(_req(i, system + f.text(rng, 128)), 0.0) == first
    # 65 open there, 0 on the other: imbalanced, so the next one leaves
    other = b if first == a else a
    assert r.pick(_req(99, system + f.text(rng, 128)), 0.0) == other
