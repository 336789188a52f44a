"""One figure per wave run: the phases of each wave on a node, and the node's memory."""

from __future__ import annotations

from thinwire.output import save_figure

COLOURS = {"forward": "tab:blue", "backward": "tab:green", "sync": "tab:red",
           "update": "tab:purple", "wait": "lightgrey"}


def plot_runs(runs: list[tuple[str, dict]], path: str, node: int = 0, window_steps: int = 4,
              limit_bytes: int | None = None) -> None:
    """``runs``: (label, summary of the wave loop). For each, a phase timeline of the node's
    processes over ``window_steps`` timed steps and their memory (process RssAnon, node cgroup
    usage) over the same window."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(3, len(runs), figsize=(7 * len(runs), 10), squeeze=False,
                             gridspec_kw={"height_ratios": [1, 2, 1.5]})
    mib = 2 ** 20
    for column, (label, summary) in enumerate(runs):
        ranks = [r for r in summary["ranks"] if r["node"] == node]
        t0 = summary["timed_from"]
        steps = range(2, 2 + window_steps)
        t1 = max((e["end"] for r in ranks for e in r["events"] if e["step"] in steps),
                 default=t0 + 1)
        lanes, memory = axes[0][column], axes[1][column]
        for lane, record in enumerate(ranks):
            for event in record["events"]:
                if event["step"] in steps and event["end"] is not None:
                    lanes.barh(lane, event["end"] - event["start"], left=event["start"] - t0,
                               color=COLOURS[event["kind"]], height=0.6)
            name = ("tick", "tock")[record["wave"]] if summary["waves"] == 2 else "single"
            samples = [s for s in record["memory"] if t0 <= s[0] <= t1]
            memory.plot([s[0] - t0 for s in samples], [(s[1] or 0) / mib for s in samples],
                        label=f"{name} (rank {record['rank']}) RssAnon")
            node_samples = [s for s in samples if s[2] is not None]
            if node_samples:
                memory.plot([s[0] - t0 for s in node_samples], [s[2] / mib for s in node_samples],
                            color="black", label="node cgroup")
        lanes.set_yticks(range(len(ranks)),
                         [f"rank {r['rank']} {('tick', 'tock')[r['wave']]}"
                          if summary["waves"] == 2 else f"rank {r['rank']}" for r in ranks])
        lanes.set_title(f"{label}: node {node}, steps {steps.start}-{steps.stop - 1}")
        for kind, colour in COLOURS.items():
            lanes.barh(0, 0, color=colour, label=kind)
        lanes.legend(loc="upper right", fontsize=7, ncol=5)
        if limit_bytes:
            memory.axhline(limit_bytes / mib, color="red", linestyle=":", label="node limit")
        memory.set_xlabel("seconds from the first timed step")
        memory.set_ylabel("MiB")
        memory.legend(fontsize=7)
        for axis in (lanes, memory):
            axis.set_xlim(0, t1 - t0)
        whole = axes[2][column]  # the launcher's accounting: the node cgroup, whole run
        for number, series in enumerate(summary.get("node_series") or []):
            points = [(t, m) for t, m in zip(series["t"], series["memory_bytes"]) if m]
            whole.plot([p[0] for p in points], [p[1] / mib for p in points],
                       label=f"node {number} cgroup (every 100 ms)")
        if limit_bytes:
            whole.axhline(limit_bytes / mib, color="red", linestyle=":", label="node limit")
        whole.set_xlabel("seconds from the node's start (whole run)")
        whole.set_ylabel("MiB")
        whole.legend(fontsize=7)
    fig.tight_layout()
    save_figure(fig, path, dpi=110)
    plt.close(fig)
