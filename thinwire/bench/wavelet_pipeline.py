"""`thinwire bench wavelet-pipeline`: model-parallel tick-tock against plain gpipe.

One rank per stage (one emulated node each with ``--cluster``, where ``--node-cpus`` budgets
every node), the pipeline engine of ``thinwire pipeline train``, three runs interleaved in one
launch and repeated:

* ``gpipe`` with M/2 micro-batches per update: one wave, as Wavelet compares (the tock wave is
  a second wave of the same size on the same devices);
* ``gpipe`` with M: the same micro-batches per update as tick-tock (the same arithmetic);
* ``ticktock`` with M: two waves of M/2, the tock on the reversed placement.

Per run samples/s (all runs see the same ``--samples``); ratios are taken within a repetition
and the table gives their median. ``ideal`` is the bubble model (forward 1, backward 2, free
messages): busy fraction of a rank.
"""

from __future__ import annotations

import json
import logging
import statistics
import tempfile
from pathlib import Path

from thinwire.bench.report import format_table, save_if_asked

log = logging.getLogger(__name__)
COLUMNS = ("schedule", "group", "per_wave", "samples", "samples_per_s", "vs_gpipe_one_wave",
           "vs_gpipe_same_m", "cpu_ms_per_sample", "budget_bound_samples_per_s",
           "steady_utilisation_min", "steady_utilisation_mean",
           "ideal_utilisation", "repeats")


def ideal_utilisation(schedule: str, stages: int, group: int, groups: int = 4) -> float:
    from thinwire.pipeline import ticktock as tt

    if schedule == "gpipe":
        return group / (group + stages - 1)
    ops = tt.build(stages, group * groups, group)
    return 3 * group * groups / tt.makespan(ops, stages, group)


def runs_of(args) -> list:
    from thinwire.pipeline.config import PipelineConfig

    M = args.group
    if M < 2 or M % 2:
        raise ValueError(f"--group must be even and >= 2 (two waves of M/2), got {M}")
    common = dict(stages=args.stages, dataset=args.dataset, hidden=_ints(args.hidden),
                  cuts=_ints(args.cuts) if args.cuts else None, micro_batch=args.micro_batch,
                  epochs=1, train_samples=args.samples, lr=args.lr, momentum=args.momentum,
                  seed=0, timeout_s=args.timeout)
    return [PipelineConfig(schedule="gpipe", group=M // 2, **common),
            PipelineConfig(schedule="gpipe", group=M, **common),
            PipelineConfig(schedule="ticktock", group=M, **common)]


def run(args) -> dict:
    from thinwire.cluster.cli import spec_from_args
    from thinwire.cluster.launch import run as launch
    from thinwire.pipeline.config import to_argv

    configs = runs_of(args)
    for cfg in configs:
        cfg.validate()
    args.nodes, args.ranks_per_node = args.stages, 1
    if not args.cluster:
        args.no_shaping = True
    spec = spec_from_args(args)
    Path(args.png).resolve().parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="thinwire-bench-wavelet-pipeline-") as scratch:
        command = ["-m", "thinwire.bench.pipeline_worker", "--out", scratch,
                   "--repeats", str(args.repeats), "--png", str(Path(args.png).resolve())]
        for cfg in configs:
            command += ["--config", json.dumps(to_argv(cfg))]
        status = launch(spec, command, timeout_s=args.timeout * len(configs) * args.repeats + 120)
        if status != 0:
            raise RuntimeError(f"the pipeline launch failed with status {status}")
        results = json.loads((Path(scratch) / "results.json").read_text())
    return {"settings": {k: v for k, v in vars(args).items() if k != "func"},
            "shaped": spec.shaping, "runs": results, "table": table(results, args)}


def table(results: list[dict], args) -> list[dict]:
    M = args.group

    def key(r):
        return (r["schedule"], r["group"])

    rate = {(key(r), r["repeat"]): r["samples_per_s"] for r in results}
    rows = []
    for schedule, group in (("gpipe", M // 2), ("gpipe", M), ("ticktock", M)):
        runs = [r for r in results if key(r) == (schedule, group)]
        reps = sorted(r["repeat"] for r in runs)
        mine = [rate[((schedule, group), k)] for k in reps]
        steady = [statistics.median(r["per_stage"][s]["steady_utilisation"] for r in runs)
                  for s in range(args.stages)]
        rows.append({
            "schedule": schedule, "group": group,
            "per_wave": M // 2 if schedule == "ticktock" else group,
            "samples": runs[0]["samples"], "samples_per_s": statistics.median(mine),
            "per_repeat": mine,
            "vs_gpipe_one_wave": statistics.median(
                rate[((schedule, group), k)] / rate[(("gpipe", M // 2), k)] for k in reps),
            "vs_gpipe_same_m": statistics.median(
                rate[((schedule, group), k)] / rate[(("gpipe", M), k)] for k in reps),
            # the busiest rank's CPU seconds per sample, and what a node budget of
            # --node-cpus allows at that cost (the schedule cannot go faster than this)
            "cpu_ms_per_sample": statistics.median(
                1000 * max(r["cpu_s"]) / r["samples"] for r in runs),
            "budget_bound_samples_per_s": (statistics.median(
                args.node_cpus * r["samples"] / max(r["cpu_s"]) for r in runs)
                if getattr(args, "node_cpus", None) else None),
            "steady_utilisation_min": min(steady),
            "steady_utilisation_mean": sum(steady) / len(steady),
            "ideal_utilisation": ideal_utilisation(schedule, args.stages, group),
            "repeats": len(runs)})
    return rows


def _ints(text: str) -> list[int]:
    return [int(t) for t in text.split(",") if t.strip()]


def _main(args) -> int:
    payload = run(args)
    print(format_table(payload["table"], COLUMNS))
    print(f"timelines: {args.png}")
    save_if_asked(args.json, payload)
    return 0


def register(bench_subparsers) -> None:
    from thinwire.cluster.cli import add_spec_options

    p = bench_subparsers.add_parser(
        "wavelet-pipeline", help="model-parallel tick-tock (Wavelet) against plain gpipe")
    p.add_argument("--stages", type=int, default=4, help="pipeline stages (one rank/node each)")
    p.add_argument("--dataset", default="mnist5k", choices=["mnist5k", "digits"],
                   help="training data")
    p.add_argument("--hidden", default="1024,1024,1024,1024", help="MLP hidden widths")
    p.add_argument("--cuts", default="1,2,3", help="layer indices to cut at ('' = balanced)")
    p.add_argument("--micro-batch", type=int, default=16, help="samples per micro-batch")
    p.add_argument("--group", type=int, default=8,
                   help="M: tick-tock's micro-batches per update (two waves of M/2); gpipe runs "
                        "with M/2 and with M")
    p.add_argument("--samples", type=int, default=800, help="training samples per run")
    p.add_argument("--lr", type=float, default=0.02, help="SGD learning rate")
    p.add_argument("--momentum", type=float, default=0.9, help="SGD momentum")
    p.add_argument("--repeats", type=int, default=3, help="repetitions of the three runs")
    p.add_argument("--timeout", type=float, default=300.0, help="per run, seconds")
    p.add_argument("--cluster", action="store_true",
                   help="on the emulated cluster (one stage per node; root), else loopback")
    p.add_argument("--png", default="results/wavelet/pipeline_timelines.png",
                   help="timelines of the last repetition")
    p.add_argument("--json", metavar="PATH", help="write the results as JSON here")
    add_spec_options(p, default_ranks=1)
    p.set_defaults(func=_main)
