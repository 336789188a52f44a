"""`thinwire bench ft-cluster`: a compare workload's time to target on the emulated cluster,
undisturbed and under a failure schedule, fault-tolerant against checkpoint-restart, in one race.

Each repeat runs, one after the other (so that drift of the machine hits all alike):

- ``undisturbed``: `python -m thinwire.train.ft_job` on `thinwire cluster run
  --fault-tolerant`, no failure;
- ``fault-tolerant``: the same under ``--fail`` (default: node 1 killed 5 s into training, back
  15 s later, the issue's "back 15 s later"): the other nodes train on, the node heals and
  rejoins (thinwire.ft.per_step);
- ``checkpoint-restart``: `thinwire train` with compare's recipe for the workload, under the same
  schedule, on `thinwire cluster run --max-restarts`: torchrun restarts every node's ranks after
  the failure, the job forms again when the lost node's launcher is back, and resumes from
  thinwire's checkpoint, written every ``--checkpoint-every`` steps (`--resume-if-present`);
- ``torchft-ddp-fp16``: torchft's own fault-tolerant DDP with fp16 gradients under the same
  schedule (`ft_job --peer torchft-ddp-fp16`: every process its own replica group, torchft's
  defaults; thinwire.train.ft_ddp_peer).

Per run:

- ``time_to_target_s``: wall clock from the start of training (every node up, the failure
  schedule's clock) to the evaluation that reached the workload's target; evaluation,
  restarts and lost work included: what a user waits;
- ``vs_undisturbed``, ``vs_checkpoint_restart``, ``vs_torchft``: the fault-tolerant run's
  time over the undisturbed, the checkpoint-restart and the torchft run's, in the same repeat;
- ``rejoin_s``: from the returning node's worker processes being created to its first quorum
  (its healing included; torchrun's own start comes before and is not counted);
- ``in_quorum_s``: from the same creation to the quorum taking the node in (the start of its
  healing: the rest of ``rejoin_s`` is the state crossing the link);
- ``rejoin_parts``: where its rejoin went, seconds from the processes' creation to the end
  of each stage of local rank 0 (imports, the node's process group, model and data, the
  Manager, the barrier with its node-mates, the first quorum with healing), in the JSON;
  ``rejoin_s``, ``in_quorum_s`` and ``rejoin_parts`` are node 1's last return's (the one
  that trained to the end);
- ``rejoins``: every return of every node, in the order they started (node, ``in_quorum_s``,
  ``rejoin_s``), in the JSON; ``in_quorum_max_s``: the slowest of them into the quorum;
- ``kills``: nodes the schedule killed before the run ended (later events never happen);
- ``restarts``: times checkpoint-restart resumed from its checkpoint;
- ``rolled_back``: steps node 0 undid;
- ``status``: the job's exit status (124: it hung past the timeout).
"""

from __future__ import annotations

import argparse
import dataclasses
import io
import json
import statistics
import tempfile
from pathlib import Path

from thinwire.bench.report import format_table, save_if_asked
from thinwire.cliargs import integer

RUNS = ("undisturbed", "fault-tolerant", "checkpoint-restart", "torchft-ddp-fp16")
COMPARED = (("undisturbed", "vs_undisturbed"), ("checkpoint-restart", "vs_checkpoint_restart"),
            ("torchft-ddp-fp16", "vs_torchft"))
COLUMNS = ("repeat", "run", "status", "time_to_target_s", "final",
           *(column for _, column in COMPARED), "rejoin_s", "in_quorum_s", "in_quorum_max_s",
           "kills", "restarts", "rolled_back", "quorums")
MAX_RESTARTS = 20  # torchrun's restarts of the checkpoint-restart run (one per failure)


