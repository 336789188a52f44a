"""The comparison's figures (matplotlib, Agg backend: no display needed). Each function draws one
PNG and returns its file name; `plots` draws all that the results have data for, headline first.
"""

from __future__ import annotations

from pathlib import Path

from thinwire.output import save_figure
from thinwire.train import quality
from thinwire.train.run_groups import by_rate, rate_bps

SPLIT_PARTS = (("compute", "compute"), ("selection", "top-k selection"),
               ("intra_node", "intra-node comm"), ("inter_node", "inter-node comm"),
               ("idle", "other / waiting"), ("sync", "sync (PyTorch hook, not split)"))


def _missed_at(setting: dict, run: dict) -> float:
    """Where a run that missed its target is drawn: at the budget, or where a race has none
    (0: compare --fault-tolerant) at the end of its training."""
    return setting["budget_s"] or run.get("train_time_s") or 0.0


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plots(results: dict, out: Path) -> list[str]:
    names = [time_to_target(results, out), quality_vs_time(results, out),
             bytes_on_wire(results, out), step_split(results, out), throughput(results, out)]
    if len(by_rate(results["runs"])) > 1:
        names.append(time_to_target_vs_rate(results, out))
    return [n for n in names if n]


def _ok(runs):
    return [r for r in runs if r.get("status") == "ok"]


def _metric_label(setting: dict) -> str:
    return "test accuracy (%)" if setting["metric"] == "test_accuracy" \
        else "held-out bits per byte"


def _scale(setting: dict, value: float) -> float:
    return 100 * value if setting["metric"] == "test_accuracy" else value


def time_to_target(results: dict, out: Path) -> str:
    plt = _plt()
    s, groups = results["setting"], by_rate(results["runs"])
    sign = ">=" if quality.METRICS[s["metric"]].higher_is_better else "<="
    height = 0.5 * len(results["setting"]["algorithms"]) + 1.8
    fig, axes = plt.subplots(len(groups), 1, figsize=(7.5, height * len(groups)), squeeze=False)
    for ax, (rate, runs) in zip(axes[:, 0], groups.items()):
        runs = sorted(runs, key=lambda r: (r.get("time_to_target_s") is None,
                                           r.get("time_to_target_s") or 0))
        ddp = next((r.get("time_to_target_s") for r in runs if r["algorithm"] == "ddp"), None)
        for i, run in enumerate(runs):
            t = run.get("time_to_target_s")
            if t is not None:
                ax.barh(i, t, color="tab:blue" if run["algorithm"] != "ddp" else "tab:grey")
                label = f" {t:.1f} s" + (f" ({t / ddp:.2f}x ddp)" if ddp else "")
            else:  # a miss: its budget, or without one (0) its whole training time
                ax.barh(i, _missed_at(s, run), color="none", edgecolor="tab:red", hatch="//")
                q = run.get("quality_at_budget")
                label = f" {run.get('status')}" if run.get("status") != "ok" else \
                    " missed" + (f" ({_scale(s, q):.3g} at the budget)" if q is not None else "")
            ax.text(t if t is not None else _missed_at(s, run), i, label, va="center",
                    fontsize=8)
        ax.set_yticks(range(len(runs)), [r["algorithm"] for r in runs])
        ax.invert_yaxis()
        ax.set_xlim(0, 1.6 * max([1.0] + [r.get("time_to_target_s") or _missed_at(s, r)
                                          for r in runs]))
        ax.set(xlabel="training time to target (s); hatched = not reached within the budget",
               title=f"time to {s['metric']} {sign} {s['target']:g}, inter-node {rate}")
        ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    save_figure(fig, out / "time_to_target.png", dpi=110)
    plt.close(fig)
    return "time_to_target.png"


