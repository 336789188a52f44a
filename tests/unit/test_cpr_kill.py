"""A real failure: the training process is killed (SIGKILL) and started again; it resumes from
its newest valid checkpoint and ends in the same state as an uninterrupted run."""

import json
import os
import signal
import subprocess
import sys
import time

from thinwire.recsys.cpr import worker


def _worker(tmp_path, name, *extra):
    cmd = [sys.executable, "-m", "thinwire.recsys.cpr.worker", "--dir", str(tmp_path / name),
           "--steps", "16", "--save-every", "4", "--out", str(tmp_path / f"{name}.json"), *extra]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})


def test_killed_process_resumes_and_matches_uninterrupted_run(tmp_path):
    victim = _worker(tmp_path, "victim", "--step-sleep", "0.2")
    saves = 0
    deadline = time.monotonic() + 60
    while saves < 2 and time.monotonic() < deadline:
        line = victim.stdout.readline()
        if not line:
            break
        saves += line.startswith("saved step")
    assert saves == 2, "the worker did not reach its second checkpoint"
    victim.send_signal(signal.SIGKILL)
    victim.wait(timeout=30)
    assert victim.returncode == -signal.SIGKILL
    assert not (tmp_path / "victim.json").exists()
    resumed = _worker(tmp_path, "victim")
    assert resumed.wait(timeout=120) == 0, resumed.stdout.read()
    # the uninterrupted run, in this process
    assert worker.main(["--dir", str(tmp_path / "clean"), "--steps", "16", "--save-every", "4",
                        "--out", str(tmp_path / "clean.json")]) == 0
    a = json.loads((tmp_path / "clean.json").read_text())
    b = json.loads((tmp_path / "victim.json").read_text())
    assert a["resumed_from"] == 0 and b["resumed_from"] >= 8
    assert a["step"] == b["step"] == 16 and a["digest"] == b["digest"]
