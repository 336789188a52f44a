"""The `thinwire` command.

Each feature area registers its own subcommands through a `register(subparsers)` function, so this
file only wires them together; the work lives next to the code it drives.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

from thinwire import __version__, cliargs
from thinwire.rank_exit import failure_status


# One module per feature area; each defines `register(subparsers)`.
COMMAND_MODULES = [
    "thinwire.bench",
    "thinwire.cluster.cli",
    "thinwire.train.cli",
    "thinwire.sim.cli",
    "thinwire.sim.plan_cli",
    "thinwire.data.cli",
    "thinwire.recsys.cli",
    "thinwire.train.pipeline.cli",
]


def build_parser() -> argparse.ArgumentParser:
    import importlib

    parser = argparse.ArgumentParser(
        prog="thinwire",
        description="Distributed training for clusters whose network is the bottleneck.",
    )
    parser.add_argument("--version", action="version", version=f"thinwire {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for module_name in COMMAND_MODULES:
        importlib.import_module(module_name).register(sub)
    # One formatter for every command, so each option's --help shows its default.
    cliargs.apply_help_formatter(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        if getattr(args, "takes_argv", False):  # it parses its options again (train --config)
            return int(args.func(args, argv) or 0)
        return int(args.func(args) or 0)
    except Exception as exc:  # bad input or a lost peer: one clear line; a bug: its traceback
        # a rank of a launched run (the pipeline's) says which rank lost whom, at which step
        return failure_status(exc, "thinwire", rank_process="RANK" in os.environ)


if __name__ == "__main__":
    sys.exit(main())
