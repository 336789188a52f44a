"""``python -m thinwire.wavelet [thinwire train options]``: the wave loop for 1 or 2 waves.

`thinwire train --waves 2` reaches the same loop; this entry point also runs one wave through
it (so a benchmark compares one and two waves on identical code) and knows the `tallmlp`
model (`thinwire.wavelet.tallmlp`).
"""

from __future__ import annotations

import argparse
import sys

from thinwire.train.config import add_arguments, add_config_file, from_args
from thinwire.train.entry import enable_stack_dumps
from thinwire.train.loop import setup_logging
from thinwire.wavelet import loop, tallmlp


def main(argv: list[str] | None = None) -> int:
    tallmlp.register()
    parser = argparse.ArgumentParser(prog="python -m thinwire.wavelet",
                                     description="One wave of a tick-tock job (or a plain one "
                                                 "with --waves 1), under torchrun.")
    add_arguments(parser)
    setup_logging()
    enable_stack_dumps()
    try:
        add_config_file(parser, argv)
        loop.train(from_args(parser.parse_args(argv)))
    except (ValueError, TypeError, FileNotFoundError) as exc:
        print(f"python -m thinwire.wavelet: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    from thinwire.rank_exit import exit_rank

    exit_rank(main())
