"""The bad inputs of issue 15 as data: each case says what to run and which parameter the error
must name. Shared by the pytest suite (tests/faults/test_*.py) and the table (report.py).

Outcomes, as the issue counts them:

* ``clear``: refused with an error naming the parameter, exit status 2 for a command (argparse
  or thinwire's one-line ``error:``), a ValueError/TypeError for an API call; no traceback;
* ``traceback``: any other exception, or a traceback on stderr;
* ``accepted``: ran without complaint although the value is wrong;
* ``hang``: still running after the case's time limit.
"""

from __future__ import annotations

import contextlib
import io
import math
import os
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

OUTCOMES = ("clear", "traceback", "accepted", "hang")


@dataclass
class CliCase:
    name: str
    argv: list[str]          # after `thinwire`; "{tmp}" is replaced by a scratch folder
    names: str               # what the error message must mention (the parameter)
    timeout_s: float = 60.0


@dataclass
class ApiCase:
    name: str
    call: Callable[[Path], object]
    names: str
    timeout_s: float = 30.0
    tags: list = field(default_factory=list)


def cli_cases() -> list[CliCase]:
    return [
        CliCase("bench cpr --epochs 0", ["bench", "cpr", "--epochs", "0"], "--epochs"),
        CliCase("bench cpr --batch 0", ["bench", "cpr", "--batch", "0"], "--batch"),
        CliCase("recsys train --batch 0",
                ["recsys", "train", "--batch", "0", "--single-process"], "--batch"),
        CliCase("recsys train --hidden 0",
                ["recsys", "train", "--hidden", "0", "--single-process"], "--hidden"),
        CliCase("recsys train --hidden -4",
                ["recsys", "train", "--hidden", "-4", "--single-process"], "--hidden"),
        CliCase("recsys train --epochs 0",
                ["recsys", "train", "--epochs", "0", "--single-process"], "--epochs"),
        CliCase("recsys train --max-steps -1",
                ["recsys", "train", "--max-steps", "-1", "--single-process"], "--max-steps"),
        CliCase("simulate --bucket-mb inf", ["simulate", "--bucket-mb", "inf", "--no-plot"],
                "--bucket-mb"),
        CliCase("simulate --scaling-nodes ''", ["simulate", "--scaling-nodes", "", "--no-plot"],
                "--scaling-nodes"),
        CliCase("simulate --nodes 100000", ["simulate", "--nodes", "100000", "--no-plot"],
                "--nodes"),
        CliCase("simulate --gpus-per-node 100000",
                ["simulate", "--gpus-per-node", "100000", "--no-plot"], "--gpus-per-node"),
        CliCase("simulate --inter-gbps inf", ["simulate", "--inter-gbps", "inf", "--no-plot"],
                "--inter-gbps"),
        CliCase("simulate --json under a file",
                ["simulate", "--no-plot", "--json", "{tmp}/afile/out.json"], "--json"),
        CliCase("bench topk --device tpu", ["bench", "topk", "--device", "tpu"], "--device"),
        CliCase("bench optim --device tpu", ["bench", "optim", "--device", "tpu"], "--device"),
        CliCase("bench topk --json unwritable",
                ["bench", "topk", "--sizes", "1000", "--json", "/proc/thinwire/x.json"],
                "/proc/thinwire/x.json"),
        CliCase("train --checkpoint FILE", ["train", "--checkpoint", "{tmp}/afile"],
                "--checkpoint"),
        CliCase("train --lr 1e30", ["train", "--lr", "1e30"], "--lr"),
        CliCase("train --momentum 5", ["train", "--momentum", "5"], "--momentum"),
        CliCase("train --summary unwritable (checked before training)",
                ["train", "--summary", "{tmp}/afile/s.json"], "--summary"),
        CliCase("data warm --disk-dir FILE",
                ["data", "warm", "file://{tmp}/src/*.bin", "--disk-dir", "{tmp}/afile",
                 "--disk-bytes", "1000", "--quiet"], "disk_dir"),
        CliCase("data warm --json unwritable",
                ["data", "warm", "file://{tmp}/src/*.bin", "--disk-dir", "{tmp}/l2",
                 "--disk-bytes", "1000", "--quiet", "--json", "{tmp}/afile/w.json"], "--json"),
    ] + issue33_cli_cases()