def _fault_tolerant(spec, workload: str, algorithm: str, max_steps: int,
                    timeout_s: float, peer: str | None = None,
                    target: float | None = None, eval_every: int = 0) -> dict:
    from thinwire.cluster import run as cluster_run

    how = (["--peer", peer] if peer else ["--algorithm", algorithm]) + \
        (["--target", str(target)] if target is not None else []) + \
        (["--eval-every", str(eval_every)] if eval_every else [])
    with tempfile.TemporaryDirectory() as out:
        log = io.StringIO()
        status = cluster_run(spec, ["-m", "thinwire.train.ft_job", "--workload", workload,
                                    *how, "--max-steps", str(max_steps), "--out", out],
                             timeout_s=timeout_s, output=log, stats_path=f"{out}/stats.json")
        nodes = {int(p.stem[4:]): json.loads(p.read_text()) for p in Path(out).glob("node*.json")}
        kills = _kills(_read_json(Path(out) / "stats.json"))
        rejoins = _rejoins(Path(out))
    first = nodes.get(0, {})
    reached = first.get("reached")
    back = nodes.get(1, {})
    return {"status": status,
            "time_to_target_s": reached["unix_time"] - first["began_at"] if reached else None,
            "final": (first.get("curve") or [{}])[-1].get(first.get("metric")),
            "steps": first.get("step"), "rolled_back": first.get("rolled_back"),
            "quorums": " ".join(f"{n}@{s}" for s, n in first.get("quorums", [])),
            "kills": kills,
            "rejoin_s": back["joined_at"] - back["started_at"]
            if spec.failure_schedule and back.get("joined_at") else None,
            "in_quorum_s": back.get("timeline_s", {}).get("in_quorum")
            if spec.failure_schedule and back.get("joined_at") else None,
            "rejoin_parts": {k: round(v, 3) for k, v in back.get("timeline_s", {}).items()}
            if spec.failure_schedule and back.get("joined_at") else None,
            **rejoins,
            "log_tail": None if status == 0 else _failure_excerpt(log.getvalue())}


def _rejoins(out: Path) -> dict:
    """``rejoins`` and ``in_quorum_max_s`` from the returning nodes' own records
    (:func:`thinwire.train.ft_job.write_rejoin`), in the order they started."""
    from thinwire.train.ft_job import REJOIN_GLOB

    records = sorted((json.loads(p.read_text()) for p in out.glob(REJOIN_GLOB)),
                     key=lambda r: r["started_at"])
    rejoins = [{"node": r["node"], "in_quorum_s": r["timeline_s"].get("in_quorum"),
                "rejoin_s": r["timeline_s"].get("first_quorum")} for r in records]
    into = [r["in_quorum_s"] for r in rejoins if r["in_quorum_s"] is not None]
    return {"rejoins": rejoins, "in_quorum_max_s": max(into) if into else None}


def restart_config(workload: str, algorithm: str, ranks_per_node: int, directory: str,
                   checkpoint_every: int, target: float | None = None, eval_every: int = 0):
    """compare's run of the workload, checkpointing every ``checkpoint_every`` steps into
    ``directory`` and resuming from it after a restart (no budget: it runs to the target)."""
    from thinwire.train import race_config

    cfg = race_config.run_config(workload, algorithm, {}, ranks_per_node=ranks_per_node,
                                 budget_s=0.0, target=target, eval_every=eval_every)
    # no compute probe: the fault-tolerant job has none, and a restart would repeat it
    return dataclasses.replace(cfg, checkpoint=directory, checkpoint_every=checkpoint_every,
                               resume_if_present=True, compute_probe_iters=0).validate()


def _checkpoint_restart(spec, workload: str, algorithm: str, checkpoint_every: int,
                        timeout_s: float, target: float | None = None,
                        eval_every: int = 0) -> dict:
    from thinwire.cluster import run as cluster_run
    from thinwire.output import write_json_atomic
    from thinwire.train import quality, workloads

    with tempfile.TemporaryDirectory() as out:
        cfg = restart_config(workload, algorithm, spec.ranks_per_node, f"{out}/checkpoint",
                             checkpoint_every, target, eval_every)
        cfg = dataclasses.replace(cfg, summary=f"{out}/summary.json")
        write_json_atomic(f"{out}/config.json", dataclasses.asdict(cfg))
        log = io.StringIO()
        status = cluster_run(spec, ["-m", "thinwire.train", "--config", f"{out}/config.json"],
                             timeout_s=timeout_s, output=log, stats_path=f"{out}/stats.json")
        summary = _read_json(Path(out) / "summary.json") or {}
        stats = _read_json(Path(out) / "stats.json")
        kills = _kills(stats)
        stats = stats or {}
    metric = quality.check_metric(workloads.WORKLOADS[workload].metric)
    curve = summary.get("curve") or []
    reached = next((p for p in curve if metric.reached(p[metric.name], summary["target"])),
                   None)
    began = stats.get("failure_clock_started_unix")
    return {"status": status,
            "time_to_target_s": reached["unix_time"] - began if reached and began else None,
            "final": curve[-1][metric.name] if curve else None, "steps": summary.get("steps"),
            "restarts": log.getvalue().count("rank 0: resumed from"), "kills": kills,
            "log_tail": None if status == 0 else _failure_excerpt(log.getvalue())}


