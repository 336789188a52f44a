"""Kill-a-peer runs (issue 15's target: 0 aborts in 20 runs per algorithm).

    .venv/bin/python tests/faults/kill_peer.py [--runs 20] [--algorithms hitopk ...] [--json F]

Each run is `torchrun --nproc-per-node 2` of tests/distributed/failure_workers.py in "die" mode:
rank 1 exits (os._exit) in the middle of training; rank 0 must end with status 1 and an error,
never abort (status 134 / SIGABRT, "terminate called ...") and never hang (limit 120 s).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "..", "distributed", "failure_workers.py")
COLUMNS = ("algorithm", "runs", "clean", "abort", "hang", "other", "median_s")


def one_run(algorithm: str, limit_s: float = 120) -> tuple[str, float]:
    env = dict(os.environ, OMP_NUM_THREADS="1",
               PYTHONPATH=os.path.join(HERE, "..", "distributed"))
    start = time.monotonic()
    try:
        done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                               "--nproc-per-node", "2", WORKER, "die", algorithm],
                              capture_output=True, text=True, timeout=limit_s, env=env)
    except subprocess.TimeoutExpired:
        return "hang", time.monotonic() - start
    output = done.stdout + done.stderr
    if "terminate called" in output or "SIGABRT" in output or "exitcode  : -6" in output \
            or done.returncode in (134, -6):
        return "abort", time.monotonic() - start
    return ("clean" if done.returncode == 1 else "other"), time.monotonic() - start


def main(argv=None) -> int:
    sys.path.insert(0, os.path.join(HERE, "..", ".."))
    from thinwire import collectives
    from thinwire.output import format_table, write_json_atomic

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20, help="runs per algorithm (default 20)")
    parser.add_argument("--algorithms", nargs="+", default=list(collectives.names()),
                        choices=list(collectives.names()), help="default: every algorithm")
    parser.add_argument("--json", default=None, help="also write the rows here")
    args = parser.parse_args(argv)
    rows = []
    for algorithm in args.algorithms:
        outcomes, seconds = [], []
        for _ in range(args.runs):
            outcome, elapsed = one_run(algorithm)
            outcomes.append(outcome)
            seconds.append(elapsed)
        seconds.sort()
        rows.append({"algorithm": algorithm, "runs": args.runs,
                     **{k: outcomes.count(k) for k in ("clean", "abort", "hang", "other")},
                     "median_s": seconds[len(seconds) // 2]})
        print(format_table(rows[-1:], COLUMNS), flush=True)
    print(format_table(rows, COLUMNS))
    if args.json:
        write_json_atomic(args.json, {"rows": rows})
    return 0 if all(r["abort"] == r["hang"] == r["other"] == 0 for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
