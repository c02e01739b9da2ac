"""The issue's first real-time trial, re-run: Kinference's services against
the real vllm-router binary on the same arrivals.

``python -m bench.routing.realtrial [--duration S] [--rate R] [--seed N[,N...]]
[--groups G[,G...]] [--routers A,B] [--log-dir DIR]`` (``make bench-realtrial``);
``--report FILE`` prints the tables of a results file again:

For each router under test, in turn:

1. four FRESH HTTP engine simulators (``kinference_simulators.vllm``, the
   fleet's vLLM V1 scheduler model, ``h100`` profile, 1,200 KV blocks each,
   cold caches, time scale 1: real time) on free ports of 127.0.0.1, so that
   every router meets the same engines in the same state;
2. the router in front of them:

   ``kinference``
       Kinference's own services as processes, as ``make run`` starts them
       (nats-server with a user per service, policy-compiler reading a
       manifest directory, classifier, telemetry-collector scraping the four
       simulators every 0.1 s, router), ports shifted by
       ``KINFERENCE_PORT_OFFSET`` (default 700). The four simulators are one
       worker set; the policy is one rule, ``select: [{type: Local,
       minimize: PredictedTTFT}]`` with ``tieBreak: [PrefixAffinity,
       LeastInFlight, Random]``.
   ``vllm_router_cache_aware`` / ``vllm_router_round_robin``
       the ``vllm-router`` binary (PyPI, in ``bench/.venv-competitors``,
       never a product dependency) with ``--policy cache_aware`` (its
       default thresholds) or ``--policy round_robin``. The simulators serve
       ``/tokenize``, so ``cache_aware`` really matches prefixes.
   ``kinference_envoy``
       the same services, the router also serving its Endpoint Picker, and
       a real Envoy in front (``make run-envoy``'s bootstrap): the client
       calls Envoy, the gateway path.
   ``kinference_3``
       the same services with three router replicas (replica sync over
       NATS, as deployed), the client sending request *i* to replica
       *i mod 3*: each replica sees a third of the traffic and learns the
       rest from its peers.
   ``direct_round_robin``
       no router: the client itself sends request *i* to simulator *i mod 4*.

3. the SAME arrivals (the ``trial`` workload of :mod:`.workloads`: 16
   groups of 2,000-token system prompts with 200-token questions, 32 output
   tokens, Poisson at ``--rate`` requests/s for ``--duration`` seconds, from
   ``--seed``) replayed as streaming ``/v1/completions`` at their times. The
   client measures TTFT (request sent to first streamed ``data:`` chunk) and
   end-to-end time (to the end of the stream); afterwards each simulator's
   ``/metrics`` gives prefix-cache queries and hits, preemptions and the
   requests it served.

For every (groups, seed) pair it prints a table (with the floor of its
arrivals, :func:`floors`: what no router can go below), the routers'
slowest 1% by where their delay came from (:func:`sources`), and at the end
one line per pair with the goal, judged also against the floor; writes
``bench/results/routing_realtrial.json`` (a ``runs`` list, one per pair,
each with a row per router keeping every request's TTFT, e2e, send time,
pod and cached tokens) and exits 1 when any request failed (or a router
could not be started). Every process it starts is stopped on the way out,
also on Ctrl-C and on errors.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import shutil
import signal
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import yaml

from bench import harness
from bench.router import COMPETITORS, ensure_competitors
from kinference_common.natsauth import LocalAuth
from kinference_common.natsserver import find_binary
from kinference_simulators.profiles import SpeedProfile, get_profile
from kinference_simulators.stack import Proc, Stack, StackError

from .crosscheck import _metric
from .fleet import NAMESPACE, PodSpec, prepare
from .floor import prefill_seconds
from .kinference import FASTEST_LOCAL, POOL, manifests
from .workloads import SimRequest, generate

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "bench" / "results" / "routing_realtrial.json"
PODS = 4
BLOCKS = 1200
#: the simulators' KV block, in tokens (only whole blocks of a prompt are cached)
BLOCK_TOKENS = 16
PROFILE = "h100"
RATE = 18.0
DURATION = 60.0
SEED = 7
GROUPS = 16
MODEL = "m"
OFFSET = 700
ROUTERS = ["kinference", "kinference_envoy", "kinference_3", "vllm_router_cache_aware", "vllm_router_round_robin",
           "direct_round_robin"]
#: the replicas of ``kinference_3``; replica k > 0 listens on the router and admin ports + 100 k
REPLICAS = 3
WORKER_SET = "trial"
#: the stack's ports before the offset: make run's bases (no two end in the same two digits)
STACK_PORTS = {"nats": 4222, "compiler": 8090, "classifier": 8083, "collector": 9091, "router": 8080, "admin": 8081}

#: the worker set, the fleet benchmark's policy and a pool, from the fleet
#: benchmark's own manifest generator (one worker set of the trial's pods)
MANIFESTS = manifests([PodSpec(f"pod-{i}", WORKER_SET, MODEL, PROFILE, BLOCKS, max_model_len=32768)
                       for i in range(PODS)], [], FASTEST_LOCAL)


def arrivals(seed: int = SEED, rate: float = RATE, duration: float = DURATION,
             groups: int = GROUPS) -> list[SimRequest]:
    """The trial's arrivals: the same list for the same seed, rate, duration
    and number of groups (16: the issue's trial, as it always was)."""
    if groups == GROUPS:
        return generate("trial", seed, rate, duration)
    return generate("trial", seed, rate, duration, groups=groups)


# ------------------------------------------------------------ measuring


def quantile(xs: Sequence[float], p: float) -> float | None:
    """Nearest-rank quantile (the fleet benchmark's): the smallest value with
    at least ``p`` of the values at or below it; None for no values."""
    if not xs:
        return None
    s = sorted(xs)
    # 1e-9: p * n computed as 9.000000000000002 for 0.9 * 10 still ranks 9th
    i = min(len(s) - 1, max(0, math.ceil(p * len(s) - 1e-9) - 1))
    return s[i]


@dataclass
class Outcome:
    """What the client saw of one request."""

    ttft: float | None = None
    e2e: float | None = None
    error: str | None = None
    #: seconds from the replay's start to the request's send
    sent: float | None = None
    #: the pod that answered (the simulators' ``system_fingerprint``)
    pod: str | None = None
    #: prompt tokens the pod found cached (``usage.prompt_tokens_details``)
    cached: int | None = None


def summarize(router: str, outcomes: Sequence[Outcome], engine: dict,
              reqs: Sequence[SimRequest] | None = None) -> dict:
    """One result row: client-side quantiles over the requests that streamed
    a first chunk, errors, and the engines' counters (``engine``: ``queries``,
    ``hits``, ``preemptions``, ``served`` per pod); with ``reqs``, also the
    TTFT p99 without each group's first request (the cold start every
    router pays: the rest of the tail is the routing's)."""
    ttft = [o.ttft for o in outcomes if o.ttft is not None]
    firsts = group_firsts(reqs) if reqs is not None else set()
    rest = [o.ttft for i, o in enumerate(outcomes) if o.ttft is not None and i not in firsts]
    e2e = [o.e2e for o in outcomes if o.e2e is not None and o.error is None]
    errors = [o.error for o in outcomes if o.error is not None]
    q = engine.get("queries", 0.0)
    return {
        "router": router, "requests": len(outcomes), "errors": len(errors), "error_samples": sorted(set(errors))[:5],
        "ttft_p50_s": quantile(ttft, 0.5), "ttft_p90_s": quantile(ttft, 0.9), "ttft_p99_s": quantile(ttft, 0.99),
        "ttft_p99_after_first_s": quantile(rest, 0.99) if reqs is not None else None,
        "e2e_p50_s": quantile(e2e, 0.5), "e2e_p99_s": quantile(e2e, 0.99),
        "prefix_hit_rate": engine.get("hits", 0.0) / q if q else None,
        "preemptions": int(engine.get("preemptions", 0)), "served_per_pod": [int(s) for s in engine.get("served", [])],
        # per request, in arrival order (None: no first chunk / failed), for a reader who wants other cuts
        "ttft_s": [o.ttft for o in outcomes], "e2e_s": [None if o.error else o.e2e for o in outcomes],
        "pod": [o.pod for o in outcomes], "cached_tokens": [o.cached for o in outcomes],
        "sent_s": [None if o.sent is None else round(o.sent, 6) for o in outcomes],
    }


def group_firsts(reqs: Sequence[SimRequest]) -> set[int]:
    """Indices of each group's first request (in arrival order)."""
    first_of: dict[int, int] = {}
    for i, r in enumerate(reqs):
        first_of.setdefault(r.group, i)
    return set(first_of.values())


@dataclass(frozen=True)
class Floor:
    """The least TTFT any router could give one request on the trial's arrivals."""

    ttft: float
    #: arrived while the longest prefix it shares with an earlier request
    #: could still be computing (its group's first, say): it waits for that
    #: or computes it too, where it would otherwise prefill only the rest
    early: bool = False


def _chunk_ends(speed: SpeedProfile, tokens: int) -> list[tuple[int, float]]:
    """Prefilling ``tokens`` uncached tokens on an idle pod, chunk by chunk
    (the step's token budget): each chunk's last token (counted from the
    first uncached one) and when its step ends, from the prefill's start."""
    out, done, at = [], 0, 0.0
    while done < tokens:
        chunk = min(tokens - done, speed.max_num_batched_tokens)
        done += chunk
        at += speed.step_seconds(chunk, 0, 0)
        out.append((done, at))
    return out


def floors(reqs: Sequence[SimRequest], profile: str = PROFILE) -> list[Floor]:
    """Per request, in arrival order, what no router can go below on these
    arrivals (at their scheduled times), from the simulators' own step
    model on idle pods (:func:`.floor.prefill_seconds`). A request can find
    cached at most the longest run of whole blocks it shares with earlier
    requests (its group's system prompt; all but the last block of a
    question asked before), and a block is cached at the earliest when the
    step that computes it ends in the earliest way its first request could
    have been served. So a request either prefills its whole prompt, or
    waits for the blocks it shares and prefills the rest, whichever ends
    sooner: a group's first prefills its whole prompt (every router's cold
    start), and a request sent while that runs waits for it or repeats it.
    Queueing behind other requests, evictions and the routers' own time only
    add to it, so a run's TTFT quantiles are at or above these floors' (up
    to the HTTP time the model leaves out, a few milliseconds)."""
    speed = get_profile(profile)
    prepare(reqs, BLOCK_TOKENS)
    ready: dict[bytes, float] = {}  # a block (chained hash: its whole prefix) -> when it can first be cached
    out: list[Floor] = []
    for r in reqs:
        hashes = r.engine_hashes or ()
        usable = (r.prompt_tokens - 1) // BLOCK_TOKENS  # never the block of the last token
        best, shared, waited, warmest = prefill_seconds(speed, r.prompt_tokens), 0, 0.0, float("inf")
        for k, h in enumerate(hashes[:usable], 1):
            at = ready.get(h)
            if at is None:
                break  # chained: no longer prefix is cached anywhere either
            rest = prefill_seconds(speed, r.prompt_tokens - k * BLOCK_TOKENS)
            warmest = min(warmest, rest)
            wait = max(0.0, at - r.time)
            if wait + rest < best:
                best, shared, waited = wait + rest, k, wait
        out.append(Floor(best, early=best > warmest + 1e-9))
        # the blocks this request computes, cached when their chunk's step ends
        start = r.time + waited
        ends = iter(_chunk_ends(speed, r.prompt_tokens - shared * BLOCK_TOKENS))
        last, end = next(ends)
        for k in range(shared + 1, len(hashes) + 1):
            while k * BLOCK_TOKENS - shared * BLOCK_TOKENS > last:
                last, end = next(ends)
            h = hashes[k - 1]
            ready[h] = min(ready.get(h, float("inf")), start + end)
    return out


def floor_row(reqs: Sequence[SimRequest]) -> dict:
    """The floors' quantiles, as a result row's (``router``: ``floor``), and
    how many requests arrived while a prefix they share was computing."""
    fl = floors(reqs)
    ttft = [f.ttft for f in fl]
    return {"router": "floor", "requests": len(reqs), "ttft_p50_s": quantile(ttft, 0.5),
            "ttft_p90_s": quantile(ttft, 0.9), "ttft_p99_s": quantile(ttft, 0.99), "early": sum(f.early for f in fl)}


def outcomes_of(row: dict) -> list[Outcome]:
    """A result row's per-request lists back as outcomes (for ``--report``)."""
    n = len(row["ttft_s"])
    cols = [row.get(k) or [None] * n for k in ("ttft_s", "e2e_s", "sent_s", "pod", "cached_tokens")]
    return [Outcome(ttft=t, e2e=e, error=None if t is not None else "no first chunk", sent=s, pod=p, cached=c)
            for t, e, s, p, c in zip(*cols, strict=True)]


# ------------------------------------------------------- where the tail comes from

#: a request found its group's system prompt cached when at least this share of it was
WARM_SHARE = 0.9
#: an early request (:class:`Floor`) counts as early when its TTFT is within this of
#: its floor (the HTTP hops and a router's own time); slower, its own cause is looked for
EARLY_SLACK = 0.02
#: why a request waited, in the order the tables show them
SOURCES = {
    "group_first": "its group's first request (cold for every router)",
    "early": "sent while a prefix it shares (its group's prompt) could still be computing, and as slow as that "
             "makes it under any router",
    "cold": "a later request of its group sent to a pod without the group's prompt cached",
    "behind_cold": "warm, but sent to a pod that was prefilling a cold prompt (sent before it, first token after)",
    "warm": "warm, with no cold prefill in flight on its pod",
    "unknown": "the answer said nothing of its pod or its cache",
}


def sources(reqs: Sequence[SimRequest], outcomes: Sequence[Outcome]) -> list[str | None]:
    """Each request's source of delay (a key of :data:`SOURCES`; None for a
    request without a first chunk), from what the client saw: arrival order,
    the pod that answered, the prompt tokens it found cached, send and first
    token times; ``early`` when the arrivals make it slow (:func:`floors`)
    and it took no more than :data:`EARLY_SLACK` beyond that."""
    firsts = group_firsts(reqs)
    fl = floors(reqs)
    cats: list[str | None] = []
    for i, (r, o) in enumerate(zip(reqs, outcomes, strict=True)):
        if o.ttft is None:
            cats.append(None)
        elif i in firsts:
            cats.append("group_first")
        elif fl[i].early and o.ttft <= fl[i].ttft + EARLY_SLACK:
            cats.append("early")
        elif o.cached is None or o.pod is None:
            cats.append("unknown")
        elif o.cached < WARM_SHARE * r.prefix_tokens:
            cats.append("cold")
        else:
            cats.append("warm")
    cold_on: dict[str, list[tuple[float, float]]] = {}
    for r, c, o in zip(reqs, cats, outcomes, strict=True):
        prefilled = c in ("group_first", "cold") or (
            c == "early" and o.cached is not None and o.cached < WARM_SHARE * r.prefix_tokens)
        if prefilled and o.pod is not None and o.sent is not None and o.ttft is not None:
            cold_on.setdefault(o.pod, []).append((o.sent, o.sent + o.ttft))
    for i, o in enumerate(outcomes):
        if cats[i] == "warm" and o.sent is not None and o.pod is not None:
            if any(start <= o.sent < first for start, first in cold_on.get(o.pod, ())):
                cats[i] = "behind_cold"
    return cats


def slowest(outcomes: Sequence[Outcome], share: float = 0.01) -> list[int]:
    """Indices of the requests ranked at or above the ``1 - share`` quantile
    of TTFT (the p99 for 0.01, nearest rank as :func:`quantile`: the p99
    request and every slower one; 9 of 800), slowest first."""
    done = [i for i, o in enumerate(outcomes) if o.ttft is not None]
    done.sort(key=lambda i: outcomes[i].ttft, reverse=True)  # type: ignore[arg-type, return-value]
    n = len(done)
    rank = min(n, max(1, math.ceil((1.0 - share) * n - 1e-9)))  # the quantile's rank, ascending
    return done[: n - rank + 1] if n else []


def attribute(reqs: Sequence[SimRequest], by_router: dict[str, list[Outcome]],
              subject: str = "kinference") -> dict:
    """Per router: its slowest 1% counted by :func:`sources`; and for
    ``subject``'s slowest 1%, what every other router made of the same
    requests (their TTFT p50 over them and their sources)."""
    cats = {name: sources(reqs, outs) for name, outs in by_router.items()}
    out: dict = {"routers": {}, "same_requests": {}}
    for name, outs in by_router.items():
        tail = slowest(outs)
        out["routers"][name] = {
            "tail": len(tail), "tail_min_ttft_s": outs[tail[-1]].ttft if tail else None,
            "sources": _count(cats[name][i] for i in tail),
            "all_sources": _count(cats[name]),
        }
    if subject in by_router:
        tail = slowest(by_router[subject])
        out["subject"], out["subject_tail"] = subject, tail
        for name, outs in by_router.items():
            if name == subject:
                continue
            ttfts = [outs[i].ttft for i in tail if outs[i].ttft is not None]
            out["same_requests"][name] = {
                "ttft_p50_s": quantile(ttfts, 0.5),  # type: ignore[arg-type]
                "sources": _count(cats[name][i] for i in tail),
                "also_in_its_tail": len(set(tail) & set(slowest(outs))),
            }
    return out


def _count(cats: Iterable[str | None]) -> dict[str, int]:
    counts = dict.fromkeys(SOURCES, 0)
    for c in cats:
        if c is not None:
            counts[c] += 1
    return counts


def tail_table(att: dict) -> str:
    """:func:`attribute`'s counts as a Markdown table and a line per router
    for the subject's slowest requests."""
    heads = {"group_first": "group's first", "early": "during its group's first",
             "cold": "cold on its pod", "behind_cold": "behind a cold prefill",
             "warm": "warm", "unknown": "unknown"}
    out = ["| router | slowest 1% | from TTFT ms | " + " | ".join(heads.values()) + " |",
           "|---|---:|---:|" + "---:|" * len(heads)]
    for name, r in att["routers"].items():
        out.append(f"| {name} | {r['tail']} | {_ms(r['tail_min_ttft_s'])} | "
                   + " | ".join(str(r["sources"][k]) for k in heads) + " |")
    subject = att.get("subject")
    for name, s in att["same_requests"].items():
        parts = ", ".join(f"{n} {heads[k]}" for k, n in s["sources"].items() if n)
        out.append(f"\n{subject}'s slowest {len(att['subject_tail'])} under {name}: TTFT p50 "
                   f"{_ms(s['ttft_p50_s'])} ms, {s['also_in_its_tail']} also in its own slowest 1%; {parts}")
    return "\n".join(out)


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1000:.0f}"