def _failure_excerpt(log: str, lines: int = 40) -> str:
    """What a failed run's log says first went wrong: the first rank's traceback (torchrun's
    own report of the failure comes last and names no cause), then the log's end."""
    text = log.splitlines()
    first = next((i for i, line in enumerate(text) if "Traceback" in line
                  and "torch/distributed/run.py" not in "".join(text[i:i + 4])), None)
    cause = "\n".join(text[first:first + lines]) + "\n...\n" if first is not None else ""
    return cause + log[-2000:]


def _read_json(path: Path) -> dict | None:
    """A file the run wrote, or None where it wrote none (it failed first)."""
    return json.loads(path.read_text()) if path.is_file() else None


def _kills(stats: dict | None) -> int | None:
    """Nodes the schedule killed before the run ended (the launcher's accounting)."""
    if stats is None:
        return None
    return sum(event["action"] == "kill" for event in stats.get("failures", []))


def _ratio(a: dict, b: dict) -> float | None:
    if a["time_to_target_s"] and b["time_to_target_s"]:
        return a["time_to_target_s"] / b["time_to_target_s"]
    return None


def run(workload: str = "mnist", algorithm: str = "hitopk", nodes: int = 2,
        ranks_per_node: int = 2, bandwidth: str = "100mbit",
        fail: str = "node1@5s,restart@20s", repeats: int = 3, max_steps: int = 2000,
        checkpoint_every: int = 10, timeout_s: float = 600.0,
        runs: tuple[str, ...] = RUNS, target: float | None = None,
        eval_every: int = 0, node_cpus: float | None = None) -> dict:
    from thinwire.cluster import ClusterSpec

    shape = dict(nodes=nodes, ranks_per_node=ranks_per_node, inter_node_bandwidth=bandwidth,
                 node_cpus=node_cpus)
    schedule = dict(failure_schedule=fail, schedule_clock="training")
    specs = {"undisturbed": ClusterSpec(**shape, fault_tolerant=True),
             "fault-tolerant": ClusterSpec(**shape, fault_tolerant=True, **schedule),
             "torchft-ddp-fp16": ClusterSpec(**shape, fault_tolerant=True, **schedule),
             "checkpoint-restart": ClusterSpec(**shape, max_restarts=MAX_RESTARTS, **schedule)}
    rows = []
    for repeat in range(repeats):
        got = {}
        for name in runs:
            if name == "checkpoint-restart":
                result = _checkpoint_restart(specs[name], workload, algorithm,
                                             checkpoint_every, timeout_s, target,
                                             eval_every)
            else:
                result = _fault_tolerant(specs[name], workload, algorithm, max_steps, timeout_s,
                                         peer=name if name == "torchft-ddp-fp16" else None,
                                         target=target, eval_every=eval_every)
            got[name] = {**{key: None for key in COLUMNS},  # every column in every row
                         **result, "repeat": repeat, "run": name}
        if "fault-tolerant" in got:
            ft = got["fault-tolerant"]
            for other, column in COMPARED:
                ft[column] = _ratio(ft, got[other]) if other in got else None
        rows += got.values()

    def median(column: str) -> float | None:
        values = [r[column] for r in rows
                  if r["run"] == "fault-tolerant" and r.get(column) is not None]
        return statistics.median(values) if values else None
    summary = {**{key: None for key in COLUMNS},  # a table row: every column, empty or not
               "repeat": "median", "run": "fault-tolerant",
               **{c: median(c) for _, c in COMPARED},
               "rejoin_s": median("rejoin_s"), "in_quorum_s": median("in_quorum_s"),
               "in_quorum_max_s": median("in_quorum_max_s"),
               "status": max(r["status"] for r in rows)}
    return {"rows": rows + [summary],
            "setting": {"workload": workload, "algorithm": algorithm, "nodes": nodes,
                        "ranks_per_node": ranks_per_node, "inter_node_bandwidth": bandwidth,
                        "fail": fail, "schedule_clock": "training", "repeats": repeats,
                        "checkpoint_every": checkpoint_every, "runs": list(runs),
                        "node_cpus": node_cpus,
                        "target": target, "eval_every": eval_every,
                        "hangs": sum(r["status"] == 124 for r in rows),
                        "kills": sum(r.get("kills") or 0 for r in rows)}}