def _focus(setting: dict, runs: list[dict]) -> tuple[float, float]:
    """The y range where the methods differ: around the target and the values reached."""
    metric, target = setting["metric"], _scale(setting, setting["target"])
    values = [_scale(setting, p[metric]) for r in runs for p in r.get("curve") or []
              if p.get(metric) is not None]
    if not values:
        return (0, 100) if metric == "test_accuracy" else (0, 8)
    if quality.METRICS[metric].higher_is_better:  # accuracy, in %: the target always shows
        best = max(values)
        return max(min(values), target - max(8.0, 2 * abs(best - target))), \
            min(max(best, target) + 1.0, 100.5)
    best = min(values)
    high = target + max(1.0, 2 * abs(target - best))
    low = min(best, target)
    return low - 0.1 * (high - low), min(high, max(values))


def quality_vs_time(results: dict, out: Path) -> str:
    plt = _plt()
    s, groups = results["setting"], by_rate(results["runs"])
    cols = min(2, len(groups))
    rows = -(-len(groups) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(6.8 * cols, 4.4 * rows), squeeze=False)
    for ax in axes.flat[len(groups):]:
        ax.set_visible(False)
    for ax, (rate, runs) in zip(axes.flat, groups.items()):
        for run in _ok(runs):
            curve = run.get("curve") or []
            ax.plot([p["train_time_s"] for p in curve],
                    [_scale(s, p[s["metric"]]) for p in curve], marker=".", markersize=3,
                    label=run["algorithm"], lw=1.4, color="grey" if run["algorithm"] == "ddp"
                    else None)
        ax.axhline(_scale(s, s["target"]), color="black", ls="--", lw=1,
                   label=f"target {_scale(s, s['target']):g}")
        ax.axvline(s["budget_s"], color="tab:red", ls=":", lw=1, label="budget")
        ax.set_ylim(*_focus(s, runs))
        ax.set(title=f"{s['metric'].replace('_', ' ')} against training time, inter-node "
                     f"{rate}", xlabel="training time (s, evaluation excluded)",
               ylabel=_metric_label(s))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="lower right" if quality.METRICS[s["metric"]].higher_is_better
                  else "upper right")
    fig.tight_layout()
    save_figure(fig, out / "quality_vs_time.png", dpi=110)
    plt.close(fig)
    return "quality_vs_time.png"


def _bars(results: dict, out: Path, key: str, fname: str, ylabel: str, title: str, fmt,
          log: bool = False, ratio_to_ddp: bool = False) -> str | None:
    plt = _plt()
    groups = by_rate(results["runs"])
    algorithms = list(dict.fromkeys(r["algorithm"] for r in results["runs"]))
    if not any(r.get(key) for r in results["runs"]):
        return None
    fig, ax = plt.subplots(figsize=(max(6.5, 1.1 * len(algorithms) * len(groups)), 4.4))
    width = 0.8 / len(groups)
    for i, (rate, runs) in enumerate(groups.items()):
        value = {r["algorithm"]: r.get(key) for r in runs}
        ddp = value.get("ddp")
        xs = [a + i * width for a in range(len(algorithms))]
        ys = [value.get(name) or 0 for name in algorithms]
        bars = ax.bar(xs, ys, width, label=f"inter-node {rate}" if len(groups) > 1 else None)
        for bar, name, y in zip(bars, algorithms, ys):
            if y:
                text = fmt(y) + (f"\n{y / ddp:.3g}x ddp" if ratio_to_ddp and ddp else "")
                ax.annotate(text, (bar.get_x() + bar.get_width() / 2, y), ha="center",
                            va="bottom", fontsize=7, xytext=(0, 2), textcoords="offset points")
    ax.set_xticks([a + width * (len(groups) - 1) / 2 for a in range(len(algorithms))],
                  algorithms, rotation=15)
    if log:
        ax.set_yscale("log")
    ax.margins(y=0.2)
    ax.set(ylabel=ylabel, title=title)
    if len(groups) > 1:
        ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    save_figure(fig, out / fname, dpi=110)
    plt.close(fig)
    return fname


def bytes_on_wire(results: dict, out: Path) -> str | None:
    return _bars(results, out, "inter_node_mb_per_iter", "bytes_on_wire.png",
                 "MB per step each node sends to the other (log scale)",
                 "bytes on the inter-node wire per step", lambda y: f"{y:.3g}", log=True,
                 ratio_to_ddp=True)


