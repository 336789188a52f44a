"""Subprocesses for tests that fail fast and show where they hung.

A test that runs Python in a child process and waits for it has two ways to go wrong on a hang:
wait for its whole timeout, then say only "timed out". ``run_python`` starts the child with
``PYTHONFAULTHANDLER=1`` (inherited by every Python process it starts: torchrun's ranks too) in a
session of its own; on a timeout it sends SIGABRT to that session, so faulthandler writes the
Python stack of every thread of every process (gloo's run-loop threads included, where they run
Python callbacks) to stderr, and the test fails with those stacks in its message.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from thinwire.cluster.launch import descendants

DUMP_GRACE_S = 10.0  # time for faulthandler to write the stacks after SIGABRT
STACKS_SHOWN = 12_000  # characters of the dump put into the failure message


def run_python(args: list[str], timeout_s: float, env: dict | None = None,
               **kwargs) -> subprocess.CompletedProcess:
    """``python ARGS`` with stdout and stderr captured as text; fails the test (with every
    thread's stack) if it runs past ``timeout_s``."""
    argv = [sys.executable, *args]
    env = dict(os.environ if env is None else env, PYTHONFAULTHANDLER="1")
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, start_new_session=True, stdin=subprocess.DEVNULL, **kwargs)
    tree: set[int] = set()
    try:
        try:
            out, err = proc.communicate(timeout=timeout_s)
            return subprocess.CompletedProcess(argv, proc.returncode, out, err)
        except subprocess.TimeoutExpired:
            pass
        # Every process under the child, not only its group: torchrun starts each rank in a
        # session of its own, and the ranks hold the output pipes open.
        tree = _tree(proc.pid)
        _signal(tree, signal.SIGABRT)
        out, err = _read(proc, DUMP_GRACE_S)
        if out is None:
            _signal(tree | _tree(proc.pid), signal.SIGKILL)
            out, err = _read(proc, DUMP_GRACE_S)
    finally:
        _signal(tree | _tree(proc.pid), signal.SIGKILL)  # whatever the child left behind
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None and not pipe.closed:
                pipe.close()
        proc.wait()
    pytest.fail(f"{' '.join(argv)[:300]} ran past its {timeout_s:g} s timeout; the stacks of "
                f"its threads (faulthandler, last {STACKS_SHOWN} characters):\n"
                f"{(err or '')[-STACKS_SHOWN:]}\n--- stdout tail ---\n{(out or '')[-2000:]}",
                pytrace=False)


def _read(proc: subprocess.Popen, timeout_s: float) -> tuple[str | None, str | None]:
    """What the child wrote, once every holder of its pipes is gone; (None, None) if some
    process still holds them after ``timeout_s``."""
    try:
        return proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return None, None


def _tree(pid: int) -> set[int]:
    """``pid`` and every process below it."""
    return {pid, *descendants(pid)}


def _signal(pids: set[int], signum: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, signum)
        except (ProcessLookupError, PermissionError):
            pass
