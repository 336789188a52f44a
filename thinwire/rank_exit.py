"""How a rank process ends once its work is done: Python's exit handlers, then ``os._exit``.

A rank that returned from its work has destroyed its process groups, and its output is
written. What is left is the interpreter's own teardown, which destroys torch's and gloo's
C++ objects (process groups, stores, their threads, tensors some of them hold) in an order
nobody chose. Twice that teardown aborted a rank whose work had finished ("terminate called
without an active exception", SIGABRT: `bench des` in CI, and DDP reducers, see
``thinwire.ddp``), and the launcher then reported a finished run as failed. Here the exit
handlers still run (they close dlcp's transports, release DDP reducers, flush logs), but the
teardown after them is skipped: nothing in it is the rank's work.
"""

from __future__ import annotations

import atexit
import logging
import os
import sys
import threading
import traceback
from typing import NoReturn

from thinwire import peer_failure


def exit_rank(status: int | None = 0) -> NoReturn:
    """End this process with ``status`` (None: 0) after the exit handlers, skipping the
    interpreter's teardown. Only for a process whose work is done: a rank entry's last
    line, never library code that a user's process calls."""
    code = 0 if status is None else int(status)
    # never cancelled: flushing below can block too (a full pipe), and os._exit ends it. After
    # a failure the handlers are a courtesy: a peer they might wait on is likely gone
    limit = _handlers_limit_s() if code == 0 else min(_handlers_limit_s(), FAILED_LIMIT_S)
    watchdog = threading.Timer(limit, _give_up, args=(code, limit))
    watchdog.daemon = True
    watchdog.start()
    try:
        atexit._run_exitfuncs()  # CPython's own: runs and reports the registered handlers
    finally:
        logging.shutdown()
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):  # a closed pipe: nothing more can be said there
                pass
        os._exit(code)


EXIT_HANDLERS_LIMIT_S = 60.0
FAILED_LIMIT_S = 10.0
# Exceptions a failed rank reported, kept until the process ends: releasing one frees its
# traceback's frames and with them the failed step's DDP model, whose C++ teardown can block
# on the peer that is gone (seen: a frozen-peer DiLoCo survivor printed its line, then sat in
# that teardown at the end of the `except` block for over a minute).
_REPORTED: list = []


def _handlers_limit_s() -> float:
    """THINWIRE_EXIT_HANDLERS_LIMIT_S if it is a finite number > 0, else the default."""
    try:
        limit = float(os.environ.get("THINWIRE_EXIT_HANDLERS_LIMIT_S", EXIT_HANDLERS_LIMIT_S))
    except ValueError:
        return EXIT_HANDLERS_LIMIT_S
    return limit if 0 < limit < float("inf") else EXIT_HANDLERS_LIMIT_S


def _give_up(code: int, limit: float) -> None:
    """The exit handlers did not finish (one waited on a peer that is gone: seen once in ~20
    frozen-peer DiLoCo runs): say so with every thread's stack, and end anyway. A rank that
    has finished its work must not hang."""
    import faulthandler

    try:
        sys.stderr.write(f"thinwire: the exit handlers were still running after "
                         f"{limit:g} s; ending the process (their stacks follow)\n")
        sys.stderr.flush()
        faulthandler.dump_traceback(all_threads=True)
    finally:
        os._exit(code)


def failure_status(exc: Exception, command: str, rank_process: bool = True) -> int:
    """A failure as the user should see it; the exit status.

    * A bad value: one line, status 2.
    * A lost peer: one line, status 1 (the traceback only with THINWIRE_TRACEBACK=1, for a bug
      report). In a rank: the rank, what it was doing, step, phase, bucket and reason.
    * Anything else is a bug. In a rank (``rank_process``) its traceback is printed and the
      status is 1, so the rank still ends through :func:`exit_rank`; a plain command re-raises
      it (Python prints it)."""
    if isinstance(exc, (ValueError, TypeError, FileNotFoundError)):
        print(f"{command}: error: {exc}", file=sys.stderr)
        return 2
    if rank_process:
        _REPORTED.append(exc)
    if peer_failure.is_lost_peer(exc):
        line = peer_failure.describe(exc, _rank()) if rank_process else \
            str(exc).strip().splitlines()[0]
        print(f"{command}: error: {line}", file=sys.stderr)
        if os.environ.get("THINWIRE_TRACEBACK") == "1":
            traceback.print_exception(exc)
        return 1
    if rank_process:
        traceback.print_exception(exc)
        return 1
    raise exc


def _rank() -> int | None:
    try:
        return int(os.environ["RANK"])
    except (KeyError, ValueError):
        return None