def table(rows: Sequence[dict], floor: dict | None = None) -> str:
    """The rows as a Markdown table (TTFT and e2e in milliseconds), and a
    last line with the floors' TTFT (:func:`floor_row`) when given."""
    out = ["| router | requests | TTFT p50 ms | p90 ms | p99 ms | e2e p99 ms | hit rate | preemptions | errors |",
           "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        hit = "-" if r["prefix_hit_rate"] is None else f"{r['prefix_hit_rate']:.3f}"
        out.append(f"| {r['router']} | {r['requests']} | {_ms(r['ttft_p50_s'])} | {_ms(r['ttft_p90_s'])} | "
                   f"{_ms(r['ttft_p99_s'])} | {_ms(r['e2e_p99_s'])} | {hit} | {r['preemptions']} | {r['errors']} |")
    if floor is not None:
        out.append(f"| floor | {floor['requests']} | {_ms(floor['ttft_p50_s'])} | {_ms(floor['ttft_p90_s'])} | "
                   f"{_ms(floor['ttft_p99_s'])} | - | - | - | - |")
        out.append(f"\nfloor: what no router can go below on these arrivals; {floor['early']} requests arrived "
                   "while a prefix they share could still be computing")
    return "\n".join(out)


async def replay(urls: Sequence[str], reqs: Sequence[SimRequest], timeout: float = 120.0) -> list[Outcome]:
    """Send each request at its arrival time (real seconds from the start) as a
    streaming ``/v1/completions`` to ``urls[i % len(urls)]``; never raises for
    a failed request, records it."""
    outcomes = [Outcome() for _ in reqs]
    conn = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=timeout)) as session:
        t0 = time.perf_counter()

        async def one(i: int) -> None:
            r, o = reqs[i], outcomes[i]
            delay = r.time - (time.perf_counter() - t0)
            if delay > 0:
                await asyncio.sleep(delay)
            body = {"model": r.model, "prompt": r.text, "max_tokens": r.output_len, "ignore_eos": True,
                    "stream": True, "stream_options": {"include_usage": True}}
            start = time.perf_counter()
            o.sent = start - t0
            try:
                async with session.post(urls[i % len(urls)], json=body) as resp:
                    if resp.status != 200:
                        o.error = f"HTTP {resp.status}"
                        await resp.read()
                        return
                    done = False
                    async for line in resp.content:
                        if not line.startswith(b"data:"):
                            continue
                        if o.ttft is None:
                            o.ttft = time.perf_counter() - start
                            _read_chunk(line, o)
                        if line.strip() == b"data: [DONE]":
                            done = True
                        elif b'"usage"' in line:
                            _read_chunk(line, o)
                    o.e2e = time.perf_counter() - start
                    if o.ttft is None:
                        o.error = "stream without data"
                    elif not done:
                        o.error = "stream ended without [DONE]"
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
                o.error = f"{type(exc).__name__}: {exc}"[:120]
        await asyncio.gather(*(one(i) for i in range(len(reqs))))
    return outcomes


