"""Per-stage utilisation (busy / wall) and the timeline plot of a run."""

from __future__ import annotations

from typing import Sequence

from thinwire.output import save_figure

COLOURS = {"F": "#4c72b0", "B": "#dd8452", "U": "#55a868"}


def busy_within(events: Sequence, t0: float, t1: float) -> float:
    """Seconds of compute inside [t0, t1] (events clipped to the window)."""
    return sum(max(0.0, min(e[3], t1) - max(e[2], t0)) for e in events)


def utilisation(stages: Sequence[dict], steady_fraction: float = 0.6) -> list[dict]:
    """Per stage: busy/wall over the whole run, and over the steady state, taken as the middle
    ``steady_fraction`` of the run's wall time (fill and drain of ``pb`` fall outside it; the
    bubbles of the flushed schedules recur throughout, so they stay inside)."""
    t0 = min(st["t_start"] for st in stages)
    t1 = max(st["t_end"] for st in stages)
    wall = t1 - t0
    a = t0 + wall * (1 - steady_fraction) / 2
    b = t1 - wall * (1 - steady_fraction) / 2
    rows = []
    for st in stages:
        rows.append({
            "stage": st["stage"], "delay": st["delay"],
            "busy_s": st["busy_s"], "wall_s": wall,
            "utilisation": st["busy_s"] / wall if wall > 0 else 0.0,
            "steady_utilisation": busy_within(st["events"], a, b) / (b - a) if b > a else 0.0,
        })
    return rows


def plot(runs: Sequence[tuple[str, Sequence[dict]]], path: str, window_s: float | None = None) -> None:
    """One panel per run (label, stage summaries): a row per stage, a bar per operation.
    ``window_s`` shows only the first seconds (thousands of operations blur together)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    height = 1.0 + sum(0.9 + 0.35 * len(stages) for _, stages in runs)
    fig, axes = plt.subplots(len(runs), 1, figsize=(11, height), squeeze=False)
    for ax, (label, stages) in zip(axes[:, 0], runs):
        t0 = min(st["t_start"] for st in stages)
        for st in stages:
            bars = {}
            for kind, _, a, b in st["events"]:
                if window_s is not None and a - t0 > window_s:
                    break
                bars.setdefault(kind, []).append(((a - t0) * 1e3, max((b - a) * 1e3, 1e-3)))
            for kind, spans in bars.items():
                ax.broken_barh(spans, (st["stage"] - 0.4, 0.8), color=COLOURS[kind])
        ax.set_yticks(range(len(stages)))
        ax.set_yticklabels([f"stage {st['stage']}" for st in stages])
        ax.invert_yaxis()
        ax.set_title(label, fontsize=9)
        ax.set_xlabel("ms since start")
    axes[0, 0].legend(handles=[Patch(color=c, label=k) for k, c in
                               (("forward", COLOURS["F"]), ("backward", COLOURS["B"]),
                                ("update", COLOURS["U"]))], loc="upper right", fontsize=8)
    fig.tight_layout()
    save_figure(fig, path, dpi=110)
    plt.close(fig)
