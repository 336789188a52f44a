"""`thinwire bench NAME`: benchmarks that write JSON and print a table.

Benchmarks live in the package (not in a loose scripts folder) so that the installed `thinwire`
command can run them; each module defines `register(bench_subparsers)` and a `run(...)` that
returns its rows.
"""

from __future__ import annotations

import argparse
import functools
import importlib

from thinwire.output import check_output_path

# One module per benchmark; each defines `register(subparsers)`.
BENCH_MODULES = [
    "thinwire.bench.topk",
    "thinwire.bench.optim",
    "thinwire.bench.sync",
    "thinwire.bench.ddp_hook",
    "thinwire.bench.ft_per_step",
    "thinwire.bench.ft_cluster",
    "thinwire.bench.cache",
    "thinwire.bench.des",
    "thinwire.bench.cpr",
    "thinwire.bench.cluster_resources",
    "thinwire.bench.pipeline",
    "thinwire.bench.diloco",
    "thinwire.bench.dlcp",
    "thinwire.bench.wavelet",
    "thinwire.bench.wavelet_pipeline",
    "thinwire.bench.auto_grid",
    "thinwire.bench.seed_holdout",
    "thinwire.bench.steps_between",
    "thinwire.bench.intra_probe",
    "thinwire.bench.powersgd_start",
    "thinwire.bench.pace_trigger",
    "thinwire.bench.ddp_auto_replan",
    "thinwire.bench.cpu_floor",
    "thinwire.bench.phase_forms",
]


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("bench", help="run a benchmark (writes JSON, prints a table)")
    bench_sub = parser.add_subparsers(dest="bench", metavar="BENCHMARK")
    bench_sub.required = True
    for module_name in BENCH_MODULES:
        importlib.import_module(module_name).register(bench_sub)
    for sub in bench_sub.choices.values():  # every --json is checked before the work starts
        sub.set_defaults(func=_output_checked(sub.get_default("func")))


def _output_checked(func):
    @functools.wraps(func)
    def run(args: argparse.Namespace):
        check_output_path(getattr(args, "json", None), "--json")
        return func(args)
    return run