def issue33_cli_cases() -> list[CliCase]:
    """Issue 33, item 5: values that were refused late (inside launched ranks), ignored, or
    trained to NaN; each must now be refused before anything launches."""
    return [
        CliCase("pipeline train --lr nan", ["pipeline", "train", "--lr", "nan"], "--lr"),
        CliCase("bench dlcp --density 2", ["bench", "dlcp", "--density", "2"], "--density"),
        CliCase("bench diloco --sync-every 0", ["bench", "diloco", "--sync-every", "0"],
                "--sync-every"),
        CliCase("train --outer-lr 1e30", ["train", "--algorithm", "diloco", "--sync-every", "4",
                                          "--outer-lr", "1e30"], "--outer-lr"),
        CliCase("train --sync-every with hitopk",
                ["train", "--algorithm", "hitopk", "--sync-every", "4"], "--sync-every"),
        CliCase("train --outer-bits with a dense outer step",
                ["train", "--algorithm", "diloco", "--sync-every", "4", "--outer-algorithm",
                 "hier_allreduce", "--outer-bits", "3"], "--outer-bits"),
        CliCase("train --wave-turn without --waves 2", ["train", "--wave-turn", "forward"],
                "--wave-turn"),
        CliCase("train --collective-timeout 0", ["train", "--collective-timeout", "0"],
                "--collective-timeout"),
        CliCase('train --config {"momentum_correction": "false"}',
                ["train", "--config", "{tmp}/bool.json"], "--momentum-correction"),
        CliCase("train --config nested 10000 deep", ["train", "--config", "{tmp}/nested.json"],
                "--config"),
        CliCase("train --config 1e400", ["train", "--config", "{tmp}/huge.json"], "--config"),
        CliCase("simulate --model NaN layer times", ["simulate", "--model", "{tmp}/nan_layers.json",
                                                     "--no-plot"], "layer table"),
        CliCase("cluster run --node-memory 1e30g",
                ["cluster", "run", "--nodes", "2", "--node-memory", "1e30g", "--", "-c", "pass"],
                "--node-memory"),
        CliCase("cluster run --fail a node that does not exist",
                ["cluster", "run", "--nodes", "2", "--fail", "node5@10s", "--", "-c", "pass"],
                "--fail"),
        CliCase("cluster run --bandwidth-schedule unsorted",
                ["cluster", "run", "--nodes", "2", "--bandwidth-schedule",
                 "0s:200mbit,40s:25mbit,20s:200mbit", "--", "-c", "pass"], "--bandwidth-schedule"),
    ]


def _lars(**options):
    import torch

    from thinwire.optim import LARS
    return LARS([torch.nn.Parameter(torch.zeros(2))], **options)


def _lamb(**options):
    import torch

    from thinwire.optim import LAMB
    return LAMB([torch.nn.Parameter(torch.zeros(2))], **options)


def _train_config(**options):
    from thinwire.train import TrainConfig
    return TrainConfig(**options).validate()


def _bce(global_batch):
    import torch

    from thinwire.recsys.models import bce_loss
    return bce_loss(torch.zeros(4), torch.ones(4), global_batch)


def _schedule():
    from thinwire.recsys.cpr.schedule import failure_schedule
    return failure_schedule(1e-300, 1e300, 2, 0)


def _cache(tmp: Path):
    from thinwire.data import CachedDataset
    return CachedDataset([f"file://{tmp}/src/a.bin"], disk_dir=tmp / "afile", disk_bytes=10)


