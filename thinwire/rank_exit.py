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
from typing import NoReturn


def exit_rank(status: int | None = 0) -> NoReturn:
    """End this process with ``status`` (None: 0) after the exit handlers, skipping the
    interpreter's teardown. Only for a process whose work is done: a rank entry's last
    line, never library code that a user's process calls."""
    code = 0 if status is None else int(status)
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
