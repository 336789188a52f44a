"""Peer-failure runs: one rank of a training run is killed (SIGKILL) or frozen (SIGSTOP) in
the middle of training; every survivor must end within the collective timeout with one
clear line (issue 33, item 2), never a traceback, an abort or a hang.

    .venv/bin/python tests/faults/peer_failure.py [--scenarios hitopk dlcp ...]
        [--faults kill freeze] [--timeout 10] [--json results/peer_failure.json]

Each run starts the ranks of ``python -m thinwire.train`` (or ``thinwire.train.pipeline``)
on loopback with the environment torchrun gives, without its agent: torchrun's agent would
kill the survivors as soon as one rank dies, and the question here is what a survivor does
on its own (on a real cluster the dead rank is on another machine). Once rank 0 has logged
its third step, the last rank is killed or frozen.

Outcomes per survivor: ``clear`` = a non-zero exit within the timeout + grace, no traceback,
and one ``error:`` line naming the rank and the step; ``traceback``; ``abort`` (SIGABRT,
"terminate called"); ``hang`` (still running at the timeout + grace, then killed);
``trained_on`` (exit 0: the mode is meant to survive a lost peer, torchft's); ``other``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")
GRACE_S = 60.0  # past the collective timeout: start-up of the survivors' clean-up on 2 cores
COLUMNS = ("scenario", "fault", "survivors", "outcome", "seconds", "line")

TRAIN = ["--model", "mlp", "--batch-size", "16", "--max-iters", "100000", "--epochs", "1000",
         "--no-progress", "--compute-probe-iters", "0", "--eval-every", "0", "--log-every", "1"]
PIPELINE = ["train", "--stages", "2", "--dataset", "digits", "--epochs", "1000"]


@dataclass(frozen=True)
class Scenario:
    name: str
    world: int
    ranks_per_node: int
    args: tuple[str, ...]
    module: str = "thinwire.train"

    def command(self, timeout_s: float, metrics: str) -> list[str]:
        if self.module == "thinwire.train":
            # the wave loop has no --metrics: it logs its steps (see _started)
            logged = [] if "--waves" in self.args else ["--metrics", metrics]
            return ["-m", self.module, *TRAIN, *self.args, "--collective-timeout",
                    str(timeout_s), *logged]
        return ["-m", self.module, *PIPELINE, *self.args, "--timeout", str(timeout_s)]


SCENARIOS = {s.name: s for s in (
    Scenario("allreduce", 2, 1, ("--algorithm", "allreduce")),
    Scenario("hier_allreduce-fp16-2x2", 4, 2, ("--algorithm", "hier_allreduce", "--wire",
                                               "fp16")),
    Scenario("topk_allgather", 2, 1, ("--algorithm", "topk_allgather", "--density", "0.05")),
    Scenario("hitopk-2x2", 4, 2, ("--algorithm", "hitopk", "--density", "0.05")),
    Scenario("topk_a2a", 2, 1, ("--algorithm", "topk_a2a", "--density", "0.05")),
    Scenario("oktopk", 2, 1, ("--algorithm", "oktopk", "--density", "0.05")),
    Scenario("dlcp", 2, 1, ("--algorithm", "dlcp", "--density", "0.05")),
    Scenario("ddp", 2, 1, ("--algorithm", "ddp",)),
    Scenario("powersgd", 2, 1, ("--algorithm", "powersgd",)),
    Scenario("diloco-2x1", 2, 1, ("--algorithm", "diloco", "--sync-every", "4")),
    Scenario("diloco-2x2", 4, 2, ("--algorithm", "diloco", "--sync-every", "4")),
    Scenario("waves-2", 2, 2, ("--algorithm", "hitopk", "--density", "0.05", "--waves", "2")),
    Scenario("torchft-diloco", 2, 1, ("--algorithm", "torchft-diloco", "--sync-every", "4")),
    Scenario("pipeline-pb", 2, 1, (), module="thinwire.train.pipeline"),
)}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _started(scenario: Scenario, metrics: str, logs: list[str], since: float) -> bool:
    """Rank 0 is past its third step (its metrics file; the wave loop: its log); the
    pipeline, which logs nothing per step, has been running for 15 s."""
    if scenario.module != "thinwire.train":
        return time.monotonic() - since > 15
    try:
        with open(metrics) as handle:
            if sum('"event": "step"' in line for line in handle) >= 3:
                return True
    except FileNotFoundError:
        pass
    with open(logs[0]) as handle:
        return bool(re.search(r"step ([3-9]|\d\d+)/", handle.read()))


# thinwire's own line (torchft's logs have "error: " in them too)
ERROR_LINE = re.compile(r"^thinwire[\w ]*: error: .*$", re.MULTILINE)


def classify(status: int | None, stderr: str) -> tuple[str, str]:
    """(outcome, the survivor's error line or its last line) for one survivor."""
    lines = ERROR_LINE.findall(stderr)
    last = lines[-1] if lines else (stderr.strip().splitlines() or [""])[-1]
    if status is None:
        return "hang", last
    if status in (-signal.SIGABRT, 134) or "terminate called" in stderr:
        return "abort", last
    if status == 0:
        return "trained_on", last
    if "Traceback" in stderr:
        return "traceback", last
    if len(lines) == 1 and re.search(r"\brank \d+", last) \
            and re.search(r"\b(step|micro-batch) \d+", last):
        return "clear", last
    return "other", last


def one_run(scenario: Scenario, fault: str, timeout_s: float, keep: str | None = None) -> dict:
    port = _free_port()
    with tempfile.TemporaryDirectory(prefix="thinwire-peer-") as tmp:
        metrics = os.path.join(tmp, "metrics.jsonl")
        logs = [os.path.join(tmp, f"rank{r}.err") for r in range(scenario.world)]
        procs = []
        for rank in range(scenario.world):
            env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": str(scenario.world),
                   "LOCAL_RANK": str(rank % scenario.ranks_per_node),
                   "LOCAL_WORLD_SIZE": str(scenario.ranks_per_node),
                   "GROUP_RANK": str(rank // scenario.ranks_per_node),
                   "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
                   "OMP_NUM_THREADS": "1", "PYTHONPATH": ROOT}
            with open(logs[rank], "w") as err:
                procs.append(subprocess.Popen(
                    [sys.executable, *scenario.command(timeout_s, metrics)], env=env,
                    stdout=subprocess.DEVNULL, stderr=err, text=True))
        victim = procs[-1]
        try:
            since = time.monotonic()
            deadline = since + 240
            while not _started(scenario, metrics, logs, since):
                if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
                    return _row(scenario, fault, "other", 0.0,
                                "never reached step 3: " + _tail(logs))
                time.sleep(0.2)
            victim.send_signal(signal.SIGKILL if fault == "kill" else signal.SIGSTOP)
            struck = time.monotonic()
            statuses = []
            for proc in procs[:-1]:
                left = struck + timeout_s + GRACE_S - time.monotonic()
                try:
                    statuses.append(proc.wait(timeout=max(left, 0.1)))
                except subprocess.TimeoutExpired:
                    statuses.append(None)
            seconds = time.monotonic() - struck
        finally:
            for proc in procs[:-1]:  # a hung survivor writes its threads' stacks first
                if proc.poll() is None:
                    proc.send_signal(signal.SIGUSR1)
            time.sleep(2 if any(p.poll() is None for p in procs[:-1]) else 0)
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
        if keep:
            os.makedirs(keep, exist_ok=True)
            for rank, path in enumerate(logs):
                shutil.copy(path, os.path.join(keep, f"{scenario.name}-{fault}-rank{rank}.err"))
        outcomes = []
        for status, path in zip(statuses, logs):
            with open(path) as handle:
                outcomes.append(classify(status, handle.read()))
    worst = next((o for o in outcomes if o[0] != "clear"), outcomes[0])
    row = _row(scenario, fault, worst[0], seconds, worst[1])
    row["survivors"] = len(outcomes)
    row["per_survivor"] = [o[0] for o in outcomes]
    return row


def _tail(logs: list[str]) -> str:
    with open(logs[0]) as handle:
        return " | ".join(handle.read().strip().splitlines()[-2:])


def _row(scenario, fault, outcome, seconds, line) -> dict:
    return {"scenario": scenario.name, "fault": fault, "survivors": scenario.world - 1,
            "outcome": outcome, "seconds": round(seconds, 1), "line": line[:200]}


def main(argv=None) -> int:
    sys.path.insert(0, ROOT)
    from thinwire.output import format_table, write_json_atomic

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenarios", nargs="+", default=list(SCENARIOS),
                        choices=list(SCENARIOS), help="default: every scenario")
    parser.add_argument("--faults", nargs="+", default=["kill", "freeze"],
                        choices=["kill", "freeze"])
    parser.add_argument("--timeout", type=float, default=10.0,
                        help="the runs' collective timeout in seconds (default 10)")
    parser.add_argument("--json", default=None, help="also write the rows here")
    parser.add_argument("--logs", default=None, help="keep every rank's stderr in this folder")
    args = parser.parse_args(argv)
    rows = []
    for name in args.scenarios:
        for fault in args.faults:
            rows.append(one_run(SCENARIOS[name], fault, args.timeout, args.logs))
            print(json.dumps(rows[-1]), flush=True)
    print(format_table(rows, COLUMNS))
    counts = {}
    for row in rows:
        counts[row["outcome"]] = counts.get(row["outcome"], 0) + 1
    print("outcomes:", ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    if args.json:
        write_json_atomic(args.json, {"timeout_s": args.timeout, "rows": rows,
                                      "outcomes": counts})
    return 0 if set(counts) <= {"clear", "trained_on"} else 1


if __name__ == "__main__":
    sys.exit(main())
