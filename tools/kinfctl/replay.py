"""``kinfctl replay POLICY.yaml --pool NS/NAME``: had this policy been live,
what would have happened?

Every recorded decision of the pool (the routers
record them; see the operations guide) is taken again with the candidate
policy, on the snapshot it was taken on, and what changes is printed:
requests whose backend type, worker set or provider would change, the burst
share (routed to a provider) before and after, refused requests, PII-tagged
requests that would leave the cluster (shouted; exit code 1), the predicted
TTFT and the provider tokens against what was recorded, per rule.

First every decision is taken again with the policy that was live (the
recorded compiled pool): "N of N decisions reproduced" says the replay is
exact, or which decisions could not be reproduced and why (a snapshot not
recorded, a random tie drawn otherwise).

The candidate is compiled as the policy-compiler compiles it: an
InferencePolicy alone is compiled against the recorded pool (its
destinations and model names); a file that also holds the InferencePool
(and what it names) is compiled whole, and that pool is used.

A replay is open-loop: each decision is taken again on the state the live
policy produced (queues, in-flight requests, prefix caches); requests the
candidate moves would themselves have changed that state a little.

``--export FILE`` writes the pool's records (one JSON object a line) instead
of replaying; ``--file FILE`` replays from such a file, offline.
"""

from __future__ import annotations

import argparse
import itertools
import random
import sys
from collections import OrderedDict, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from kinference_common.classifiers import BUILTIN_CLASSIFIERS
from kinference_common.compiled import CompiledPolicy, CompiledPool
from kinference_common.compiler import compile_documents
from kinference_common.compiler.policy import PoolContext, compile_policy
from kinference_common.engine import Decision, Request, Snapshot, decide, interpret
from kinference_common.engine.lazy import outcome_key, tag_classes
from kinference_common.engine.ledger import EndpointLoad
from kinference_common.engine.ttft import TTFTModel
from kinference_common.manifests import load_paths
from kinference_common.recording import (
    IDLE_CHARGE_BEFORE,
    CONTINUATION_SINCE,
    RELIEF_SINCE,
    LOAD_FIELDS,
    PEER_THETA_SINCE,
    SECOND_RECORDS,
    SPREAD_SINCE,
    UNQUEUED_SINCE,
    DecisionRecord,
    ObservationRecord,
    Record,
    SnapshotRecord,
)
from kinfctl import records as rec_io
from kinfctl.audit import PII_TAGS
from kinfctl.main import EXIT_OK, CommandError, split_pool
from kinfctl.output import print_json, table

EXIT_PII_LEAVES = 1
#: changed decisions listed in text output
SHOWN = 10


