"""Hand-built compiled pools and telemetry for the engine tests."""

from __future__ import annotations

from kinference_common.compiled import (
    CandidateTest,
    CompiledExclusion,
    CompiledPolicy,
    CompiledPool,
    CompiledRule,
    CompiledTier,
    Consider,
    Destination,
    PoolModel,
    ProviderSettings,
    Range,
    RequestTest,
    SecretRef,
    ServedModel,
    SignalTest,
)
from kinference_common.engine import Request, Snapshot
from kinference_common.messages import EndpointState, ProviderState

NOW = 1_000_000.0
NS = "default"


def ws(name: str, model: str, served_name: str | None = None, context_window: int | None = None,
       ns: str = NS) -> Destination:
    return Destination(
        type="Local", name=name, namespace=ns,
        models=[ServedModel(name=model, served_name=served_name or model, context_window=context_window)],
        selector={"app": name}, port=8000, engine="vLLM",
    )


def prov(name: str, models: dict[str, str], ns: str = NS, context_window: int | None = None) -> Destination:
    return Destination(
        type="Provider", name=name, namespace=ns,
        models=[ServedModel(name=m, served_name=up, context_window=context_window) for m, up in models.items()],
        provider=ProviderSettings(url=f"https://{name}.example", secret_ref=SecretRef(name=name, key="token")),
    )


def pool(dests: list[Destination], rules: list[CompiledRule] | None = None, *, unmatched: str = "ServeLocal",
         aliases: dict[str, str] | None = None, policy_name: str = "my-policy", name: str = "pool") -> CompiledPool:
    al: dict[str, str] = {}
    models: dict[str, list[str]] = {}
    for d in dests:
        for m in d.models:
            al[m.name] = m.name
            models.setdefault(m.name, []).append(d.name)
    al.update(aliases or {})
    return CompiledPool(
        namespace=NS, name=name, revision="r1", destinations=dests,
        models=[PoolModel(name=m, served_by=s) for m, s in models.items()],
        aliases=al,
        policy=CompiledPolicy(namespace=NS, name=policy_name if rules is not None else "",
                              unmatched=unmatched, rules=rules or []),  # type: ignore[arg-type]
    )


def rule(name: str, select: list[CompiledTier], *, index: int = 0, matches: list[RequestTest] | None = None,
         consider: list[Consider] | None = None, exclude: list[CompiledExclusion] | None = None,
         tie_break: list[str] | None = None, on_empty: str = "Reject", shadowed: bool = False) -> CompiledRule:
    return CompiledRule(
        name=name, index=index, term=f"rules[{index}]", matches=matches, consider=consider,
        exclude=exclude or [], select=select, tie_break=tie_break or [], on_empty=on_empty,  # type: ignore[arg-type]
        shadowed=shadowed,
    )


def tier(type_: str, index: int = 0, *, minimize: str | None = None, order: list[str] | None = None,
         backends: CandidateTest | None = None, unreachable: bool = False) -> CompiledTier:
    return CompiledTier(index=index, term=f"select[{index}]", type=type_, minimize=minimize,  # type: ignore[arg-type]
                        order=order, backends=backends, unreachable=unreachable)


def sig(signal: str, gt: float | None = None, lt: float | None = None) -> SignalTest:
    return SignalTest(signal=signal, range=Range(greater_than=gt, less_than=lt))  # type: ignore[arg-type]


def excl(name: str, *, type_: str | None = None, names: list[str] | None = None, signals: list[SignalTest] | None = None,
         when: RequestTest | None = None) -> CompiledExclusion:
    from kinference_common.compiled import LIVE_SIGNALS

    sigs = signals or []
    return CompiledExclusion(
        name=name, term=f"exclude[{name}]", when=when,
        drop=CandidateTest(backend_type=type_, backend_names=names, signals=sigs),  # type: ignore[arg-type]
        live=any(s.signal in LIVE_SIGNALS for s in sigs),
    )


def ep(workerset: str, pod: str, *, ready: bool = True, queued: int | None = 0, running: int | None = 0,
       kv: float | None = 0.1, theta: float | None = 10000.0, overhead: float | None = 0.02,
       age: float = 0.1, context_window: int | None = None, hit_rate: float | None = None,
       ns: str = NS, **kw) -> EndpointState:
    return EndpointState(
        namespace=ns, worker_set=workerset, pod=pod, address="10.0.0.1:8000", ready=ready,
        scraped_at=NOW - age, queued=queued, running=running, kv_cache_usage=kv,
        prefill_tokens_per_second=theta, fixed_overhead_seconds=overhead, context_window=context_window,
        prefix_cache_hit_rate=hit_rate, **kw,
    )


def pstate(name: str, est: float | None = None, err: float | None = None, ns: str = NS) -> ProviderState:
    return ProviderState(namespace=ns, name=name, estimated_ttft_seconds=est, error_rate=err,
                         observations=0 if est is None else 10, updated_at=NOW - 1)


def snap(p: CompiledPool, eps: list[EndpointState], provs: list[ProviderState] | None = None, **kw) -> Snapshot:
    kw.setdefault("now", NOW)
    return Snapshot(p, eps, provs or [], **kw)


def req(model: str, **kw) -> Request:
    if "tags" in kw:
        kw["tags"] = frozenset(kw["tags"])
    return Request(model=model, **kw)


# ------------------------------------------------------------- seed policies

def burst_policy_rule() -> CompiledRule:
    """Seed 000: local first, burst to databricks, never PII to a provider."""
    return rule(
        "local-first-then-provider-unless-pii",
        [tier("Local", 0, minimize="PredictedTTFT"), tier("Provider", 1, order=["databricks"])],
        exclude=[
            excl("drop-local-endpoints-with-big-queues", type_="Local", signals=[sig("queuedPrompts", gt=4)]),
            excl("drop-local-endpoints-with-no-kv-headroom", type_="Local", signals=[sig("kvCacheUsage", gt=0.9)]),
            excl("ensure-pii-never-leaves-cluster", type_="Provider",
                 when=RequestTest(tags=["pii-confirmed", "pii-unknown"])),
        ],
    )
