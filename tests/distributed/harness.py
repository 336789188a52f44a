"""Run a function on W gloo ranks in fresh processes and collect what each returns.

Rendezvous through a FileStore in a temporary directory (no ports), one process per rank, and a
hard timeout so that a collective mismatch fails the test instead of hanging it; on the timeout
every rank writes the stack of each of its threads to stderr (faulthandler, on SIGABRT), which
pytest shows with the failure.
"""

from __future__ import annotations

import faulthandler
import multiprocessing
import os
import pickle
import signal
import tempfile
import traceback

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

TIMEOUT_S = 240
DUMP_GRACE_S = 5.0
# Ranks fork from a server that imported these once (Python's forkserver): a spawned rank
# imported torch, its compiler (which DDP's constructor imports) and thinwire itself, 3-4 s of
# CPU each, most of a short test's time on a 2-core host. The server only imports (no thread
# pool, no process group), so its fork starts as clean as a fresh interpreter for what a rank
# does; it keeps the environment of the test process that started it (no test here passes
# settings to its ranks through the environment).
PRELOAD = ["torch", "torch.distributed", "torch._dynamo", "thinwire", "thinwire.ddp",
           "thinwire.collectives", "thinwire.state", "thinwire.sync"]


def start_method() -> str:
    """The start method for rank processes: ``forkserver`` with :data:`PRELOAD`."""
    multiprocessing.set_forkserver_preload(PRELOAD)
    return "forkserver"


def _entry(rank: int, world_size: int, store_dir: str, fn, args, kwargs):
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    faulthandler.enable(all_threads=True)  # SIGABRT from run_ranks' timeout: every stack
    torch.set_num_threads(1)
    store = dist.FileStore(os.path.join(store_dir, "store"), world_size)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size)
    out_path = os.path.join(store_dir, f"rank{rank}.pkl")
    try:
        result = ("ok", fn(rank, world_size, *args, **kwargs))
    except BaseException as exc:  # reported to the test, with the rank's traceback
        result = ("error", f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}")
    finally:
        try:
            # Collect the rank's models (DDP keeps them in reference cycles) while the groups
            # exist: destroyed after them, in the interpreter's teardown, they can abort.
            import gc
            gc.collect()
            dist.destroy_process_group()
        except Exception:
            pass
    with open(out_path + ".tmp", "wb") as handle:
        pickle.dump(result, handle)
    os.replace(out_path + ".tmp", out_path)


def run_ranks(fn, world_size: int, *args, **kwargs) -> list:
    """``fn(rank, world_size, *args, **kwargs)`` on every rank; returns the results by rank.

    Raises RuntimeError naming the first failing rank with its traceback."""
    with tempfile.TemporaryDirectory(prefix="thinwire-test-") as store_dir:
        context = mp.start_processes(_entry, args=(world_size, store_dir, fn, args, kwargs),
                                     nprocs=world_size, join=False,
                                     start_method=start_method())
        import time
        deadline = time.monotonic() + TIMEOUT_S
        while not context.join(timeout=1):
            if time.monotonic() > deadline:
                for process in context.processes:  # one at a time: dumps do not interleave
                    if process.is_alive():
                        os.kill(process.pid, signal.SIGABRT)
                        process.join(DUMP_GRACE_S)
                    process.kill()
                raise RuntimeError(f"ranks did not finish within {TIMEOUT_S} s (their stacks "
                                   "are in the captured stderr)")
        results = []
        for rank in range(world_size):
            with open(os.path.join(store_dir, f"rank{rank}.pkl"), "rb") as handle:
                status, value = pickle.load(handle)
            if status != "ok":
                raise RuntimeError(f"rank {rank} failed: {value}")
            results.append(value)
        return results
