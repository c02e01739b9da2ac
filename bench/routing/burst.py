"""Burst to cloud, measured: the seeds' burst-unless-PII policy against
local-only and against spilling at a fixed queue length.

``python -m bench.routing.burst`` (run by ``make bench-routing`` after the
sweep). The same arrivals (``shared_prefix`` requests, a tenth of them
tagged ``pii-confirmed`` as the PII classifier would tag them) at 50% to
200% of the local fleet's capacity go through three routers:

``local_only``
    Kinference with the sweep's policy (``minimize: PredictedTTFT`` over the
    local pods, no provider): what an operator without burst gets.
``kinference_burst``
    Kinference with the seeds' ``burst-unless-pii`` policy compiled as
    written (drop local endpoints with more than 4 queued prompts or more
    than 90% KV use, never send PII out, then local by PredictedTTFT, then
    the provider).
``fixed_queue_spill``
    LiteLLM-style ordered fallback: the local pod with the shortest queue
    (scraped waiting requests plus this router's sends since the scrape);
    when that queue is longer than 4 the request goes to the provider
    instead, unless it is tagged PII. LiteLLM's router falls back to the
    next deployment group on errors and rate limits; a fixed queue-length
    threshold is how an operator would express "local until busy" with it.

The provider answers after a fixed TTFT and streams at a fixed rate, with
unlimited capacity, at a price per million tokens (prompt + output).
Reported per router and load: SLO attainment (TTFT and time per output
token within the workload's SLOs), the share of requests sent out, the
provider's cost per 1,000 requests, TTFT p50/p99, and how many PII-tagged
requests went to the provider (must be 0 for both burst routers).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from kinference_common.messages import EndpointState

from . import run
from .fleet import EPOCH, ProviderSpec, TelemetrySpec, simulate
from .kinference import BURST_UNLESS_PII, FASTEST_LOCAL, Kinference
from .peers import _Base
from .workloads import SimRequest, generate

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "bench" / "results" / "routing_burst.json"
PROVIDER = ProviderSpec("cloud", ttft_s=0.35, tpot_s=0.02, price_per_mtok=0.9)
TTFT_SLO = 1.0
TPOT_SLO = 0.05
LOADS = (0.5, 1.0, 1.5, 2.0)
PII_SHARE = 0.1


def is_pii(req: SimRequest) -> bool:
    """A fixed tenth of the requests (by id), as the PII classifier would tag them."""
    return hashlib.blake2b(req.id.encode(), digest_size=2).digest()[0] < 256 * PII_SHARE


def tag(reqs: list[SimRequest]) -> None:
    for r in reqs:
        r.tags = frozenset({"pii-confirmed"}) if is_pii(r) else frozenset({"pii-none"})


class FixedQueueSpill(_Base):
    """See the module docstring (``fixed_queue_spill``)."""

    name = "fixed_queue_spill"
    max_queue = 4

    def setup(self, pods, providers, rng) -> None:  # noqa: ANN001
        super().setup(pods, providers, rng)
        self._since: dict[str, list[float]] = {p.key: [] for p in pods}
        for p in providers:
            self.in_flight[p.key] = 0

    def on_telemetry(self, state: EndpointState, now: float) -> None:
        super().on_telemetry(state, now)
        key = f"{state.namespace}/{state.worker_set}/{state.pod}"
        t = state.scraped_at - EPOCH
        self._since[key] = [s for s in self._since[key] if s > t]

    def pick(self, req: SimRequest, now: float) -> str | None:
        cands = self.candidates(req)
        best, key = None, None
        for k in cands:
            st = self.state.get(k)
            q = ((st.queued or 0) if st is not None else 0) + len(self._since[k])
            v = (q, self.in_flight[k])
            if best is None or v < best:
                best, key = v, k
        if key is None:
            return None
        if best[0] > self.max_queue and self.providers and "pii-confirmed" not in req.tags:
            return self.sent(req, self.providers[0].key)
        self._since[key].append(now)
        return self.sent(req, key)


def routers() -> dict[str, object]:
    return {
        "local_only": lambda: Kinference(FASTEST_LOCAL, name="local_only"),
        "kinference_burst": lambda: Kinference(BURST_UNLESS_PII, name="kinference_burst"),
        "fixed_queue_spill": FixedQueueSpill,
    }


def run_burst(seed: int = 1, loads=LOADS, workload: str = "shared_prefix") -> list[dict]:  # noqa: ANN001
    spec = run.SPECS[workload]
    pods = spec.pods()
    cap = run.fleet_capacity(workload, pods, seed)
    rows = []
    for load in loads:
        reqs = generate(workload, seed, load * cap, spec.duration)
        tag(reqs)
        for name, make in routers().items():
            providers = [] if name == "local_only" else [PROVIDER]
            res = simulate(reqs, pods, [make()], telemetry=TelemetrySpec(), providers=providers, seed=seed)
            measured = [o for o in res.outcomes if o.req.time >= spec.warmup]
            ttft = [o.ttft for o in measured if o.ttft is not None]
            good = sum(1 for o in measured if o.ttft is not None and o.ttft <= TTFT_SLO
                       and o.tpot is not None and o.tpot <= TPOT_SLO)
            out = [o for o in measured if o.provider]
            tokens = sum(o.req.prompt_tokens + o.req.output_len for o in out)
            rows.append({
                "workload": workload, "router": name, "load": load, "requests": len(measured),
                "slo_attainment": good / len(measured) if measured else None,
                "offload_share": len(out) / len(measured) if measured else 0.0,
                "provider_cost_per_1k_requests": tokens * PROVIDER.price_per_mtok / 1e6 / len(measured) * 1000
                if measured else 0.0,
                "pii_sent_out": sum(1 for o in res.outcomes if o.provider and "pii-confirmed" in o.req.tags),
                "pii_requests": sum(1 for o in res.outcomes if "pii-confirmed" in o.req.tags),
                "ttft_p50_s": run._q(ttft, 0.5), "ttft_p99_s": run._q(ttft, 0.99),
                "rejected": sum(1 for o in measured if o.rejected),
                "provider_ttft_s": PROVIDER.ttft_s, "price_per_mtok": PROVIDER.price_per_mtok,
            })
    return rows


def table(rows: list[dict]) -> str:
    head = (f"{'router':<20}{'load':>5}{'SLO met':>9}{'sent out':>10}{'$/1k req':>10}{'PII out':>9}"
            f"{'ttft p50':>10}{'ttft p99':>10}")
    out = [head, "-" * len(head)]
    for r in rows:
        out.append(f"{r['router']:<20}{r['load']:>5.1f}{r['slo_attainment']:>9.3f}{r['offload_share']:>10.3f}"
                   f"{r['provider_cost_per_1k_requests']:>10.3f}{r['pii_sent_out']:>9}"
                   f"{r['ttft_p50_s']:>10.3f}{r['ttft_p99_s']:>10.3f}")
    return "\n".join(out)


def main() -> int:
    run.pin_hash_seed("bench.routing.burst")
    rows = run_burst()
    print(f"burst to cloud (provider TTFT {PROVIDER.ttft_s}s, ${PROVIDER.price_per_mtok}/M tokens; "
          f"SLO TTFT <= {TTFT_SLO}s, TPOT <= {TPOT_SLO}s; {PII_SHARE:.0%} of requests PII)")
    print(table(rows))
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(rows, indent=1) + "\n")
    print(f"wrote {RESULTS.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
