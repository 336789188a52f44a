"""The comparison's table, `report.md` and plots (matplotlib, Agg backend: no display needed)."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from thinwire.output import format_table

COLUMNS = ["algorithm", "samples_per_s", "speedup_vs_ddp", "comm_share", "sync_ms_per_iter",
           "inter_node_mb_per_iter", "test_accuracy", "time_to_target_s"]
HEADERS = {"samples_per_s": "samples/s", "speedup_vs_ddp": "x ddp",
           "comm_share": "comm share", "sync_ms_per_iter": "sync ms/iter",
           "inter_node_mb_per_iter": "inter-node MB/iter", "test_accuracy": "test acc",
           "time_to_target_s": "s to target"}


def annotate(runs: list[dict]) -> list[dict]:
    """Add each run's speed-up over `ddp` at the same link rate (when ddp ran there)."""
    ddp = {r["inter_node_bandwidth"]: r.get("samples_per_s") for r in runs
           if r["algorithm"] == "ddp" and r.get("status") == "ok"}
    for run in runs:
        base, mine = ddp.get(run["inter_node_bandwidth"]), run.get("samples_per_s")
        run["speedup_vs_ddp"] = mine / base if base and mine else None
    return runs


def by_rate(runs: list[dict]) -> dict[str, list[dict]]:
    groups: dict[str, list[dict]] = defaultdict(list)
    for run in runs:
        groups[run["inter_node_bandwidth"]].append(run)
    return dict(groups)


def _cells(run: dict) -> dict:
    row = {}
    for col in COLUMNS:
        value = run.get(col)
        if value is None:
            row[HEADERS.get(col, col)] = "-" if run.get("status") == "ok" else run.get("status")
        elif col == "comm_share":
            row[HEADERS[col]] = f"{100 * value:.0f}%"
        elif col == "test_accuracy":
            row[HEADERS[col]] = f"{100 * value:.2f}%"
        elif col == "speedup_vs_ddp":
            row[HEADERS[col]] = f"{value:.2f}"
        elif isinstance(value, float):
            row[HEADERS.get(col, col)] = f"{value:.4g}"
        else:
            row[HEADERS.get(col, col)] = value
    return row


def tables(results: dict) -> list[tuple[str, str]]:
    """One (title, table) per link rate."""
    out = []
    for rate, runs in by_rate(results["runs"]).items():
        ddp = next((r for r in runs if r["algorithm"] == "ddp" and r.get("comm_share")), None)
        title = f"inter-node {rate}"
        if ddp is not None:
            title += (f": ddp spends {100 * ddp['comm_share']:.0f}% of its iteration "
                      f"communicating ({ddp['sync_ms_per_iter']:.0f} of {ddp['iter_ms']:.0f} ms)")
        out.append((title, format_table([_cells(r) for r in runs],
                                        [HEADERS.get(c, c) for c in COLUMNS])))
    return out


def print_tables(results: dict) -> None:
    for title, table in tables(results):
        print(f"\n{title}\n{table}")


def write_all(results: dict, out: Path) -> None:
    _plots(results, out)
    (out / "report.md").write_text(markdown(results))


def markdown(results: dict) -> str:
    s = results["setting"]
    lines = ["# thinwire compare", "",
             f"Model `{s['model']}`, {s['nodes']} nodes x {s['ranks_per_node']} ranks, batch "
             f"{s['batch_size']} per rank, {s['epochs']} epoch(s)"
             + (f" (at most {s['max_iters']} steps)" if s["max_iters"] else "")
             + f", seed {s['seed']}, density {s['density']} ({s['selector']}), PowerSGD rank "
             f"{s['powersgd_rank']}, {'shaped' if s['shaping'] else 'UNSHAPED (loopback)'} links,"
             f" target accuracy {s['target_accuracy']}.", "",
             "samples/s and sync ms/iter cover whole steps after the first two; sync ms/iter is "
             "the mean step time minus the same run's compute-only step time (measured on a "
             "copy of the model without communication, all ranks at once); comm share = sync / "
             "step time; inter-node MB/iter = bytes each node sent over its link per step "
             "(interface counters when shaped, thinwire's traffic model otherwise).", ""]
    for title, table in tables(results):
        lines += [f"## {title}", "", "```", table, "```", ""]
    lines += ["![accuracy against training time](accuracy_vs_time.png)", "",
              "![throughput](throughput.png)", ""]
    if len(by_rate(results["runs"])) > 1:
        lines += ["![speed-up against bandwidth](speedup_vs_bandwidth.png)", ""]
    failed = [r for r in results["runs"] if r.get("status") != "ok"]
    for run in failed:
        lines.append(f"- {run['algorithm']} @ {run['inter_node_bandwidth']}: {run['status']}, "
                     f"see {run.get('log')}")
    return "\n".join(lines) + "\n"


def _plots(results: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    from thinwire.train.compare import rate_bps

    groups = by_rate(results["runs"])
    rates = list(groups)
    fig, axes = plt.subplots(1, len(rates), figsize=(6 * len(rates), 4.2), squeeze=False)
    for ax, rate in zip(axes[0], rates):
        for run in groups[rate]:
            curve = run.get("curve") or []
            if curve:
                ax.plot([p["train_time_s"] for p in curve],
                        [100 * p["test_accuracy"] for p in curve], marker=".",
                        label=run["algorithm"])
        ax.set(title=f"inter-node {rate}", xlabel="training time (s)", ylabel="test accuracy (%)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "accuracy_vs_time.png", dpi=110)
    plt.close(fig)

    algorithms = list(dict.fromkeys(r["algorithm"] for r in results["runs"]))
    fig, ax = plt.subplots(figsize=(max(6, 1.2 * len(algorithms) * len(rates)), 4.2))
    width = 0.8 / len(rates)
    for i, rate in enumerate(rates):
        speed = {r["algorithm"]: r.get("samples_per_s") or 0 for r in groups[rate]}
        ax.bar([a + i * width for a in range(len(algorithms))],
               [speed.get(name, 0) for name in algorithms], width, label=f"inter-node {rate}")
    ax.set_xticks([a + width * (len(rates) - 1) / 2 for a in range(len(algorithms))], algorithms,
                  rotation=20)
    ax.set(ylabel="samples/s", title="throughput")
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(out / "throughput.png", dpi=110)
    plt.close(fig)

    if len(rates) > 1:
        fig, ax = plt.subplots(figsize=(6.5, 4.2))
        finite = [r for r in rates if rate_bps(r) != float("inf")]
        for name in algorithms:
            points = sorted((rate_bps(r["inter_node_bandwidth"]) / 1e6, r["speedup_vs_ddp"])
                            for r in results["runs"] if r["algorithm"] == name
                            and r.get("speedup_vs_ddp") and r["inter_node_bandwidth"] in finite)
            if points:
                ax.plot(*zip(*points), marker="o", label=name)
        ax.set_xscale("log")
        ax.xaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.set_xticks(sorted(rate_bps(r) / 1e6 for r in finite))
        ax.set(xlabel="inter-node bandwidth (Mbit/s)", ylabel="speed-up over ddp (samples/s)",
               title="speed-up against link rate")
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(out / "speedup_vs_bandwidth.png", dpi=110)
        plt.close(fig)