def register(sub: Any) -> None:
    p = sub.add_parser("replay", help="what a policy would have done with the recorded traffic of a pool",
                       description=__doc__.split("\n\n", 1)[1] if __doc__ else None,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("policy", nargs="?", type=Path, metavar="POLICY.yaml",
                   help="the candidate InferencePolicy (or a directory or file with the pool's manifests)")
    p.add_argument("--pool", metavar="NS/NAME", required=True, help="the pool whose recorded traffic is replayed")
    rec_io.add_source_arguments(p, file_help="replay from this file (written by --export) instead of NATS")
    p.add_argument("--export", type=Path, metavar="FILE",
                   help="write the pool's records of --since to FILE (- for stdout), one JSON object a line, "
                        "and do not replay")
    p.add_argument("-o", "--output", choices=["text", "json"], default="text", help="output format (default text)")
    p.set_defaults(run=run)


# ------------------------------------------------------------ the state


def _model(r: SnapshotRecord, model: TTFTModel) -> TTFTModel:
    """The PredictedTTFT model ``model`` (as recorded) as the router that
    wrote ``r`` used it: a router from before the spread (schema before
    SPREAD_SINCE) had none, and one from before PEER_THETA_SINCE gave each
    endpoint its own Theta, one from before UNQUEUED_SINCE charged a
    copy less on idle endpoints only, one from before RELIEF_SINCE
    charged a busy holder's copies in full, and one from before
    CONTINUATION_SINCE charged a conversation's next turn as any copy."""
    if r.v < SPREAD_SINCE and model.spread_fraction:
        model = msgspec.structs.replace(model, spread_fraction=0.0)
    if r.v < PEER_THETA_SINCE and model.peer_prefill_rate:
        model = msgspec.structs.replace(model, peer_prefill_rate=False)
    if r.v < UNQUEUED_SINCE and model.unqueued_running:
        model = msgspec.structs.replace(model, unqueued_running=False, prefix_stickiness_unqueued=IDLE_CHARGE_BEFORE)
    if r.v < RELIEF_SINCE and model.stickiness_relief != 1.0:
        model = msgspec.structs.replace(model, stickiness_relief=1.0)
    if r.v < CONTINUATION_SINCE and (model.continuation_stickiness != 1.0 or model.continuation_unqueued != 1.0):
        model = msgspec.structs.replace(model, continuation_stickiness=1.0, continuation_unqueued=1.0)
    return model


def _endpoint_key(s: Any) -> str:
    return f"{s.namespace}/{s.worker_set}/{s.pod}"


def _provider_key(s: Any) -> str:
    return f"{s.namespace}/{s.name}"


@dataclass
class _State:
    record: SnapshotRecord
    pool: CompiledPool
    endpoints: dict[str, Any]
    providers: dict[str, Any]
    ttft_model: TTFTModel


class Snapshots:
    """The recorded snapshots, rebuilt from keyframes and deltas; each
    engine :class:`Snapshot` built on first use (a few kept)."""

    def __init__(self, keep: int = 64) -> None:
        self.states: dict[tuple[str, int], _State] = {}
        #: (router, version) -> why it cannot be rebuilt
        self.missing: dict[tuple[str, int], str] = {}
        self._built: OrderedDict[tuple[str, int, str], Snapshot] = OrderedDict()
        self._keep = keep

    def add(self, r: SnapshotRecord) -> None:
        key = (r.router, r.version)
        if r.base is None:
            if r.compiled is None:
                self.missing[key] = "its keyframe holds no compiled pool"
                return
            self.states[key] = _State(r, r.compiled, {_endpoint_key(e): e for e in r.endpoints},
                                      {_provider_key(p): p for p in r.providers}, r.ttft_model or TTFTModel())
            return
        base = self.states.get((r.router, r.base))
        if base is None:
            self.missing[key] = (self.missing.get((r.router, r.base))
                                 or "the snapshot it is a delta of was not recorded (before --since, or past "
                                    "the stream's limits)")
            return
        eps = dict(base.endpoints)
        for k in r.endpoints_gone:
            eps.pop(k, None)
        eps.update((_endpoint_key(e), e) for e in r.endpoints)
        prs = dict(base.providers)
        for k in r.providers_gone:
            prs.pop(k, None)
        prs.update((_provider_key(p), p) for p in r.providers)
        pool = r.compiled if r.compiled is not None else base.pool
        self.states[key] = _State(r, pool, eps, prs, r.ttft_model or base.ttft_model)

    def why_missing(self, router: str, version: int) -> str:
        return self.missing.get((router, version), "its snapshot was not recorded (before --since, or past the "
                                                   "stream's limits)")

    def get(self, router: str, version: int, policy: str, pool: CompiledPool | None = None) -> Snapshot | None:
        """The engine snapshot of a recorded version: with its recorded pool
        (``policy`` "live"), or with ``pool`` in its place."""
        key = (router, version, policy)
        snap = self._built.get(key)
        if snap is not None:
            self._built.move_to_end(key)
            return snap
        st = self.states.get((router, version))
        if st is None:
            return None
        r = st.record
        snap = Snapshot(pool or st.pool, st.endpoints.values(), st.providers.values(), now=r.now,
                        stale_after=r.stale_after, provider_stale_after=r.provider_stale_after,
                        ejected=frozenset(r.ejected), ttft_model=_model(r, st.ttft_model))
        self._built[key] = snap
        if len(self._built) > self._keep:
            self._built.popitem(last=False)
        return snap

    def pool_of(self, router: str, version: int) -> CompiledPool | None:
        st = self.states.get((router, version))
        return st.pool if st is not None else None


class _Ledger:
    """The recorded in-flight loads, as the engine reads a ledger."""

    def __init__(self, loads: dict[str, list[int]]) -> None:
        self.loads: dict[str, EndpointLoad] = {}
        for key, values in loads.items():
            load = EndpointLoad()
            for name, v in zip(LOAD_FIELDS, values):
                setattr(load, name, v)
            self.loads[key] = load


class _Prefix:
    """The recorded prefix matches, as the engine reads a prefix index (what
    the live decision did not read is unknown: no blocks held, nothing hot)."""

    def __init__(self, matches: dict[str, int], held: dict[str, int], pressure: dict[str, float],
                 hot: dict[str, float] | None = None, continued: dict[str, bool] | None = None) -> None:
        self._matches, self._held, self._pressure = matches, held, pressure
        self._hot = hot or {}
        self._continued = continued or {}

    def continued_on(self, keys: list[str], block_hash: int) -> list[str]:
        get = self._continued.get
        return [k for k in keys if get(k, False)]

    def match(self, block_hashes: Any) -> dict[str, int]:
        return dict(self._matches)

    def blocks(self, key: str) -> int:
        return self._held.get(key, 0)

    def blocks_of(self, keys: list[str]) -> list[int]:
        get = self._held.get
        return [get(k, 0) for k in keys]

    def pressure(self) -> dict[str, float]:
        return self._pressure

    def hot_fractions(self, keys: list[str]) -> list[float]:
        get = self._hot.get
        return [get(k, 0.0) for k in keys]


class ReplayRandom(random.Random):
    """``tieBreak: Random`` drawing what the live decision drew; a draw that
    does not fit (another number of tied candidates) comes from a source
    seeded with the decision id and is counted in ``unfit``."""

    def __init__(self, draws: Iterable[tuple[int, int]], seed: str) -> None:
        super().__init__(seed)
        self.draws = list(draws)
        self.pos = 0
        self.unfit = 0

    def randrange(self, start: int, stop: int | None = None, step: int = 1) -> int:  # type: ignore[override]
        if stop is None and self.pos < len(self.draws) and self.draws[self.pos][0] == start:
            self.pos += 1
            return self.draws[self.pos - 1][1]
        self.pos += 1
        self.unfit += 1
        return super().randrange(start, stop, step)


def engine_request(r: DecisionRecord, extra_tags: Iterable[str] = ()) -> Request:
    q = r.request
    return Request(model=q.model, requested_model=q.requested_model, tenant=q.tenant, objective=q.objective,
                   priority=q.priority, prompt_tokens=q.prompt_tokens, max_tokens=q.max_tokens,
                   context_tokens=q.context_tokens,
                   headers=dict(q.headers), tags=frozenset(q.tags) | frozenset(extra_tags),
                   block_hashes=tuple(q.block_hashes))


def _asked(r: DecisionRecord) -> set[str]:
    return {c.name for c in r.classifiers if c.outcome != "skipped"}


def _skipped(r: DecisionRecord) -> list[str]:
    return [c.name for c in r.classifiers if c.outcome == "skipped" and c.name in BUILTIN_CLASSIFIERS]


def _decide(snap: Snapshot, r: DecisionRecord, req: Request) -> tuple[Decision, ReplayRandom]:
    rng = ReplayRandom(r.draws, r.decision_id)
    prefix = _Prefix(r.matches, r.held, r.pressure, r.hot, r.continued)
    d = decide(snap, req, ledger=_Ledger(r.loads), prefix=prefix,  # type: ignore[arg-type]
               rng=rng, avoid=frozenset(r.avoid))
    return interpret(d), rng  # as the router answered: a prompt no window holds is context_length_exceeded


def decide_live(snap: Snapshot, r: DecisionRecord) -> tuple[Decision, ReplayRandom]:
    """The recorded decision again: the skipped classifiers counted as
    failed, as the router's lazy decision takes them (its outcome is the
    same for every tag they could have given)."""
    return _decide(snap, r, engine_request(r, (BUILTIN_CLASSIFIERS[n].failure_tag for n in _skipped(r))))


def decide_candidate(snap: Snapshot, r: DecisionRecord) -> tuple[Decision, list[str]]:
    """The candidate's decision, and the classifiers it depends on that
    were not asked live (their tags unknown): the outcome is then the one
    with each such classifier finding nothing, as the router would ask it
    first and keep what it flags where the policy says."""
    base = engine_request(r)
    asked = _asked(r)
    unknown = [n for n in snap.classifiers_for(base) if n not in asked and n in BUILTIN_CLASSIFIERS]
    if not unknown:
        return _decide(snap, r, base)[0], []
    reps = [[g[0] for g in tag_classes(snap, n)] for n in unknown]
    outcomes: dict[Any, Decision] = {}
    for combo in itertools.product(*reps):
        d = _decide(snap, r, engine_request(r, combo))[0]
        outcomes.setdefault(outcome_key(d), d)
    clean = tuple(g[-1] for g in reps)  # the last class holds no failure tag: "nothing found"
    d = _decide(snap, r, engine_request(r, clean))[0]
    return d, (unknown if len(outcomes) > 1 else [])


# ------------------------------------------------------------ comparing


@dataclass
class Outcome:
    routed: bool
    backend: str | None
    endpoint: str | None
    rule: str
    code: str | None
    predicted_ttft: float | None = None

    @property
    def kind(self) -> str:
        if not self.routed:
            return "Refused"
        return "Provider" if (self.backend or "").startswith("Provider/") else "Local"

    def same(self, other: Outcome) -> bool:
        return (self.routed, self.backend, self.endpoint, self.rule, self.code) == (
            other.routed, other.backend, other.endpoint, other.rule, other.code)

    def label(self) -> str:
        if not self.routed:
            return f"refused {self.code or ''}".rstrip()
        return f"{self.backend}" + (f" {self.endpoint}" if self.endpoint else "")


def recorded_outcome(r: DecisionRecord) -> Outcome:
    o = r.outcome
    return Outcome(o.type == "Routed", o.backend, o.endpoint, o.rule or "unmatched", o.code, r.predicted_ttft)


def outcome_of(d: Decision) -> Outcome:
    c = d.candidate
    ttft = None
    if c is not None:
        ttft = d.context.predicted_ttft(c) if c.is_local else c.est_ttft
    return Outcome(d.routed, d.backend, d.endpoint, d.rule or "unmatched", d.code, ttft)


def _change(before: Outcome, after: Outcome) -> str | None:
    """What kind of change: backend type, worker set, provider, endpoint."""
    if before.same(after):
        return None
    if before.kind != after.kind:
        return "backend_type"
    if before.kind == "Local" and before.backend != after.backend:
        return "worker_set"
    if before.kind == "Provider" and before.backend != after.backend:
        return "provider"
    if before.endpoint != after.endpoint:
        return "endpoint"
    return "rule"  # same place, decided by another rule (or rejected with another code)


@dataclass
class _RuleRow:
    """One rule's figures: each ``*_before`` of the decisions it took live,
    each ``*_after`` of those it takes under the candidate (a decision that
    changes rule is in both rules' rows, so each side sums to the totals)."""

    before: int = 0
    after: int = 0
    #: of the decisions it took live, those the candidate decides otherwise
    changed_before: int = 0
    #: of the decisions it takes under the candidate, those that differ from live
    changed_after: int = 0
    provider_before: int = 0
    provider_after: int = 0
    refused_before: int = 0
    refused_after: int = 0
    ttft_before: list[float] = field(default_factory=list)
    ttft_after: list[float] = field(default_factory=list)
    observed: list[float] = field(default_factory=list)
    tokens_before: int = 0
    tokens_after: int = 0


def _mean_ms(values: list[float]) -> float | None:
    return round(sum(values) / len(values) * 1e3, 1) if values else None


def _tokens(r: DecisionRecord, obs: ObservationRecord | None) -> int:
    """The request's tokens: what the upstream reported, else the prompt estimate."""
    if obs is not None and (obs.prompt_tokens is not None or obs.completion_tokens is not None):
        return (obs.prompt_tokens or 0) + (obs.completion_tokens or 0)
    return r.request.prompt_tokens or 0


def _no_decisions(namespace: str, pool: str, pools: list[str]) -> CommandError:
    return CommandError(f"no recorded decisions of pool {namespace}/{pool} in the records read"
                        + (f" (recorded pools: {', '.join(pools)})" if pools else
                           " (none at all: is the router recording? It does unless started with --no-record)"))


def replay(records: list[Record], namespace: str, pool: str, candidate: CandidateSource | None) -> dict[str, Any]:
    """The report (see the module docstring) as a dictionary."""
    snaps = Snapshots()
    decisions: list[DecisionRecord] = []
    observations: dict[str, ObservationRecord] = {}
    for r in records:
        if isinstance(r, SnapshotRecord):
            if r.namespace == namespace and r.pool == pool:
                snaps.add(r)
        elif isinstance(r, DecisionRecord):
            if r.namespace == namespace and r.pool == pool and r.amended not in SECOND_RECORDS:
                decisions.append(r)  # (a second record of a decision: the first is the decision)
        elif isinstance(r, ObservationRecord):
            observations[r.decision_id] = r
    if not decisions:
        raise _no_decisions(namespace, pool, rec_io.pools_in(records))
    reproduced = 0
    #: decisions whose outcome was flow control's (shed, maxQueueWait): the queue is not replayed
    queued = [r for r in decisions if r.amended == "flow_control"]
    decisions = [r for r in decisions if r.amended != "flow_control"]
    failures: list[dict[str, str]] = []
    changes: dict[str, int] = defaultdict(int)
    moves: dict[str, int] = defaultdict(int)
    rows: dict[str, _RuleRow] = defaultdict(_RuleRow)
    changed: list[dict[str, Any]] = []
    pii_leaving: list[str] = []
    unknown_tags: dict[str, int] = defaultdict(int)
    unknown_to_provider = 0
    replayed = 0
    before_provider = after_provider = before_routed = after_routed = 0
    before_refused = after_refused = 0
    tokens_before = tokens_after = 0
    compiled_for: dict[str, CompiledPool] = {}
    for r in decisions:
        rec = recorded_outcome(r)
        live_snap = snaps.get(r.router, r.snapshot, "live")
        if live_snap is None:
            failures.append({"decision_id": r.decision_id, "why": snaps.why_missing(r.router, r.snapshot)})
            continue
        d, rng = decide_live(live_snap, r)
        got = outcome_of(d)
        if rng.unfit:  # the same pick or not, it was left to chance: not a reproduction
            failures.append({"decision_id": r.decision_id, "why": "a random tie (tieBreak: Random) whose draw "
                             f"the record does not hold: recorded {rec.label()}, replayed {got.label()}"})
        elif got.same(rec):
            reproduced += 1
        else:
            failures.append({"decision_id": r.decision_id,
                             "why": f"recorded {rec.label()} (rule {rec.rule}), replayed {got.label()} "
                                    f"(rule {got.rule}): a state the record lacks"})
        if candidate is None:
            continue
        recorded_pool = snaps.pool_of(r.router, r.snapshot)
        assert recorded_pool is not None
        cpool = compiled_for.get(recorded_pool.revision)
        if cpool is None:
            cpool = compiled_for[recorded_pool.revision] = candidate.compile(recorded_pool)
        cand_snap = snaps.get(r.router, r.snapshot, "candidate:" + recorded_pool.revision, cpool)
        assert cand_snap is not None
        cd, unknown = decide_candidate(cand_snap, r)
        after = outcome_of(cd)
        replayed += 1
        obs = observations.get(r.decision_id)
        tokens = _tokens(r, obs)
        for n in unknown:
            unknown_tags[n] += 1
        row_b, row_a = rows[rec.rule], rows[after.rule]
        row_b.before += 1
        row_a.after += 1
        if rec.predicted_ttft is not None:
            row_b.ttft_before.append(rec.predicted_ttft)
        if after.predicted_ttft is not None:
            row_a.ttft_after.append(after.predicted_ttft)
        if obs is not None and obs.ttft_seconds is not None and obs.streamed:
            row_b.observed.append(obs.ttft_seconds)  # a whole answer's first byte is no TTFT
        if rec.routed:
            before_routed += 1
        if after.routed:
            after_routed += 1
        if rec.kind == "Provider":
            before_provider += 1
            row_b.provider_before += 1
            row_b.tokens_before += tokens
            tokens_before += tokens
        if after.kind == "Provider":
            after_provider += 1
            row_a.provider_after += 1
            row_a.tokens_after += tokens
            tokens_after += tokens
            if PII_TAGS & set(r.request.tags):
                pii_leaving.append(r.decision_id)
            elif "pii" in unknown:
                unknown_to_provider += 1
        if not rec.routed:
            before_refused += 1
            row_b.refused_before += 1
        if not after.routed:
            after_refused += 1
            row_a.refused_after += 1
        what = _change(rec, after)
        if what is not None:
            changes[what] += 1
            row_b.changed_before += 1
            row_a.changed_after += 1
            if what == "backend_type":
                moves[f"{rec.kind}->{after.kind}"] += 1
            changed.append({"decision_id": r.decision_id, "tenant": r.request.tenant, "model": r.request.model,
                            "tags": r.request.tags, "change": what, "before": rec.label(), "after": after.label(),
                            "rule_before": rec.rule, "rule_after": after.rule,
                            **({"tags_unknown": unknown} if unknown else {})})
    total = len(decisions)
    at = [r.at for r in decisions + queued]
    out: dict[str, Any] = {
        "pool": f"{namespace}/{pool}",
        "decisions": total,
        "window": [min(at), max(at)],
        "reproduced": {"count": reproduced, "of": total, "not_reproduced": failures},
        "flow_control": {"count": len(queued), "decisions": [r.decision_id for r in queued]},
    }
    if candidate is None:
        return out

    def share(n: int, of: int) -> float:
        return round(n / of, 4) if of else 0.0

    out.update({
        "policy": candidate.describe(),
        "replayed": replayed,
        "changed": sum(changes.values()),
        "changes": {"backend_type": changes["backend_type"], "worker_set": changes["worker_set"],
                    "provider": changes["provider"], "endpoint": changes["endpoint"], "rule": changes["rule"],
                    "moves": dict(sorted(moves.items()))},
        "burst_share": {"before": share(before_provider, before_routed), "after": share(after_provider, after_routed)},
        "to_provider": {"before": before_provider, "after": after_provider},
        "refused": {"before": before_refused, "after": after_refused},
        "pii_leaving": {"count": len(pii_leaving), "decisions": pii_leaving},
        "tags_unknown": dict(unknown_tags),
        "pii_unknown_to_provider": unknown_to_provider,
        "predicted_ttft_ms": {"before": _mean_ms([t for x in rows.values() for t in x.ttft_before]),
                              "after": _mean_ms([t for x in rows.values() for t in x.ttft_after]),
                              "observed": _mean_ms([t for x in rows.values() for t in x.observed])},
        "provider_tokens": {"before": tokens_before, "after": tokens_after},
        "rules": [{"rule": name, "before": x.before, "after": x.after,
                   "changed": {"before": x.changed_before, "after": x.changed_after},
                   "to_provider": {"before": x.provider_before, "after": x.provider_after},
                   "refused": {"before": x.refused_before, "after": x.refused_after},
                   "predicted_ttft_ms": {"before": _mean_ms(x.ttft_before), "after": _mean_ms(x.ttft_after)},
                   "observed_ttft_ms": _mean_ms(x.observed),
                   "provider_tokens": {"before": x.tokens_before, "after": x.tokens_after}}
                  for name, x in sorted(rows.items())],
        "changed_decisions": changed,
    })
    return out


# ------------------------------------------------------------ the candidate


class CandidateSource:
    """The candidate policy file, compiled against each recorded pool
    revision exactly as the policy-compiler compiles it."""

    def __init__(self, path: Path, namespace: str, pool: str) -> None:
        self.path, self.namespace, self.pool = path, namespace, pool
        if not path.exists():
            raise CommandError(f"{path}: no such file or directory")
        self.loaded = load_paths([path])
        res = compile_documents(self.loaded)
        if res.errors:
            raise CommandError(f"{path} is not a valid manifest: " + "; ".join(str(e) for e in res.errors))
        self.policies = res.objects.get("InferencePolicy", {})
        self.has_pool = (namespace, pool) in res.objects.get("InferencePool", {})
        if not self.policies and not self.has_pool:
            raise CommandError(f"{path} holds no InferencePolicy (nor the pool {namespace}/{pool})")
        if self.has_pool:
            self._whole_pool()
        self.name = ""
        self.warnings: list[str] = []

    def _policy_for(self, recorded: CompiledPool) -> Any:
        mine = {k: v for k, v in self.policies.items() if k[0] == self.namespace}
        if (self.namespace, recorded.policy.name) in mine:
            return mine[(self.namespace, recorded.policy.name)].obj
        if len(mine) == 1:
            return next(iter(mine.values())).obj
        names = ", ".join(f"{k[0]}/{k[1]}" for k in sorted(self.policies)) or "none"
        raise CommandError(f"{self.path}: which policy? the pool's live policy is {recorded.policy.name!r} "
                           f"and the file's policies in namespace {self.namespace} are: {names}")

    def _whole_pool(self) -> CompiledPool:
        """The file's own pool, compiled with everything it names (checked before any record is read)."""
        res = compile_documents(self.loaded)
        got = res.pools.get((self.namespace, self.pool))
        st = res.pool_status.get((self.namespace, self.pool))
        bad = [c.message for c in (st.conditions if st is not None else []) if c.status == "False"]
        if got is None or bad:
            raise CommandError(f"{self.path} holds pool {self.namespace}/{self.pool} but not all it names: "
                               + "; ".join(bad or ["it does not compile"])
                               + ". Give the InferencePolicy alone, or every manifest of the pool")
        return got

    def compile(self, recorded: CompiledPool) -> CompiledPool:
        in_process = recorded.policy.in_process_classifiers
        if self.has_pool:  # as the policy-compiler, with the routers' in-process classifiers
            got = compile_documents(self.loaded, in_process_classifiers=in_process).pools[(self.namespace, self.pool)]
            self.name = got.policy.name
            return got
        obj = self._policy_for(recorded)
        ctx = PoolContext(namespace=recorded.namespace, name=recorded.name, aliases=recorded.aliases,
                          destinations={d.name: d.type for d in recorded.destinations},
                          provider_models=frozenset(m.name for d in recorded.destinations if d.type == "Provider"
                                                    for m in d.models))
        comp = compile_policy(obj, None, ctx, in_process=in_process)
        for w in comp.warnings:
            line = f"warning {w.code}: rule {w.rule or '-'} at {w.term}: {w.message}"
            if line not in self.warnings:
                self.warnings.append(line)
        self.name = comp.policy.name
        policy: CompiledPolicy = comp.policy
        return msgspec.structs.replace(recorded, policy=policy, revision=recorded.revision + "+candidate")

    def describe(self) -> dict[str, Any]:
        return {"file": str(self.path), "name": f"{self.namespace}/{self.name}", "warnings": self.warnings}


# ------------------------------------------------------------ output


def _fmt_ms(v: float | None) -> str:
    return "-" if v is None else f"{v:g}ms"


def change_line(c: dict[str, Any]) -> str:
    """What a changed decision's ``before``/``after`` differ in: the place
    (``A -> B``), the rule (``rule R1 -> rule R2``), or both; the same place
    or rule is printed once."""
    place = c["before"] if c["before"] == c["after"] else f"{c['before']} -> {c['after']}"
    if c["rule_before"] == c["rule_after"]:
        return f"{place} (rule {c['rule_after']})"
    return f"{place} (rule {c['rule_before']} -> rule {c['rule_after']})"


def print_text(rep: dict[str, Any], out: Any = None) -> None:
    out = out or sys.stdout
    rp = rep["reproduced"]
    w = out.write
    pol = rep.get("policy")
    if pol is not None:
        w(f"replay of {pol['name']} ({pol['file']}) on {rep['pool']}: {rep['decisions']} recorded decisions\n")
        for line in pol["warnings"]:
            w(f"  {line}\n")
    else:
        w(f"{rep['pool']}: {rep['decisions']} recorded decisions\n")
    w(f"{rp['count']} of {rp['of']} decisions reproduced (the live policy on the recorded snapshots)\n")
    for f in rp["not_reproduced"][:SHOWN]:
        w(f"  not reproduced {f['decision_id'][:12]}: {f['why']}\n")
    if len(rp["not_reproduced"]) > SHOWN:
        w(f"  ... and {len(rp['not_reproduced']) - SHOWN} more (-o json lists them)\n")
    if rep["flow_control"]["count"]:
        w(f"  and {rep['flow_control']['count']} decided by flow control (shed, or maxQueueWait after the engine "
          "routed): the queue is not replayed, they are left out\n")
    if pol is None:
        return
    ch = rep["changes"]
    moves = ", ".join(f"{k} {v}" for k, v in ch["moves"].items()) or "none"
    w(f"{rep['changed']} of {rep['replayed']} decisions would change: backend type {ch['backend_type']} "
      f"({moves}), worker set {ch['worker_set']}, provider {ch['provider']}, endpoint only {ch['endpoint']}, "
      f"rule only {ch['rule']}\n")
    b = rep["burst_share"]
    w(f"burst share (routed to a provider): {b['before'] * 100:.1f}% -> {b['after'] * 100:.1f}% "
      f"({rep['to_provider']['before']} -> {rep['to_provider']['after']} requests)\n")
    w(f"refused: {rep['refused']['before']} -> {rep['refused']['after']}\n")
    t = rep["predicted_ttft_ms"]
    w(f"predicted TTFT (mean): {_fmt_ms(t['before'])} -> {_fmt_ms(t['after'])}; observed (streamed answers) "
      f"{_fmt_ms(t['observed'])}\n")
    w(f"provider tokens: {rep['provider_tokens']['before']} -> {rep['provider_tokens']['after']}\n")
    pii = rep["pii_leaving"]["count"]
    w(f"PII-tagged requests that would leave the cluster: {pii}\n")
    for name, n in rep["tags_unknown"].items():
        w(f"  {n} decision(s) depend on classifier {name}, not asked live: replayed as if it found nothing "
          f"(the router asks it first)\n")
    w("per rule: BEFORE the decisions the rule took live, AFTER those it takes under the candidate; each X->Y: "
      "X of BEFORE, Y of AFTER\n"
      "  CHANGED: those the candidate decides otherwise (a decision that changes rule counts in both rules' rows)\n")
    table(["RULE", "BEFORE", "AFTER", "CHANGED", "TO-PROVIDER", "REFUSED", "PRED-TTFT", "OBSERVED", "PROVIDER-TOKENS"],
          [[x["rule"], str(x["before"]), str(x["after"]), f"{x['changed']['before']}->{x['changed']['after']}",
            f"{x['to_provider']['before']}->{x['to_provider']['after']}",
            f"{x['refused']['before']}->{x['refused']['after']}",
            f"{_fmt_ms(x['predicted_ttft_ms']['before'])}->{_fmt_ms(x['predicted_ttft_ms']['after'])}",
            _fmt_ms(x["observed_ttft_ms"]),
            f"{x['provider_tokens']['before']}->{x['provider_tokens']['after']}"] for x in rep["rules"]], out)
    shown = rep["changed_decisions"][:SHOWN]
    if shown:
        w("changed decisions" + (f" (first {SHOWN})" if len(rep["changed_decisions"]) > SHOWN else "") + ":\n")
        for c in shown:
            w(f"  {c['decision_id'][:12]} tenant={c['tenant']} model={c['model']} tags={','.join(c['tags']) or '-'} "
              f"{change_line(c)}\n")


def run(args: argparse.Namespace) -> int:
    ns, name = split_pool(args.pool)
    since = rec_io.since_seconds(args.since)
    if args.export is None and args.policy is None:
        raise CommandError("name the candidate POLICY.yaml (or --export FILE to write the records)")
    if args.export is not None and args.file is not None:
        raise CommandError("--export reads NATS; --file is already an export")
    candidate = CandidateSource(args.policy, ns, name) if args.policy is not None else None
    if args.file is not None:
        got = rec_io.read_file(args.file)
    else:
        got = rec_io.from_nats(args, ns, name, since)
        if not any(isinstance(r, DecisionRecord) for r in got):
            # only this pool's subject was read: name the pools the stream has
            pools = rec_io.recorded_pools(args)
            if f"{ns}/{name}" in pools:
                raise CommandError(f"no recorded decisions of pool {ns}/{name} in the last {args.since} "
                                   "(the stream holds older ones: widen --since)")
            raise _no_decisions(ns, name, pools)
    if args.export is not None:
        n = rec_io.write_file(args.export, got)
        print(f"{n} records of {ns}/{name} written to {args.export}", file=sys.stderr)
        return EXIT_OK
    rep = replay(got, ns, name, candidate)
    if args.output == "json":
        print_json(rep)
    else:
        print_text(rep)
    pii = rep.get("pii_leaving", {}).get("count", 0)
    if pii:
        print(f"PII WOULD LEAVE THE CLUSTER: {pii} PII-tagged request(s) would be sent to a provider by this "
              "policy", file=sys.stderr)
        return EXIT_PII_LEAVES
    return EXIT_OK
