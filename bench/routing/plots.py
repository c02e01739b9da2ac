"""Plots of the sweep: TTFT p99 and goodput against load, one panel per workload.

The TTFT p99 panels also draw the floors (:mod:`.floor`): the idle floor's
p99, under which no router can go, and the lowest loaded floor p99 of each
load's rows."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

STYLE = {
    "round_robin": ("#999999", "o", "round robin"),
    "least_queue": ("#8c564b", "v", "least queue"),
    "gie_default": ("#1f77b4", "s", "GIE default"),
    "llmd_sticky": ("#ff7f0e", "^", "llm-d sticky"),
    "vllm_router_cache_aware": ("#2ca02c", "D", "vllm-router cache_aware"),
    "kinference": ("#d62728", "*", "Kinference"),
}


def plot_sweep(rows: Sequence[dict], out_dir: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    base = [r for r in rows if r["replicas"] == 1 and r["scrape_interval_s"] == 0.1 and not r.get("variant")]
    wls = list(dict.fromkeys(r["workload"] for r in base))
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for metric, label, fname, log in (
        ("ttft_p99_s", "TTFT p99 (s)", "routing-ttft-p99.png", True),
        ("goodput", "goodput (requests/s within SLO)", "routing-goodput.png", False),
    ):
        n = len(wls)
        cols = min(n, 4)
        nrows = -(-n // cols)
        fig, axes = plt.subplots(nrows, cols, figsize=(4.2 * cols, 3.4 * nrows), squeeze=False)
        for i, w in enumerate(wls):
            ax = axes[i // cols][i % cols]
            for router, (color, marker, name) in STYLE.items():
                pts = sorted((r["load"], r[metric]) for r in base
                             if r["workload"] == w and r["router"] == router and r[metric] is not None)
                if pts:
                    ax.plot([p[0] for p in pts], [p[1] for p in pts], color=color, marker=marker, label=name,
                            linewidth=2.2 if router == "kinference" else 1.2, markersize=6 if router == "kinference" else 4)
            if metric == "ttft_p99_s":
                _floors(ax, [r for r in base if r["workload"] == w])
            ax.set_title(w)
            ax.set_xlabel("offered load (fraction of capacity)")
            ax.set_ylabel(label)
            if log:
                ax.set_yscale("log")
            ax.grid(True, alpha=0.3)
        for j in range(n, nrows * cols):
            axes[j // cols][j % cols].axis("off")
        handles, labels = axes[0][0].get_legend_handles_labels()
        ncol = min(len(labels), 2 * cols)
        legend_rows = -(-len(labels) // ncol)
        fig.legend(handles, labels, loc="lower center", ncol=ncol, frameon=False)
        fig.tight_layout(rect=(0, 0.06 * legend_rows / nrows, 1, 1))
        path = out_dir / fname
        fig.savefig(path, dpi=90)
        plt.close(fig)
        written.append(path)
    return written


def _floors(ax, rows: Sequence[dict]) -> None:  # noqa: ANN001 - a matplotlib Axes
    by: dict[float, list[dict]] = {}
    for r in rows:
        by.setdefault(r["load"], []).append(r)
    for key, style, name in (("idle_floor_p99_s", "--", "idle floor (p99)"),
                             ("loaded_floor_p99_s", ":", "loaded floor (p99)")):
        pts = sorted((load, min(v)) for load, rs in by.items()
                     if (v := [r[key] for r in rs if r.get(key) is not None]))
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], color="black", linestyle=style, linewidth=1.0,
                    label=name)
