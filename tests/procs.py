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
    try:
        try:
            out, err = proc.communicate(timeout=timeout_s)
            return subprocess.CompletedProcess(argv, proc.returncode, out, err)
        except subprocess.TimeoutExpired:
            pass
        _signal_group(proc.pid, signal.SIGABRT)
        try:
            out, err = proc.communicate(timeout=DUMP_GRACE_S)
        except subprocess.TimeoutExpired:
            _signal_group(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
    finally:
        _signal_group(proc.pid, signal.SIGKILL)  # whatever the child left behind
        if proc.poll() is None:
            proc.wait()
    pytest.fail(f"{' '.join(argv)[:300]} ran past its {timeout_s:g} s timeout; the stacks of "
                f"its threads (faulthandler, last {STACKS_SHOWN} characters):\n"
                f"{(err or '')[-STACKS_SHOWN:]}\n--- stdout tail ---\n{(out or '')[-2000:]}",
                pytrace=False)


def _signal_group(pgid: int, signum: int) -> None:
    try:
        os.killpg(pgid, signum)
    except (ProcessLookupError, PermissionError):
        pass
