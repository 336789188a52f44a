"""A rank entry ends through `thinwire.rank_exit.exit_rank`: the exit handlers run (dlcp closes
its transports there), buffered output is flushed, the status is kept, and the interpreter's
teardown, where torch's and gloo's C++ objects were seen aborting a finished rank, is skipped."""

from __future__ import annotations

import subprocess
import sys

import pytest

SCRIPT = """
import atexit, logging, sys
logging.basicConfig(level=logging.INFO, stream=sys.stderr)
atexit.register(lambda: print("handler ran", flush=False))
print("buffered", end="")  # no newline, no flush: exit_rank must flush it
logging.getLogger("t").info("logged")

class Teardown:
    def __del__(self):  # what the interpreter's teardown would run
        print("teardown ran")

keep = Teardown()
from thinwire.rank_exit import exit_rank
exit_rank({status})
"""


@pytest.mark.parametrize("status, code", [(None, 0), (0, 0), (3, 3)])
def test_exit_rank_runs_handlers_flushes_and_skips_the_teardown(status, code):
    done = subprocess.run([sys.executable, "-c", SCRIPT.format(status=status)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == code, done.stderr
    assert done.stdout == "bufferedhandler ran\n"
    assert "INFO:t:logged" in done.stderr


def test_every_rank_entry_ends_through_it():
    from pathlib import Path

    import thinwire

    root = Path(thinwire.__file__).parent
    entries = ["train/__main__.py", "wavelet/__main__.py", "train/pipeline/__main__.py",
               "recsys/train.py", "recsys/cpr/cluster_job.py", "cluster/probe.py",
               "bench/sync_worker.py", "bench/dlcp_worker.py", "bench/diloco_worker.py",
               "bench/pipeline_worker.py"]
    for entry in entries:
        text = (root / entry).read_text()
        assert "exit_rank(" in text or "end_worker(main" in text, entry  # end_worker calls it


def test_a_stuck_exit_handler_cannot_hang_the_rank():
    """A handler that waits forever (on a peer that is gone) is abandoned after the limit,
    with every thread's stack; the status is kept."""
    import os
    import time

    script = ("import atexit, time\n"
              "atexit.register(lambda: time.sleep(3600))\n"
              "from thinwire.rank_exit import exit_rank\n"
              "exit_rank(1)\n")
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60, env={**os.environ, "THINWIRE_EXIT_HANDLERS_LIMIT_S": "1"})
    assert done.returncode == 1 and time.monotonic() - start < 30
    assert "exit handlers were still running after 1 s" in done.stderr
    assert "time.sleep" in done.stderr or "<lambda>" in done.stderr  # the stuck handler's stack