def _read_chunk(line: bytes, o: Outcome) -> None:
    """The pod (``system_fingerprint``) and the cached prompt tokens (the
    usage chunk) of a streamed chunk, when it has them."""
    try:
        chunk = json.loads(line[5:])
    except ValueError:
        return
    if not isinstance(chunk, dict):
        return
    if isinstance(chunk.get("system_fingerprint"), str):
        o.pod = chunk["system_fingerprint"]
    details = (chunk.get("usage") or {}).get("prompt_tokens_details") or {}
    if isinstance(details.get("cached_tokens"), int):
        o.cached = details["cached_tokens"]


def engine_counters(ports: Sequence[int]) -> dict:
    """Prefix-cache queries and hits, preemptions and requests served, from
    each simulator's ``/metrics``."""
    served, queries, hits, preempted = [], 0.0, 0.0, 0.0
    for port in ports:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:  # noqa: S310 - localhost
            page = r.read().decode()
        served.append(_metric(page, "vllm:request_success_total"))
        queries += _metric(page, "vllm:prefix_cache_queries_total")
        hits += _metric(page, "vllm:prefix_cache_hits_total")
        preempted += _metric(page, "vllm:num_preemptions_total")
    return {"served": served, "queries": queries, "hits": hits, "preemptions": preempted}


