"""Run a function on W gloo ranks in fresh processes and collect what each returns.

Rendezvous through a FileStore in a temporary directory (no ports), one process per rank, and a
hard timeout so that a collective mismatch fails the test instead of hanging it; on the timeout
every rank writes the stack of each of its threads (faulthandler, on SIGABRT) to its output
file, whose end the failure's message carries.
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
OUTPUT_TAIL = 6000  # characters of a rank's output in a failure's message
# Ranks fork from a server that imported these once (Python's forkserver): a spawned rank
# imported torch, its compiler (which DDP's constructor imports) and thinwire itself, 3-4 s of
# CPU each, most of a short test's time on a 2-core host. The server only imports (no thread
# pool, no process group), so its fork starts as clean as a fresh interpreter for what a rank
# does. What a fork would otherwise take from the server rather than from the test is set
# again in each rank: the test's environment (``os.environ`` as run_ranks saw it), and its
# standard output and error, which go to a file of the rank's (the server's would be whichever
# test's capture was open when it started). The server passes at most ~250 file descriptors to
# a rank: arguments carry settings, not tensors.
PRELOAD = ["torch", "torch.distributed", "torch._dynamo", "thinwire", "thinwire.ddp",
           "thinwire.collectives", "thinwire.state", "thinwire.sync"]


def start_method() -> str:
    """The start method for rank processes: ``forkserver`` with :data:`PRELOAD`."""
    multiprocessing.set_forkserver_preload(PRELOAD)
    return "forkserver"


# The rank's process groups, kept by its main thread until the process ends (a rank's process
# ends by os._exit: they are never destroyed). destroy_process_group() only unregisters them;
# where the last reference is then dropped on one of gloo's own threads (a future's callback
# holding PowerSGD's state, say), the group's destructor joins that thread from itself and the
# process aborts ("Resource deadlock avoided"; seen once in CI, in
# test_powersgd_runs_one_bucket_at_a_time_and_agrees_across_ranks, while the rank pickled its
# result).
_GROUPS_KEPT: list = []


def _output_path(store_dir: str, rank: int) -> str:
    return os.path.join(store_dir, f"rank{rank}.out")


def _entry(rank: int, world_size: int, store_dir: str, fn, args, kwargs, environ=None):
    if environ is not None:
        os.environ.clear()
        os.environ.update(environ)
    output = open(_output_path(store_dir, rank), "w")
    os.dup2(output.fileno(), 1)
    os.dup2(output.fileno(), 2)
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
            from torch.distributed import distributed_c10d
            _GROUPS_KEPT.extend(distributed_c10d._world.pg_map)
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
        context = mp.start_processes(_entry, args=(world_size, store_dir, fn, args, kwargs,
                                                   dict(os.environ)),
                                     nprocs=world_size, join=False,
                                     start_method=start_method())
        import time
        deadline = time.monotonic() + TIMEOUT_S
        while not _joined(context, store_dir, world_size):
            if time.monotonic() > deadline:
                for process in context.processes:  # one at a time: dumps do not interleave
                    if process.is_alive():
                        os.kill(process.pid, signal.SIGABRT)
                        process.join(DUMP_GRACE_S)
                    process.kill()
                raise RuntimeError(f"ranks did not finish within {TIMEOUT_S} s; their "
                                   f"stacks:\n{_outputs(store_dir, world_size)}")
        results = []
        for rank in range(world_size):
            with open(os.path.join(store_dir, f"rank{rank}.pkl"), "rb") as handle:
                status, value = pickle.load(handle)
            if status != "ok":
                raise RuntimeError(f"rank {rank} failed: {value}\nthe ranks' output:\n"
                                   f"{_outputs(store_dir, world_size)}")
            results.append(value)
        return results


def _joined(context, store_dir: str, world_size: int) -> bool:
    """``context.join`` for a second; a rank that died (a signal, an exit code) raises with
    every rank's output."""
    try:
        return context.join(timeout=1)
    except Exception as exc:
        raise RuntimeError(f"{exc}\nthe ranks' output:\n{_outputs(store_dir, world_size)}") \
            from exc


def _outputs(store_dir: str, world_size: int) -> str:
    """The end of each rank's standard output and error."""
    parts = []
    for rank in range(world_size):
        try:
            with open(_output_path(store_dir, rank), errors="replace") as handle:
                text = handle.read()
        except OSError:
            text = "(no output file: the rank did not start)"
        parts.append(f"--- rank {rank} ---\n{text[-OUTPUT_TAIL:]}")
    return "\n".join(parts)


# --- a peer frozen mid-collective (SIGSTOP): what ends rank 0's wait, and when -------------

def report_outcome(result_path: str, start: float, error: BaseException | None) -> None:
    """Rank 0's report of a frozen-peer test: the seconds since ``start`` and ``error`` (its
    type and message), or "no error"; written whole (a rename) for the waiting test."""
    import time

    text = "no error\n" if error is None else \
        f"{time.monotonic() - start}\n{type(error).__name__}: {error}"
    with open(result_path + ".tmp", "w") as handle:
        handle.write(text)
    os.replace(result_path + ".tmp", result_path)


def frozen_run(entry, nprocs: int, args_of, deadline_s: float = 180.0) -> tuple[str, str]:
    """``entry(rank, *args_of(store_dir, result_path))`` on ``nprocs`` processes, one of which
    freezes itself; (rank 0's elapsed seconds, its message) once it reports (a hang: the test
    fails at ``deadline_s``); every process is killed after."""
    import time

    with tempfile.TemporaryDirectory(prefix="thinwire-frozen-") as tmp:
        result_path = os.path.join(tmp, "rank0.txt")
        context = mp.start_processes(entry, args=args_of(tmp, result_path), nprocs=nprocs,
                                     join=False, start_method=start_method())
        try:
            deadline = time.monotonic() + deadline_s
            while not os.path.exists(result_path) and time.monotonic() < deadline:
                time.sleep(0.2)
            assert os.path.exists(result_path), "rank 0 never reported: a hang"
            elapsed, _, message = open(result_path).read().partition("\n")
            return elapsed, message
        finally:
            for process in context.processes:
                if process.is_alive():
                    os.kill(process.pid, signal.SIGKILL)
