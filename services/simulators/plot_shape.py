"""Plot the engine simulator's shape: ``python -m kinference_simulators.plot_shape``.

Runs the scheduler offline (simulated time, deterministic under ``--seed``)
on Poisson workloads of rising rate, with an A10G-class profile, and writes
``docs/simulator-shape.png``: TTFT vs load, TTFT vs prefill tokens queued
ahead, KV use and preemptions with ample vs short KV, the effect of a shared
prompt prefix, and a timeline of an overloaded engine.
"""

from __future__ import annotations

import argparse
import random
from dataclasses import dataclass
from pathlib import Path

from . import offline
from .profiles import get_profile
from .scheduler import SchedulerConfig

RATES = (0.25, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0)
PROMPT, OUTPUT, SHARED = 1024, 128, 768
#: KV blocks: an A10G's worth for an 8B model, far more, and far less
A10G_KV, AMPLE_KV, SHORT_KV = 2700, 20000, 600


@dataclass
class Series:
    rates: list[float]
    runs: list[offline.RunResult]


def _config(kv_blocks: int) -> SchedulerConfig:
    return SchedulerConfig(
        num_gpu_blocks=kv_blocks,
        block_size=16,
        max_num_seqs=256,
        max_num_batched_tokens=2048,
        max_model_len=4096,
    )


def _series(kv_blocks: int, shared: int, seed: int, duration: float) -> Series:
    profile = get_profile("a10g")
    runs = [
        offline.run(
            _config(kv_blocks),
            profile,
            offline.poisson_workload(
                random.Random(seed),
                rate=rate,
                duration=duration,
                prompt_tokens=PROMPT,
                output_tokens=OUTPUT,
                shared_prefix_tokens=shared,
            ),
        )
        for rate in RATES
    ]
    return Series(list(RATES), runs)


def _pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))] if s else 0.0


def main(argv: list[str] | None = None) -> Path:
    ap = argparse.ArgumentParser(
        prog="python -m kinference_simulators.plot_shape", description=__doc__.splitlines()[0]
    )
    ap.add_argument(
        "--out", default=str(Path(__file__).resolve().parents[2] / "docs" / "simulator-shape.png")
    )
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--duration", type=float, default=120.0, help="simulated seconds per run")
    a = ap.parse_args(argv)

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    a10g = _series(A10G_KV, 0, a.seed, a.duration)
    ample = _series(AMPLE_KV, 0, a.seed, a.duration)
    short = _series(SHORT_KV, 0, a.seed, a.duration)
    shared = _series(A10G_KV, SHARED, a.seed, a.duration)

    fig, axes = plt.subplots(2, 3, figsize=(17, 9.5))
    fig.suptitle(
        f"Engine simulator shape - a10g profile, {PROMPT}-token prompts, {OUTPUT}-token outputs, "
        f"Poisson arrivals, budget 2048 tokens/step, block 16 (seed {a.seed})",
        fontsize=13,
    )

    ax = axes[0][0]
    ax.plot(RATES, [_pct(r.ttfts(), 0.5) for r in a10g.runs], "o-", label="p50")
    ax.plot(RATES, [_pct(r.ttfts(), 0.9) for r in a10g.runs], "s--", label="p90")
    ax.set_yscale("log")
    ax.set_xlabel("offered load (requests/s)")
    ax.set_ylabel("TTFT (s, log)")
    ax.set_title(f"TTFT rises with load ({A10G_KV} KV blocks)")
    ax.grid(alpha=0.3)
    ax.legend()

    ax = axes[0][1]
    for rate, run in zip(RATES, a10g.runs, strict=True):
        if rate in (1.0, 2.0, 3.0):
            xs = [run.queued_at_arrival[f.request_id] / 1000 for f in run.per_request]
            ax.scatter(
                xs, [f.ttft for f in run.per_request], s=8, alpha=0.6, label=f"{rate:g} req/s"
            )
    ax.set_xlabel("prefill tokens queued ahead at arrival (thousands)")
    ax.set_ylabel("TTFT (s)")
    ax.set_title("TTFT grows with queued prefill tokens")
    ax.grid(alpha=0.3)
    ax.legend(markerscale=2)

    ax = axes[0][2]
    for series, name in (
        (ample, f"{AMPLE_KV} blocks"),
        (a10g, f"{A10G_KV} blocks"),
        (short, f"{SHORT_KV} blocks"),
    ):
        (line,) = ax.plot(
            RATES, [r.mean_kv_usage() for r in series.runs], "o-", label=f"mean, {name}"
        )
        ax.plot(
            RATES,
            [_pct([s.kv_usage for s in r.samples], 0.95) for r in series.runs],
            "s--",
            color=line.get_color(),
            alpha=0.6,
            label=f"p95, {name}",
        )
    ax.set_ylim(0, 1.05)
    ax.set_xlabel("offered load (requests/s)")
    ax.set_ylabel("vllm:kv_cache_usage_perc (over steps)")
    ax.set_title("KV-cache use rises with load")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)

    ax = axes[1][0]
    width = 0.13
    for k, (series, name) in enumerate(((ample, AMPLE_KV), (a10g, A10G_KV), (short, SHORT_KV))):
        ax.bar(
            [r + (k - 1) * width for r in RATES],
            [r.preemptions for r in series.runs],
            width,
            label=f"{name} KV blocks",
        )
    ax.set_xlabel("offered load (requests/s)")
    ax.set_ylabel(f"vllm:num_preemptions in {a.duration:g} s")
    ax.set_title("Preemptions appear when KV is short")
    ax.grid(alpha=0.3, axis="y")
    ax.legend()

    ax = axes[1][1]
    ax.plot(RATES, [r.mean_ttft() for r in a10g.runs], "o-", label="unique prompts")
    ax.plot(
        RATES, [r.mean_ttft() for r in shared.runs], "s-", label=f"{SHARED}-token shared prefix"
    )
    ax.set_yscale("log")
    ax.set_xlabel("offered load (requests/s)")
    ax.set_ylabel("mean TTFT (s, log)")
    hit = sum(r.hit_rate for r in shared.runs) / len(shared.runs)
    ax.set_title(f"A shared prefix lowers TTFT (hit rate {hit:.0%})")
    ax.grid(alpha=0.3)
    ax.legend()

    ax = axes[1][2]
    overloaded = short.runs[RATES.index(3.0)]
    ts = [s.time for s in overloaded.samples]
    ax.plot(ts, [s.waiting for s in overloaded.samples], label="waiting", lw=1)
    ax.plot(ts, [s.running for s in overloaded.samples], label="running", lw=1)
    ax.set_xlabel("simulated time (s)")
    ax.set_ylabel("requests")
    ax2 = ax.twinx()
    ax2.plot(
        ts,
        [s.kv_usage for s in overloaded.samples],
        color="tab:red",
        lw=0.8,
        alpha=0.7,
        label="KV use",
    )
    ax2.set_ylim(0, 1.05)
    ax2.set_ylabel("KV use", color="tab:red")
    ax.set_title(
        f"Timeline at 3 req/s, {SHORT_KV} KV blocks ({overloaded.preemptions} preemptions)"
    )
    lines = ax.get_legend_handles_labels()
    lines2 = ax2.get_legend_handles_labels()
    ax.legend(lines[0] + lines2[0], lines[1] + lines2[1], loc="center left", framealpha=0.9)
    ax.grid(alpha=0.3)

    fig.tight_layout(rect=(0, 0, 1, 0.96))
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=90)
    plt.close(fig)
    print(out)
    return out


if __name__ == "__main__":
    main()