# ------------------------------------------------------------ processes


def start_simulators(log_dir: Path, tag: str) -> tuple[list[harness.Process], list[int]]:
    procs: list[harness.Process] = []
    try:
        ports = [harness.free_port() for _ in range(PODS)]
        for i, port in enumerate(ports):
            procs.append(harness.spawn(f"{tag}-sim-{i}", [
                sys.executable, "-m", "kinference_simulators.vllm", "--host", "127.0.0.1", "--port", str(port),
                "--model", MODEL, "--speed-profile", PROFILE, "--kv-blocks", str(BLOCKS), "--time-scale", "1",
                "--pod-name", f"pod-{i}", "--seed", str(100 + i), "--log-level", "warning",
                # what the tail attribution reads: who answered, what was cached
                "--system-fingerprint", f"pod-{i}", "--enable-prompt-tokens-details"], log_dir))
        for i, port in enumerate(ports):
            harness.wait_http(f"http://127.0.0.1:{port}/health", 60, procs[i].proc, f"sim-{i}")
    except BaseException:
        for p in reversed(procs):
            p.stop()
        raise
    return procs, ports


@dataclass
class TrialStack(Stack):
    """Kinference's services as ``make run`` starts them (nats-server with a
    user per service, compiler, classifier, collector, router), for the trial's
    one pool over simulators started elsewhere (``sim_ports``)."""

    sim_ports: list[int] = field(default_factory=list)
    #: router replicas (``kinference_3``: three)
    routers: int = 1

    def router_port(self, k: int, which: str = "router") -> int:
        """Replica ``k``'s data (``router``) or ``admin`` port."""
        return self.port(STACK_PORTS[which] + 100 * k)

    def prepare(self) -> None:
        if self.run_dir.exists():
            shutil.rmtree(self.run_dir)
        (self.run_dir / "logs").mkdir(parents=True)
        (self.run_dir / "manifests").mkdir()
        (self.run_dir / "manifests" / "trial.yaml").write_text(MANIFESTS)
        endpoints = [{"namespace": NAMESPACE, "workerSet": WORKER_SET, "pod": f"pod-{i}",
                      "address": f"127.0.0.1:{port}", "model": MODEL, "ready": True}
                     for i, port in enumerate(self.sim_ports)]
        (self.run_dir / "endpoints.yaml").write_text(yaml.safe_dump({"endpoints": endpoints}, sort_keys=False))

    def _ports(self) -> list[int]:
        from kinference_simulators.stack import ENVOY_PORTS

        extra = [self.router_port(k, w) for k in range(1, self.routers) for w in ("router", "admin")]
        return [self.port(p) for p in (STACK_PORTS | (ENVOY_PORTS if self.envoy else {})).values()] + extra

    def pool_endpoints(self) -> list[str]:
        return [f"127.0.0.1:{p}" for p in self.sim_ports]

    def plan(self, speed_profile: str, time_scale: float) -> list[Proc]:  # noqa: ARG002 - no simulators here
        py, port = sys.executable, self.port
        nats_url = f"nats://127.0.0.1:{port(STACK_PORTS['nats'])}"
        nats_bin = find_binary()
        if nats_bin is None:
            raise StackError("realtrial: nats-server not found; run `make install` first")
        auth = LocalAuth(self.run_dir / "nats-auth")
        conf = auth.server_config(f"127.0.0.1:{port(STACK_PORTS['nats'])}", str(self.run_dir / "nats"))
        return [
            Proc("nats-server", [nats_bin, "-c", str(conf)], ready_port=port(STACK_PORTS["nats"])),
            Proc("policy-compiler", [py, "-m", "kinference_policy_compiler", "--manifests",
                                     str(self.run_dir / "manifests"), "--status-dir", str(self.run_dir / "status"),
                                     "--nats-url", nats_url, *auth.flags("policy-compiler"),
                                     "--http-port", str(port(STACK_PORTS["compiler"])), "--log-format", "json"],
                 ready_url=f"http://127.0.0.1:{port(STACK_PORTS['compiler'])}/readyz"),
            Proc("classifier", [py, "-m", "kinference_classifier", "--nats-url", nats_url, *auth.flags("classifier"),
                                "--health-host", "127.0.0.1", "--health-port", str(port(STACK_PORTS["classifier"])),
                                "--log-format", "json"],
                 ready_url=f"http://127.0.0.1:{port(STACK_PORTS['classifier'])}/readyz"),
            Proc("telemetry-collector", [
                py, "-m", "kinference_collector", "--nats-url", nats_url, *auth.flags("telemetry-collector"),
                "--endpoints-file", str(self.run_dir / "endpoints.yaml"), "--http-host", "127.0.0.1",
                "--http-port", str(port(STACK_PORTS["collector"])), "--log-format", "json"],
                ready_url=f"http://127.0.0.1:{port(STACK_PORTS['collector'])}/healthz"),
            *(Proc("router" if k == 0 else f"router-{k}", [
                py, "-m", "kinference_router", "--pool", f"{NAMESPACE}/{POOL}", "--nats-url", nats_url,
                *auth.flags("router"), "--host", "127.0.0.1", "--port", str(self.router_port(k)),
                "--admin-port", str(self.router_port(k, "admin")), "--auth", "none", "--log-format", "json",
                "--log-level", "warning", *(self._gateway_flags() if k == 0 else [])],
                ready_url=f"http://127.0.0.1:{self.router_port(k)}/readyz") for k in range(self.routers)),
            *([self._envoy_proc()] if self.envoy else []),
        ]


