"""What every benchmark shares: timing by the median, and its ``--json`` output."""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time
from typing import Any, Callable

from thinwire.output import format_table, write_json_atomic

__all__ = ["format_table", "median_time", "run_cluster_worker", "save_if_asked",
           "write_json_atomic"]


def median_time(fn: Callable[[], Any], repeats: int, warmup: int = 1,
                sync: Callable[[], None] | None = None) -> float:
    """Median wall time of `fn` over `repeats` runs, after `warmup` untimed runs."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    for _ in range(warmup):
        fn()
    if sync:
        sync()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        if sync:
            sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def save_if_asked(path: str | os.PathLike | None, payload: Any) -> None:
    """The ``--json PATH`` of every benchmark: write atomically and say where, or do nothing."""
    if path:
        write_json_atomic(path, payload)
        print(f"wrote {path}")


COLLECTIVE_TIMEOUT_S = 300.0  # a benchmark's collective waits this long for a peer


def add_sweep_inputs(parser, what: str) -> None:
    """--results (recorded sweeps and their repetitions), --repeats and --json: the inputs of
    the benchmarks that read `thinwire compare` sweeps instead of racing (``what``: the JSON)."""
    from thinwire.sim.repeats import add_repeats_option

    parser.add_argument("--results", nargs="+", required=True,
                        help="thinwire compare results.json files of one sweep (several: its "
                             "repetitions)")
    add_repeats_option(parser)
    parser.add_argument("--json", default=None, help=f"write {what} here")


def add_collective_timeout(parser) -> None:
    """``--collective-timeout`` of a benchmark whose ranks run collectives (and of its
    worker): a lost peer ends every rank within it, in one line."""
    from thinwire.cliargs import number

    parser.add_argument("--collective-timeout", type=number(0, 86400, low_open=True),
                        default=COLLECTIVE_TIMEOUT_S, metavar="SECONDS",
                        help="seconds a collective waits for a peer before every surviving "
                             f"rank ends (default {COLLECTIVE_TIMEOUT_S:g})")


def init_worker_group(collective_timeout_s: float) -> None:
    """A benchmark worker's default group (gloo), with the benchmark's collective timeout
    (thinwire's own groups take theirs from it), not PyTorch's 30 minutes."""
    import datetime

    import torch.distributed as dist
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=collective_timeout_s))


def end_worker(main, command: str):
    """A worker's entry: ``main()``, then the rank ends (``rank_exit``); a lost peer or a bad
    value ends it in one line (``rank_exit.failure_status``)."""
    from thinwire.rank_exit import exit_rank, failure_status

    try:
        main()
    except Exception as exc:
        exit_rank(failure_status(exc, command))
    exit_rank()


def run_cluster_worker(spec, module: str, args: list[str], timeout_s: float,
                       collective_timeout_s: float | None = None) -> dict:
    """Runs ``python -m module --out FILE *args`` on every rank of the emulated cluster ``spec``
    and returns the JSON its rank 0 wrote to FILE (a benchmark's worker side).
    ``collective_timeout_s``: passed as ``--collective-timeout`` (workers that take it)."""
    from thinwire.cluster import run as run_on_cluster

    if collective_timeout_s is not None:
        args = [*args, "--collective-timeout", str(collective_timeout_s)]
    with tempfile.TemporaryDirectory(prefix="thinwire-bench-") as tmp:
        out = os.path.join(tmp, "rows.json")
        status = run_on_cluster(spec, ["-m", module, "--out", out, *args], timeout_s=timeout_s,
                                output=sys.stderr)
        if status != 0:
            raise RuntimeError(f"the benchmark ranks of {module} failed with exit status {status}")
        with open(out) as handle:
            return json.load(handle)