def api_cases() -> list[ApiCase]:
    return [
        ApiCase("LARS(lr=inf)", lambda t: _lars(lr=math.inf), "lr"),
        ApiCase("LARS(momentum=1.5)", lambda t: _lars(lr=0.1, momentum=1.5), "momentum"),
        ApiCase("LAMB(lr=inf)", lambda t: _lamb(lr=math.inf), "lr"),
        ApiCase("TrainConfig(momentum=5)", lambda t: _train_config(momentum=5.0), "--momentum"),
        ApiCase("TrainConfig(lr=1e30)", lambda t: _train_config(lr=1e30), "--lr"),
        ApiCase("bce_loss(global_batch=0) (DES/PS/TorchRec train_step)", lambda t: _bce(0),
                "global_batch"),
        ApiCase("failure_schedule(1e-300, 1e300, 2, 0)", lambda t: _schedule(), "horizon / mtbf"),
        ApiCase("CachedDataset(disk_dir=FILE)", _cache, "disk_dir"),
    ]


def prepare(tmp: Path) -> Path:
    """The scratch folder the cases refer to as {tmp}: a file, a data source."""
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "afile").write_text("not a folder")
    (tmp / "src").mkdir(exist_ok=True)
    for i in range(3):
        (tmp / "src" / f"{'abc'[i]}.bin").write_bytes(bytes(100))
    (tmp / "bool.json").write_text('{"momentum_correction": "false"}')
    (tmp / "nested.json").write_text("[" * 10000 + "]" * 10000)
    (tmp / "huge.json").write_text('{"lr": 1e400}')
    (tmp / "nan_layers.json").write_text(
        '[{"params": 1000, "forward_s": NaN, "backward_s": 0.001}]')
    return tmp


def classify_cli(case: CliCase, tmp: Path, source: str | None = None) -> tuple[str, str]:
    """(outcome, last line of stderr) of the command in a fresh process; ``source``: run
    another checkout's thinwire (to see how it behaved before)."""
    argv = [a.replace("{tmp}", str(tmp)) for a in case.argv]
    env = dict(os.environ, PYTHONPATH=source) if source else None
    # its own process group, so that a case that does not end is stopped with its children
    proc = subprocess.Popen([sys.executable, "-m", "thinwire.cli", *argv], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        _, stderr = proc.communicate(timeout=case.timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return "hang", f"still running after {case.timeout_s:g} s"
    return _judge(proc.returncode, stderr, case.names)


def classify_cli_inprocess(case: CliCase, tmp: Path) -> tuple[str, str]:
    """The same in this process (fast, for pytest): thinwire.cli.main with captured stderr."""
    from thinwire.cli import main

    argv = [a.replace("{tmp}", str(tmp)) for a in case.argv]
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            status = main(argv)
    except SystemExit as exc:  # argparse's refusal
        status = exc.code if isinstance(exc.code, int) else 1
    except Exception as exc:  # noqa: BLE001 - an escaped exception is what is counted
        return "traceback", f"{type(exc).__name__}: {exc}"
    return _judge(status, err.getvalue(), case.names)


def _judge(status: int, stderr: str, names: str) -> tuple[str, str]:
    lines = [line for line in stderr.strip().splitlines() if line.strip()]
    last = lines[-1] if lines else ""
    if "Traceback (most recent call last)" in stderr:
        return "traceback", last
    if status == 0:
        return "accepted", last
    if status == 2 and "error:" in last and names in last:
        return "clear", last
    return "traceback", f"exit {status}: {last}"


def classify_api(case: ApiCase, tmp: Path) -> tuple[str, str]:
    """Run the call in a daemon thread so that one that never returns is counted as a hang."""
    result: list[tuple[str, str]] = []

    def attempt() -> None:
        try:
            case.call(tmp)
        except (ValueError, TypeError) as exc:
            message = str(exc)
            result.append((("clear" if case.names in message else "traceback"), message))
        except Exception as exc:  # noqa: BLE001
            result.append(("traceback", f"{type(exc).__name__}: {exc}"))
        else:
            result.append(("accepted", ""))

    worker = threading.Thread(target=attempt, daemon=True)
    worker.start()
    worker.join(case.timeout_s)
    return result[0] if result else ("hang", f"still running after {case.timeout_s:g} s")