async def wait_for_endpoints(admin_port: int, pods: int, timeout: float = 60.0) -> None:
    """Until the router's live snapshot routes to a local pod and knows all
    ``pods`` endpoints (explain on the admin port: nothing is sent)."""
    deadline = time.monotonic() + timeout
    body = {"model": MODEL, "prompt": "warm-up probe", "max_tokens": 1}
    last = None
    async with aiohttp.ClientSession() as http:
        while time.monotonic() < deadline:
            try:
                async with http.post(f"http://127.0.0.1:{admin_port}/debug/explain", json=body) as r:
                    last = await r.text()
                    trace = json.loads(last) if r.status == 200 else {}
            except (aiohttp.ClientError, ValueError):
                trace = {}
            outcome = trace.get("outcome", {})
            seen = {f"pod-{i}" for i in range(pods) if f"pod-{i}" in (last or "")}
            if outcome.get("type") == "Routed" and str(outcome.get("backend", "")).startswith("Local/") \
                    and len(seen) == pods:
                return
            await asyncio.sleep(0.2)
    raise RuntimeError(f"the Kinference router did not see {pods} ready endpoints within {timeout:.0f}s "
                       f"(last explain: {(last or '')[:300]})")


async def _kinference(reqs: Sequence[SimRequest], sim_ports: list[int], log_dir: Path, offset: int,
                      envoy: bool = False, routers: int = 1) -> list[Outcome]:
    from kinference_simulators.stack import ENVOY_PORTS

    name = "stack-envoy" if envoy else "stack" if routers == 1 else f"stack-{routers}"
    stack = TrialStack(log_dir / name, offset, sim_ports=sim_ports, envoy=envoy, routers=routers)
    stack.prepare()
    await stack.start(PROFILE, 1.0, timeout=90)
    try:
        for k in range(routers):
            await wait_for_endpoints(stack.router_port(k, "admin"), len(sim_ports))
        if envoy:
            urls = [f"http://127.0.0.1:{stack.port(ENVOY_PORTS['envoy'])}/v1/completions"]
        else:
            urls = [f"http://127.0.0.1:{stack.router_port(k)}/v1/completions" for k in range(routers)]
        return await replay(urls, reqs)
    finally:
        await stack.stop()


