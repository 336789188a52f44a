"""``python -m thinwire.train.pipeline train ...``: what torchrun starts on every rank."""

import sys

from thinwire.cli import main

if __name__ == "__main__":
    from thinwire.rank_exit import exit_rank

    exit_rank(main(["pipeline"] + sys.argv[1:]))
