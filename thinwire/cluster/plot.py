"""Plot a run's per-node accounting (`--stats-json`): CPU rate, memory, link rates over time.

    thinwire cluster plot STATS.json --out nodes.png
"""

from __future__ import annotations

import json
from pathlib import Path

from thinwire.output import save_figure


def _rates(t: list[float], values: list) -> tuple[list[float], list[float]]:
    """Per-interval rate of a cumulative counter (None samples skipped)."""
    pts = [(a, b) for a, b in zip(t, values) if b is not None]
    mids, rates = [], []
    for (t0, v0), (t1, v1) in zip(pts, pts[1:]):
        if t1 > t0:
            mids.append((t0 + t1) / 2)
            rates.append((v1 - v0) / (t1 - t0))
    return mids, rates


def plot_stats(stats: dict, out: str | Path) -> Path:
    """Three panels sharing the time axis: CPU cores used, memory (MiB), link Mbit/s."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (cpu_ax, mem_ax, net_ax) = plt.subplots(3, 1, sharex=True, figsize=(8, 8))
    for node in stats["nodes"]:
        s, i = node["series"], node["node"]
        x, y = _rates(s["t"], s["cpu_seconds"])
        if y:
            cpu_ax.plot(x, y, label=f"node {i}")
        mem = [(a, b / 2**20) for a, b in zip(s["t"], s["memory_bytes"]) if b is not None]
        if mem:
            mem_ax.plot([a for a, _ in mem], [b for _, b in mem], label=f"node {i}")
        for key, style in (("tx_bytes", "-"), ("rx_bytes", "--")):
            x, y = _rates(s["t"], s[key])
            net_ax.plot(x, [v * 8 / 1e6 for v in y], style,
                        label=f"node {i} {'sent' if key == 'tx_bytes' else 'received'}")
        if node.get("cpu_limit"):
            cpu_ax.axhline(node["cpu_limit"], color="grey", linestyle=":", linewidth=1)
        if node.get("memory_limit_bytes"):
            mem_ax.axhline(node["memory_limit_bytes"] / 2**20, color="grey", linestyle=":",
                           linewidth=1)
    cpu_ax.set_ylabel("CPU (cores)")
    mem_ax.set_ylabel("memory (MiB)")
    net_ax.set_ylabel("link (Mbit/s)")
    net_ax.set_xlabel("time since start (s)")
    for ax in (cpu_ax, mem_ax, net_ax):
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize="small", loc="upper right")
    cpu_ax.set_title(f"{stats.get('spec', '')} (dotted: limits)", fontsize="small")
    fig.tight_layout()
    out = Path(out)
    save_figure(fig, out, dpi=100)
    plt.close(fig)
    return out


def plot_file(stats_path: str | Path, out: str | Path) -> Path:
    return plot_stats(json.loads(Path(stats_path).read_text()), out)