def run_router(router: str, reqs: Sequence[SimRequest], log_dir: Path, offset: int) -> tuple[dict, list[Outcome]]:
    """Fresh simulators, ``router`` in front of them, the arrivals replayed:
    one result row and the client's outcomes. Every process started here is
    stopped before it returns."""
    sims, ports = start_simulators(log_dir, router)
    front: harness.Process | None = None
    try:
        if router in ("kinference", "kinference_envoy", "kinference_3"):
            outcomes = asyncio.run(_kinference(reqs, ports, log_dir, offset, envoy=router == "kinference_envoy",
                                               routers=REPLICAS if router == "kinference_3" else 1))
        elif router.startswith("vllm_router_"):
            policy = router.removeprefix("vllm_router_")
            rport = harness.free_port()
            front = harness.spawn(f"{router}-router", [
                str(COMPETITORS / "bin" / "vllm-router"), "--worker-urls", *[f"http://127.0.0.1:{p}" for p in ports],
                "--policy", policy, "--host", "127.0.0.1", "--port", str(rport),
                "--prometheus-port", str(harness.free_port()), "--worker-startup-check-interval", "1",
                "--log-level", "warning"], log_dir)
            harness.wait_http(f"http://127.0.0.1:{rport}/health", 60, front.proc, "vllm-router")
            outcomes = asyncio.run(replay([f"http://127.0.0.1:{rport}/v1/completions"], reqs))
        elif router == "direct_round_robin":
            outcomes = asyncio.run(replay([f"http://127.0.0.1:{p}/v1/completions" for p in ports], reqs))
        else:
            raise ValueError(f"unknown router {router!r}; known: {', '.join(ROUTERS)}")
        return summarize(router, outcomes, engine_counters(ports), reqs), outcomes
    finally:
        if front is not None:
            front.stop()
        for p in reversed(sims):
            p.stop()


def _routers(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in ROUTERS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"unknown router(s) {', '.join(unknown) or '(none)'}; "
                                         f"known: {', '.join(ROUTERS)}")
    return names


