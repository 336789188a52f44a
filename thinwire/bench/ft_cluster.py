"""`thinwire bench ft-cluster`: a compare workload's time to target with fault-tolerant per-step
training on the emulated cluster, undisturbed and under a failure schedule, in the same run.

Each repeat runs `python -m thinwire.train.ft_job` twice on `thinwire cluster run
--fault-tolerant`: once undisturbed, once with ``--fail`` (default: node 1 killed 5 s into
training, back 15 s later: the issue's "back 15 s later", scaled to a run of tens of seconds).
The two runs alternate, so drift of the machine hits both alike. Per run:

- ``time_to_target_s``: node 0's training time to the workload's target, evaluation
  excluded, from the start barrier;
- ``final``: the quality it stopped at;
- ``rejoin_s``: from the returning node's worker processes being created to its first quorum
  (its healing included). torchrun's own start comes before that and is not counted;
- ``rolled_back``: steps node 0 undid;
- ``status``: the job's exit status (124: it hung past the timeout).

``ratio``: disturbed over undisturbed time to target, in the same repeat. The checkpoint-restart
and torchft fault-tolerant DDP baselines of issue #32 are not in this race yet.
"""

from __future__ import annotations

import argparse
import io
import json
import statistics
import tempfile
from pathlib import Path

from thinwire.bench.report import format_table, save_if_asked
from thinwire.cliargs import integer

COLUMNS = ("repeat", "run", "status", "time_to_target_s", "final", "ratio", "rejoin_s",
           "rolled_back", "quorums")


def _one(spec, workload: str, algorithm: str, max_steps: int, timeout_s: float) -> dict:
    from thinwire.cluster import run as cluster_run

    with tempfile.TemporaryDirectory() as out:
        log = io.StringIO()
        status = cluster_run(spec, ["-m", "thinwire.train.ft_job", "--workload", workload,
                                    "--algorithm", algorithm, "--max-steps", str(max_steps),
                                    "--out", out], timeout_s=timeout_s, output=log)
        nodes = {int(p.stem[4:]): json.loads(p.read_text()) for p in Path(out).glob("node*.json")}
    first = nodes.get(0, {})
    reached = first.get("reached")
    back = nodes.get(1, {})
    return {"status": status, "time_to_target_s": reached["wall_s"] if reached else None,
            "final": (first.get("curve") or [{}])[-1].get("value"),
            "steps": first.get("step"), "rolled_back": first.get("rolled_back"),
            "quorums": " ".join(f"{n}@{s}" for s, n in first.get("quorums", [])),
            "rejoin_s": back["joined_at"] - back["started_at"]
            if spec.failure_schedule and back.get("joined_at") else None,
            "log_tail": None if status == 0 else log.getvalue()[-3000:]}


def run(workload: str = "mnist", algorithm: str = "hitopk", nodes: int = 2,
        ranks_per_node: int = 2, bandwidth: str = "100mbit",
        fail: str = "node1@5s,restart@20s", repeats: int = 3, max_steps: int = 2000,
        timeout_s: float = 600.0) -> dict:
    from thinwire.cluster import ClusterSpec

    calm = ClusterSpec(nodes, ranks_per_node, inter_node_bandwidth=bandwidth,
                       fault_tolerant=True)
    hit = ClusterSpec(nodes, ranks_per_node, inter_node_bandwidth=bandwidth,
                      fault_tolerant=True, failure_schedule=fail, schedule_clock="training")
    rows = []
    for repeat in range(repeats):
        base = dict(_one(calm, workload, algorithm, max_steps, timeout_s), repeat=repeat,
                    run="undisturbed", ratio=None)
        disturbed = dict(_one(hit, workload, algorithm, max_steps, timeout_s), repeat=repeat,
                         run=f"--fail {fail}", ratio=None)
        if base["time_to_target_s"] and disturbed["time_to_target_s"]:
            disturbed["ratio"] = disturbed["time_to_target_s"] / base["time_to_target_s"]
        rows += [base, disturbed]
    ratios = [r["ratio"] for r in rows if r.get("ratio") is not None]
    rejoins = [r["rejoin_s"] for r in rows if r.get("rejoin_s") is not None]
    median = {**{key: None for key in COLUMNS},  # a table row: every column, empty or not
              "repeat": "median", "run": "disturbed / undisturbed",
              "ratio": statistics.median(ratios) if ratios else None,
              "rejoin_s": statistics.median(rejoins) if rejoins else None,
              "status": max(r["status"] for r in rows)}
    return {"rows": rows + [median],
            "setting": {"workload": workload, "algorithm": algorithm, "nodes": nodes,
                        "ranks_per_node": ranks_per_node, "inter_node_bandwidth": bandwidth,
                        "fail": fail, "schedule_clock": "training", "repeats": repeats,
                        "hangs": sum(r["status"] == 124 for r in rows)}}


def _main(args: argparse.Namespace) -> int:
    from thinwire.ft.per_step import check_algorithm

    check_algorithm(args.algorithm)
    result = run(args.workload, args.algorithm, args.nodes, args.ranks_per_node,
                 args.inter_node_bandwidth, args.fail, args.repeats, args.max_steps)
    print(format_table(result["rows"], COLUMNS))
    save_if_asked(args.json, result)
    return 0


def register(bench_subparsers) -> None:
    from thinwire.train.workloads import WORKLOADS

    parser = bench_subparsers.add_parser(
        "ft-cluster", help="time to target of fault-tolerant per-step training on the emulated "
                           "cluster, undisturbed and under a failure schedule")
    parser.add_argument("--workload", default="mnist", choices=list(WORKLOADS),
                        help="compare's workload to train")
    parser.add_argument("--algorithm", default="hitopk",
                        help="allreduce, hier_allreduce, topk_allgather or hitopk")
    parser.add_argument("--nodes", type=integer(2, 16), default=2, help="emulated nodes")
    parser.add_argument("--ranks-per-node", type=integer(1, 8), default=2,
                        help="ranks (processes) per node")
    parser.add_argument("--inter-node-bandwidth", default="100mbit",
                        help="each node's link rate")
    parser.add_argument("--fail", default="node1@5s,restart@20s",
                        help="the failure schedule (times from the start of training)")
    parser.add_argument("--repeats", type=integer(1), default=3,
                        help="pairs of runs (undisturbed, disturbed)")
    parser.add_argument("--max-steps", type=integer(1), default=2000,
                        help="a run that has not reached the target stops here")
    parser.add_argument("--json", metavar="PATH", help="write the results as JSON here")
    parser.set_defaults(func=_main)