def _main(args: argparse.Namespace) -> int:
    from thinwire.ft.per_step import check_algorithm

    check_algorithm(args.algorithm)
    runs = tuple(r.strip() for r in args.runs.split(","))
    for name in runs:
        if name not in RUNS:
            raise SystemExit(f"--runs: {name!r} is not one of {', '.join(RUNS)}")
    result = run(args.workload, args.algorithm, args.nodes, args.ranks_per_node,
                 args.inter_node_bandwidth, args.fail, args.repeats, args.max_steps,
                 args.checkpoint_every, runs=runs, target=args.target,
                 eval_every=args.eval_every, node_cpus=args.node_cpus)
    print(format_table(result["rows"], COLUMNS))
    save_if_asked(args.json, result)
    return 0


def register(bench_subparsers) -> None:
    from thinwire.train.workloads import WORKLOADS

    parser = bench_subparsers.add_parser(
        "ft-cluster", help="time to target on the emulated cluster, undisturbed and under a "
                           "failure schedule: fault-tolerant per-step training against "
                           "checkpoint-restart")
    parser.add_argument("--workload", default="mnist", choices=list(WORKLOADS),
                        help="compare's workload to train")
    parser.add_argument("--algorithm", default="hitopk",
                        help="allreduce, hier_allreduce, topk_allgather or hitopk")
    parser.add_argument("--nodes", type=integer(2, 16), default=2, help="emulated nodes")
    parser.add_argument("--ranks-per-node", type=integer(1, 8), default=2,
                        help="ranks (processes) per node")
    parser.add_argument("--inter-node-bandwidth", default="100mbit",
                        help="each node's link rate")
    parser.add_argument("--node-cpus", type=float, default=None, metavar="CORES",
                        help="CPU cores each node may use (as cluster run's --node-cpus): "
                             "with a core per node a returning node's start is not slowed "
                             "by the others' training on the same host (default: no limit)")
    parser.add_argument("--fail", default="node1@5s,restart@20s",
                        help="the failure schedule (times from the start of training)")
    parser.add_argument("--checkpoint-every", type=integer(1), default=10, metavar="STEPS",
                        help="checkpoint-restart's steps between checkpoints (default 10: "
                             "about 3 s of MNIST's steps at 100 Mbit/s; Young's interval "
                             "sqrt(2 x cost x time between failures) is ~4 s for a 0.2 s "
                             "checkpoint, 2 x 2 ranks' files of widecnn here, and a failure "
                             "every ~45 s)")
    parser.add_argument("--runs", default=",".join(RUNS),
                        help=f"which runs of each repeat, of {', '.join(RUNS)}")
    parser.add_argument("--target", type=float, default=None,
                        help="the quality to reach (default: the workload's); one no run "
                             "reaches makes every run train --max-steps steps")
    parser.add_argument("--eval-every", type=integer(0), default=0, metavar="STEPS",
                        help="steps between evaluations (default 0: the workload's)")
    parser.add_argument("--repeats", type=integer(1), default=3, help="repeats of the runs")
    parser.add_argument("--max-steps", type=integer(1), default=2000,
                        help="a fault-tolerant run that has not reached the target stops here")
    parser.add_argument("--json", metavar="PATH", help="write the results as JSON here")
    parser.set_defaults(func=_main)