def _positive(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not v > 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {text}")
    return v


def _terminate(signum: int, frame: object) -> None:  # noqa: ARG001
    raise KeyboardInterrupt  # SIGTERM unwinds like Ctrl-C: every finally stops its processes


def _ints(text: str) -> list[int]:
    """A comma-separated list of positive integers (``--seed 1,2,3``)."""
    try:
        vals = [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of integers: {text!r}") from None
    if not vals or any(v < 1 for v in vals):
        raise argparse.ArgumentTypeError(f"need one or more positive integers, got {text!r}")
    return vals


#: how close to the floor's p99 counts as at the floor (the fleet benchmark's
#: "1.05x the idle floor"; here it also covers the HTTP time the model leaves out)
FLOOR_SLACK = 1.05


def goal(rows: Sequence[dict], subject: str = "kinference", floor: dict | None = None) -> dict | None:
    """The issue's goal on one run: ``subject``'s TTFT p99 at most 0.8x the
    best vllm-router policy's and its p50 no worse than the best p50 of
    those policies; None without both. With ``floor`` (:func:`floor_row`),
    also where the goal stands against it: ``reachable`` when 0.8x the best
    peer's p99 is at or above the floors' p99 (else no router could meet it
    on these arrivals), and ``met_at_floor`` when the p99 is at most the
    larger of 0.8x the best peer's and :data:`FLOOR_SLACK` times the
    floors' (the p50 as before)."""
    mine = next((r for r in rows if r["router"] == subject and r["ttft_p99_s"] is not None), None)
    peers = [r for r in rows if r["router"].startswith("vllm_router_") and r["ttft_p99_s"] is not None]
    if mine is None or not peers:
        return None
    best = min(peers, key=lambda r: r["ttft_p99_s"])
    best_p50 = min(r["ttft_p50_s"] for r in peers)
    p99, p50 = mine["ttft_p99_s"] / best["ttft_p99_s"], mine["ttft_p50_s"] / best_p50
    out = {"best_peer": best["router"], "p99_ratio": round(p99, 3), "p50_ratio": round(p50, 3),
           "met": p99 <= 0.8 and p50 <= 1.0}
    if floor is not None and floor.get("ttft_p99_s"):
        target = 0.8 * best["ttft_p99_s"]
        least = floor["ttft_p99_s"]
        out |= {"floor_p99_s": least, "p99_over_floor": round(mine["ttft_p99_s"] / least, 3),
                "reachable": target >= least,
                "met_at_floor": mine["ttft_p99_s"] <= max(target, FLOOR_SLACK * least) and p50 <= 1.0}
    # the same without each group's first request, against the peer best at that
    rest = [r for r in peers if r.get("ttft_p99_after_first_s") is not None]
    if mine.get("ttft_p99_after_first_s") is not None and rest:
        best_rest = min(rest, key=lambda r: r["ttft_p99_after_first_s"])
        ratio = mine["ttft_p99_after_first_s"] / best_rest["ttft_p99_after_first_s"]
        out |= {"best_peer_after_first": best_rest["router"], "p99_after_first_ratio": round(ratio, 3),
                "met_after_first": ratio <= 0.8 and p50 <= 1.0}
    return out


def sweep_table(runs: Sequence[dict]) -> str:
    """One line per (groups, seed): each router's TTFT p50/p99 and the goal
    (``kinference``'s, or ``kinference_3``'s in a run without one replica)."""
    routers = list(dict.fromkeys(r["router"] for run in runs for r in run["rows"]))
    out = ["| groups | seed | " + " | ".join(f"{r} p50 / p99 / p99 without firsts, ms" for r in routers)
           + " | floor p99 ms | p99 / best peer | goal | without firsts / best peer | goal | p99 / floor | "
           "at the floor |",
           "|---:|---:|" + "---:|" * len(routers) + "---:|---:|---|---:|---|---:|---|"]
    for run in runs:
        by = {r["router"]: r for r in run["rows"]}
        cells = [f"{_ms(by[r]['ttft_p50_s'])} / {_ms(by[r]['ttft_p99_s'])} / "
                 f"{_ms(by[r].get('ttft_p99_after_first_s'))}" if r in by else "-" for r in routers]
        g = run.get("goal") or run.get("goal_3") or {}  # one replica's, else three replicas'

        def verdict(ratio: str, peer: str, met: str) -> str:
            if ratio not in g:
                return "- | -"
            why = "met" if g[met] else "missed" if g[ratio] > 0.8 else f"missed (p50 {g['p50_ratio']:.2f}x)"
            return f"{g[ratio]:.2f}x {g[peer]} | {why}"

        if "met_at_floor" in g:
            at_floor = f"{g['p99_over_floor']:.2f}x | " + ("met" if g["met_at_floor"] else "missed") + (
                "" if g["reachable"] else " (0.8x the best peer is under the floor)")
        else:
            at_floor = "- | -"
        out.append(f"| {run['groups']} | {run['seed']} | " + " | ".join(cells) + " | "
                   + _ms((run.get("floor") or {}).get("ttft_p99_s")) + " | "
                   + verdict("p99_ratio", "best_peer", "met") + " | "
                   + verdict("p99_after_first_ratio", "best_peer_after_first", "met_after_first") + " | "
                   + at_floor + " |")
    return "\n".join(out)


def worst_lines(runs: Sequence[dict], field: str = "goal", who: str = "") -> list[str]:
    """The worst ratio over the runs, and on how many the goal was met
    (``field``: ``goal`` for ``kinference``, ``goal_3`` for ``kinference_3``)."""
    out = []
    for key, met, what in (("p99_ratio", "met", "p99"),
                           ("p99_after_first_ratio", "met_after_first", "p99 without each group's first")):
        goals = [run[field] for run in runs if run.get(field) and key in run[field]]
        if goals:
            out.append(f"{who}{what} against the best vllm-router policy: worst {max(g[key] for g in goals):.2f}x; "
                       f"goal (<= 0.80x, p50 no worse) met on {sum(g[met] for g in goals)} of {len(goals)} runs")
    goals = [run[field] for run in runs if run.get(field) and "met_at_floor" in run[field]]
    if goals:
        under = sum(not g["reachable"] for g in goals)
        out.append(f"{who}p99 at most the larger of 0.80x the best peer's and {FLOOR_SLACK:g}x the floor's (p50 no "
                   f"worse): met on {sum(g['met_at_floor'] for g in goals)} of {len(goals)} runs; 0.80x the best "
                   f"peer's p99 is under the floor's on {under} of them (no router could meet it there)")
    return out


def all_worst_lines(runs: Sequence[dict]) -> list[str]:
    return worst_lines(runs) + worst_lines(runs, "goal_3", "kinference_3 (three replicas): ")


def report(path: Path) -> int:
    """``--report``: every run's tables and the sweep's, from a results file
    (the arrivals are generated again from its seeds, rate and duration)."""
    try:
        data = json.loads(path.read_text())
        setup, runs = data["setup"], data["runs"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        print(f"realtrial: cannot read {path} as a results file: {exc}", file=sys.stderr)
        return 1
    for run in runs:
        reqs = arrivals(run["seed"], setup["rate"], setup["duration_s"], run["groups"])
        run["floor"] = floor_row(reqs)  # as this version computes them
        run["goal"] = goal(run["rows"], floor=run["floor"])  # and judges it
        run["goal_3"] = goal(run["rows"], "kinference_3", run["floor"])
        outcomes = {row["router"]: outcomes_of(row) for row in run["rows"]}
        if any(len(o) != len(reqs) for o in outcomes.values()):
            print(f"realtrial: {path}: groups {run['groups']}, seed {run['seed']} does not match its arrivals",
                  file=sys.stderr)
            return 1
        print(f"groups {run['groups']}, seed {run['seed']}: {len(reqs)} requests\n")
        print(table(run["rows"], run["floor"]))
        print()
        print(tail_table(attribute(reqs, outcomes)))
        print()
    print(sweep_table(runs))
    print()
    for line in all_worst_lines(runs):
        print(line)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.routing.realtrial", description=__doc__.split("\n\n")[0])
    ap.add_argument("--duration", type=_positive, default=DURATION, help="seconds of arrivals (default %(default)s)")
    ap.add_argument("--rate", type=_positive, default=RATE, help="requests per second (default %(default)s)")
    ap.add_argument("--seed", type=_ints, default=[SEED],
                    help=f"workload seed, or a comma-separated list to run each (default {SEED})")
    ap.add_argument("--groups", type=_ints, default=[GROUPS],
                    help=f"system-prompt groups, or a comma-separated list (default {GROUPS})")
    ap.add_argument("--routers", type=_routers, default=ROUTERS,
                    help=f"comma-separated, in the order run (default {','.join(ROUTERS)})")
    ap.add_argument("--port-offset", type=int, default=int(os.environ.get("KINFERENCE_PORT_OFFSET", OFFSET)),
                    help="added to the Kinference stack's ports (env KINFERENCE_PORT_OFFSET, default 700)")
    ap.add_argument("--out", type=Path, default=RESULTS, help="the JSON results file (default %(default)s)")
    ap.add_argument("--log-dir", type=Path, help="keep every process's log here (default: a temporary directory)")
    ap.add_argument("--report", type=Path, metavar="JSON",
                    help="run nothing: print the tables of a results file this command wrote")
    args = ap.parse_args(argv)
    if args.report is not None:
        return report(args.report)
    signal.signal(signal.SIGTERM, _terminate)
    if any(r.startswith("vllm_router_") for r in args.routers):
        why = ensure_competitors()
        if why is not None:
            print(f"realtrial not run: {why}", file=sys.stderr)
            return 1
    runs: list[dict] = []
    failed: list[str] = []
    errors = False
    with tempfile.TemporaryDirectory(prefix="routing-realtrial-") as tmp:
        log_root = args.log_dir or Path(tmp)
        for groups in args.groups:
            for seed in args.seed:
                reqs = arrivals(seed, args.rate, args.duration, groups)
                print(f"real-time trial: {len(reqs)} requests over {args.duration:g} s ({args.rate:g}/s, seed "
                      f"{seed}, {groups} groups), {PODS} x {PROFILE} simulators with {BLOCKS} KV blocks, "
                      "fresh for each router", flush=True)
                rows: list[dict] = []
                outcomes: dict[str, list[Outcome]] = {}
                log_dir = log_root if len(args.groups) == len(args.seed) == 1 else log_root / f"g{groups}-s{seed}"
                for router in args.routers:
                    started = time.monotonic()
                    try:
                        row, outcomes[router] = run_router(router, reqs, log_dir / router, args.port_offset)
                    except KeyboardInterrupt:
                        print(f"interrupted during {router}: every process it started is stopped; nothing written",
                              file=sys.stderr, flush=True)
                        return 130
                    except (RuntimeError, StackError, OSError) as exc:
                        print(f"  {router}: could not run: {exc}", file=sys.stderr, flush=True)
                        failed.append(f"{router} (groups {groups}, seed {seed})")
                        continue
                    rows.append(row)
                    print(f"  {router}: {row['requests']} requests, {row['errors']} errors, TTFT p50/p99 "
                          f"{_ms(row['ttft_p50_s'])}/{_ms(row['ttft_p99_s'])} ms "
                          f"({time.monotonic() - started:.0f} s)", flush=True)
                att = attribute(reqs, outcomes)
                fl = floor_row(reqs)
                print()
                print(table(rows, fl))
                print()
                print(tail_table(att))
                print()
                for r in rows:
                    if r["errors"]:
                        errors = True
                        print(f"{r['router']}: {r['errors']} failed requests, e.g. {r['error_samples']}")
                runs.append({"groups": groups, "seed": seed, "requests": len(reqs), "rows": rows,
                             "tail": {k: v for k, v in att.items() if k != "subject_tail"}, "floor": fl,
                             "goal": goal(rows, floor=fl), "goal_3": goal(rows, "kinference_3", fl)})
    print(sweep_table(runs))
    print()
    for line in all_worst_lines(runs):
        print(line)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({
        "setup": {"pods": PODS, "profile": PROFILE, "kv_blocks": BLOCKS, "rate": args.rate,
                  "duration_s": args.duration, "seeds": args.seed, "groups": args.groups, "workload": "trial",
                  "time_scale": 1.0, "warm_share": WARM_SHARE, "sources": SOURCES,
                  "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())},
        "runs": runs, "not_run": failed}, indent=1) + "\n")
    print(f"wrote {args.out.relative_to(REPO) if args.out.is_relative_to(REPO) else args.out}")
    return 1 if failed or errors else 0


if __name__ == "__main__":
    raise SystemExit(main())
