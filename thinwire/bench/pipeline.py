"""`thinwire bench pipeline`: pipelined backpropagation against its baselines.

* ``--part accuracy`` (single-process emulation, fast): momentum SGD at batch B, the same at batch
  one with the scaled hyper-parameters, and ``pb`` at batch one with SC+LWP, without repairs, and
  with each alone, on the same samples in the same order; per seed, then the median.
* ``--part throughput`` (the multi-process engine, one rank per stage, launched like
  ``thinwire pipeline train``: loopback by default, ``--cluster`` for the emulated nodes): ``pb``,
  ``gpipe`` and ``1f1b`` with M micro-batches per update, each repeated; per-stage utilisation
  (busy/wall, whole run and steady state), samples/s (median over repeats) and the ratio to
  ``gpipe`` measured in the same launch; one PNG with the three timelines.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import tempfile
from pathlib import Path

from thinwire.bench.report import format_table, save_if_asked

log = logging.getLogger(__name__)

ACCURACY_COLUMNS = ("run", "batch", "lr", "momentum", "samples", "test_accuracy",
                    "test_accuracy_min", "test_accuracy_max", "diff_vs_sgd", "seeds")
THROUGHPUT_COLUMNS = ("schedule", "micro_batch", "group", "samples", "samples_per_s",
                      "vs_gpipe", "utilisation_min", "steady_utilisation_min",
                      "steady_utilisation_mean", "ideal_utilisation", "repeats")


def accuracy(args) -> dict:
    import torch

    from thinwire.bench.pipeline_study import accuracy_study

    torch.set_num_threads(1)
    rows = accuracy_study(args.dataset, _ints(args.hidden), args.stages, args.epochs, args.batch,
                          args.lr, args.momentum, args.seeds, variants=args.variants)
    table = []
    sgd = statistics.median(r["test_accuracy"] for r in rows if r["batch"] == args.batch)
    for run in dict.fromkeys(r["run"] for r in rows):
        accs = [r["test_accuracy"] for r in rows if r["run"] == run]
        first = next(r for r in rows if r["run"] == run)
        med = statistics.median(accs)
        table.append({"run": run, "batch": first["batch"], "lr": first["lr"],
                      "momentum": first["momentum"], "samples": first["samples"],
                      "test_accuracy": med, "test_accuracy_min": min(accs),
                      "test_accuracy_max": max(accs), "diff_vs_sgd": med - sgd,
                      "seeds": len(accs)})
    return {"part": "accuracy", "settings": vars_of(args), "runs": rows, "table": table}


def ideal_utilisation(schedule: str, stages: int, group: int) -> float:
    """Steady-state busy fraction with equal stage costs and free messages: 1 for ``pb``,
    M / (M + S - 1) for the flushed schedules (the bubble is (S-1)/(M+S-1))."""
    return 1.0 if schedule == "pb" else group / (group + stages - 1)


def throughput(args) -> dict:
    from thinwire.cluster.cli import spec_from_args
    from thinwire.cluster.launch import run
    from thinwire.pipeline.config import PipelineConfig, to_argv

    from thinwire.pipeline.config import scale_for_batch_one

    configs = []
    for schedule in args.schedules:
        # pb steps once per micro-batch: the rule moves (lr, momentum) from --batch to m.
        lr, momentum = (scale_for_batch_one(args.lr, args.momentum,
                                            max(1, args.batch // args.micro_batch))
                        if schedule == "pb" else (args.lr, args.momentum))
        configs.append(PipelineConfig(lr=lr, momentum=momentum,
            schedule=schedule, stages=args.stages, dataset=args.dataset, hidden=_ints(args.hidden),
            cuts=_ints(args.cuts) if args.cuts else None,
            micro_batch=args.micro_batch, group=args.group, epochs=1,
            train_samples=args.samples, seed=0, timeout_s=args.timeout))
    args.nodes, args.ranks_per_node = args.stages, 1
    if not args.cluster:
        args.no_shaping = True
    spec = spec_from_args(args)
    with tempfile.TemporaryDirectory(prefix="thinwire-bench-pipeline-") as scratch:
        out = Path(scratch)
        command = ["-m", "thinwire.bench.pipeline_worker", "--out", str(out),
                   "--repeats", str(args.repeats), "--png", str(Path(args.png).resolve())]
        for cfg in configs:
            command += ["--config", json.dumps(to_argv(cfg))]
        status = run(spec, command, timeout_s=args.timeout * len(configs) * args.repeats + 120)
        if status != 0:
            raise RuntimeError(f"the pipeline launch failed with status {status}")
        results = json.loads((out / "results.json").read_text())
    table = []
    gpipe = [r["samples_per_s"] for r in results if r["schedule"] == "gpipe"]
    gpipe_rate = statistics.median(gpipe) if gpipe else None
    for schedule in args.schedules:
        runs = [r for r in results if r["schedule"] == schedule]
        rate = statistics.median(r["samples_per_s"] for r in runs)
        steady = [statistics.median(r["per_stage"][s]["steady_utilisation"] for r in runs)
                  for s in range(args.stages)]
        table.append({
            "schedule": schedule, "micro_batch": args.micro_batch,
            "group": args.group if schedule != "pb" else None, "samples": runs[0]["samples"],
            "samples_per_s": rate, "vs_gpipe": rate / gpipe_rate if gpipe_rate else None,
            "utilisation_min": min(statistics.median(r["per_stage"][s]["utilisation"]
                                                     for r in runs) for s in range(args.stages)),
            "steady_utilisation_min": min(steady),
            "steady_utilisation_mean": sum(steady) / len(steady),
            "ideal_utilisation": ideal_utilisation(schedule, args.stages, args.group),
            "repeats": len(runs)})
    return {"part": "throughput", "settings": vars_of(args), "shaped": spec.shaping,
            "runs": results, "table": table}


def vars_of(args) -> dict:
    return {k: v for k, v in vars(args).items() if k != "func"}


def _ints(text: str) -> list[int]:
    return [int(t) for t in text.split(",") if t.strip()]


def _main(args: argparse.Namespace) -> int:
    payload = {}
    if args.part in ("accuracy", "all"):
        payload["accuracy"] = accuracy(args)
        print(format_table(payload["accuracy"]["table"], ACCURACY_COLUMNS))
    if args.part in ("throughput", "all"):
        payload["throughput"] = throughput(args)
        print(format_table(payload["throughput"]["table"], THROUGHPUT_COLUMNS))
        print(f"timelines: {args.png}")
    save_if_asked(args.json, payload)
    return 0


def register(bench_subparsers) -> None:
    from thinwire.cluster.cli import add_spec_options

    p = bench_subparsers.add_parser(
        "pipeline", help="pipelined backprop (pb, SC, LWP) vs SGD, gpipe and 1f1b")
    p.add_argument("--part", default="all", choices=["accuracy", "throughput", "all"],
                   help="accuracy (pb against SGD), throughput (against gpipe and 1f1b) or both")
    p.add_argument("--dataset", default="mnist5k", choices=["mnist5k", "digits"],
                   help="data set of the accuracy part")
    p.add_argument("--hidden", default="256,128,64", help="MLP hidden widths (len+1 layers)")
    p.add_argument("--stages", type=int, default=4, help="pipeline stages")
    p.add_argument("--cuts", default=None, help="throughput part: layer indices (default balanced)")
    p.add_argument("--epochs", type=int, default=3, help="accuracy part")
    p.add_argument("--batch", type=int, default=32, help="SGD batch the hyper-parameters are for")
    p.add_argument("--lr", type=float, default=0.02, help="SGD learning rate at --batch")
    p.add_argument("--momentum", type=float, default=0.9, help="SGD momentum at --batch")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2],
                   help="accuracy part: seeds (one run each)")
    p.add_argument("--variants", nargs="+", default=["sc+lwp", "none", "sc", "lwp"],
                   choices=["sc+lwp", "sc+lwp-w", "none", "sc", "lwp", "lwp-w"],
                   help="accuracy part: pb repairs (lwp-w: the weight-difference form of LWP)")
    p.add_argument("--schedules", nargs="+", default=["pb", "gpipe", "1f1b"],
                   choices=["pb", "gpipe", "1f1b"], help="throughput part")
    p.add_argument("--micro-batch", type=int, default=1, help="throughput part: m")
    p.add_argument("--group", type=int, default=4, help="throughput part: M for gpipe/1f1b")
    p.add_argument("--samples", type=int, default=400, help="throughput part: per run")
    p.add_argument("--repeats", type=int, default=3, help="throughput part")
    p.add_argument("--timeout", type=float, default=300.0, help="per run, seconds")
    p.add_argument("--cluster", action="store_true",
                   help="throughput part on the emulated cluster (one stage per node; root)")
    p.add_argument("--png", default="pipeline_timelines.png", help="throughput part: timelines")
    p.add_argument("--json", metavar="PATH", help="write the results as JSON here")
    add_spec_options(p, default_ranks=1)
    p.set_defaults(func=_main)