def throughput(results: dict, out: Path) -> str | None:
    return _bars(results, out, "samples_per_s", "throughput.png", "samples/s",
                 "throughput (whole steps, evaluation excluded)", lambda y: f"{y:.0f}",
                 ratio_to_ddp=True)


def step_split(results: dict, out: Path) -> str | None:
    """Stacked bars: where one mean step's time goes, per algorithm (first link rate)."""
    plt = _plt()
    rate, runs = next(iter(by_rate(results["runs"]).items()))
    runs = [r for r in _ok(runs) if r.get("step_split_ms")]
    if not runs:
        return None
    fig, ax = plt.subplots(figsize=(7.5, 0.5 * len(runs) + 1.8))
    for part, label in SPLIT_PARTS:
        left = [sum(r["step_split_ms"].get(p, 0) for p, _ in
                    SPLIT_PARTS[:[q for q, _ in SPLIT_PARTS].index(part)]) for r in runs]
        widths = [r["step_split_ms"].get(part, 0) for r in runs]
        if any(widths):
            ax.barh(range(len(runs)), widths, left=left, label=label)
    for i, run in enumerate(runs):
        ax.text(run["iter_ms"], i, f" {run['iter_ms']:.0f} ms", va="center", fontsize=8)
    ax.set_yticks(range(len(runs)), [r["algorithm"] for r in runs])
    ax.invert_yaxis()
    ax.set_xlim(0, 1.2 * max(r["iter_ms"] for r in runs))
    ax.set(xlabel="ms per step (mean; compute = this run's compute-only probe)",
           title=f"where a step's time goes, inter-node {rate}")
    ax.legend(fontsize=7, loc="lower right")
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    save_figure(fig, out / "step_split.png", dpi=110)
    plt.close(fig)
    return "step_split.png"


def time_to_target_vs_rate(results: dict, out: Path) -> str:
    import matplotlib.ticker

    plt = _plt()
    s = results["setting"]
    finite = [r for r in by_rate(results["runs"]) if rate_bps(r) != float("inf")]
    fig, ax = plt.subplots(figsize=(6.8, 4.4))
    for i, name in enumerate(dict.fromkeys(r["algorithm"] for r in results["runs"])):
        points = sorted((rate_bps(r["inter_node_bandwidth"]) / 1e6, r["time_to_target_s"])
                        for r in results["runs"] if r["algorithm"] == name
                        and r.get("time_to_target_s") and r["inter_node_bandwidth"] in finite)
        missed = sorted(rate_bps(r["inter_node_bandwidth"]) / 1e6 for r in results["runs"]
                        if r["algorithm"] == name and r.get("status") == "ok"
                        and r.get("time_to_target_s") is None
                        and r["inter_node_bandwidth"] in finite)
        # a miss breaks the line (NaN): no segment may suggest a time where the run missed
        drawn = sorted(points + [(m, float("nan")) for m in missed])
        line = ax.plot(*zip(*drawn), marker="o", label=name)[0] if points else None
        if missed:  # a miss sits on the budget line, as an x in the method's colour
            ax.plot([m * 1.04 ** i for m in missed], [s["budget_s"]] * len(missed), "x",
                    markersize=9, mew=2,
                    color=line.get_color() if line else None,
                    label=None if line else f"{name} (missed)")
    ax.axhline(s["budget_s"], color="tab:red", ls=":", lw=1, label="budget (x = missed)")
    ax.set_ylim(0, 1.1 * s["budget_s"])
    ax.set_xscale("log")
    ax.xaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
    ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.set_xticks(sorted(rate_bps(r) / 1e6 for r in finite))
    ax.set(xlabel="inter-node bandwidth (Mbit/s)", ylabel="training time to target (s)",
           title=f"time to {s['metric']} {s['target']:g} against link rate")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    fig.tight_layout()
    save_figure(fig, out / "time_to_target_vs_rate.png", dpi=110)
    plt.close(fig)
    return "time_to_target_vs_rate.png"
