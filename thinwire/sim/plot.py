"""PNG plots of the simulator's results (matplotlib, Agg backend: no display needed)."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from thinwire.output import save_figure


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def scaling_plot(path: str | Path, breakdown: Sequence[dict], scaling_rows: Sequence[dict],
                 title: str) -> None:
    """Left: scaling efficiency against nodes per algorithm. Right: the iteration time at the
    requested size, stacked as compute / exposed communication / exposed selection."""
    plt = _pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    for algorithm in dict.fromkeys(r["algorithm"] for r in scaling_rows):
        rows = [r for r in scaling_rows if r["algorithm"] == algorithm]
        left.plot([r["nodes"] for r in rows], [100 * r["scaling_efficiency"] for r in rows],
                  marker="o", label=algorithm)
    left.set_xscale("log", base=2)
    left.set_xlabel("nodes")
    left.set_ylabel("scaling efficiency (%)")
    left.set_ylim(0, 105)
    left.grid(True, alpha=0.3)
    left.legend()
    names = [r["algorithm"] for r in breakdown]
    bottom = [0.0] * len(breakdown)
    for key, label in (("compute_s", "compute"), ("exposed_comm_s", "exposed communication"),
                       ("exposed_selection_s", "exposed selection")):
        heights = [1e3 * r[key] for r in breakdown]
        right.bar(names, heights, bottom=bottom, label=label)
        bottom = [b + h for b, h in zip(bottom, heights)]
    right.set_ylabel("ms per iteration")
    right.set_ylim(0, 1.35 * max(bottom, default=1.0))  # room for the legend above the bars
    if breakdown:
        right.set_title(f"{breakdown[0]['nodes']} nodes x {breakdown[0]['ranks_per_node']} ranks")
    right.legend(loc="upper left", fontsize="small")
    fig.suptitle(title)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    save_figure(fig, path, dpi=110)
    plt.close(fig)


def calibration_plot(path: str | Path, rows: Sequence[dict]) -> None:
    """Predicted against measured iteration time, one point per run, with the +-20% band."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(5.5, 5))
    for algorithm in dict.fromkeys(r["algorithm"] for r in rows):
        mine = [r for r in rows if r["algorithm"] == algorithm]
        ax.scatter([1e3 * r["measured_s"] for r in mine], [1e3 * r["predicted_s"] for r in mine],
                   label=algorithm)
    top = 1.25e3 * max(max(r["measured_s"], r["predicted_s"]) for r in rows)
    ax.plot([0, top], [0, top], color="black", lw=1)
    ax.fill_between([0, top], [0, 0.8 * top], [0, 1.2 * top], color="grey", alpha=0.15,
                    label="+-20%")
    ax.set_xlim(0, top)
    ax.set_ylim(0, top)
    ax.set_xlabel("measured ms per iteration")
    ax.set_ylabel("predicted ms per iteration")
    ax.legend()
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    save_figure(fig, path, dpi=110)
    plt.close(fig)
