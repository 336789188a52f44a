"""How a run's steps are driven, chosen in one place, and ``python -m thinwire.train``.

* one wave (``thinwire.train.loop``): a step is forward, backward and the synchronisation of
  the run's algorithm (thinwire's registry, PyTorch's peers, DiLoCo and torchft's DiLoCo
  through their sync adapters);
* two waves (``--waves 2``, ``thinwire.wavelet.loop``): Wavelet's tick-tock, two processes a
  slot, one data-parallel job.

This module sits above both loops so that neither imports the other (the wave loop builds on
the one-wave loop's public functions).
"""

from __future__ import annotations

import argparse
import sys

from thinwire.rank_exit import failure_status
from thinwire.train import loop
from thinwire.train import auto  # noqa: F401  (registers --algorithm auto)
from thinwire.train.config import TrainConfig, add_arguments, add_config_file, from_args
from thinwire.wavelet import loop as wave_loop


def train(cfg: TrainConfig) -> dict:
    """Run ``cfg`` in its mode; the summary on rank 0 (an empty dict on other ranks)."""
    cfg.validate()
    if cfg.fault_tolerant:
        from thinwire.train import ft_job
        return ft_job.train(cfg)
    return wave_loop.train(cfg) if cfg.waves == 2 else loop.train(cfg)


def main(argv: list[str] | None = None) -> int:
    """``python -m thinwire.train``: the same options as ``thinwire train``."""
    parser = argparse.ArgumentParser(prog="python -m thinwire.train",
                                     description="Train one model with one algorithm (torchrun-"
                                                 "compatible).")
    add_arguments(parser)
    loop.setup_logging()
    enable_stack_dumps()
    try:
        add_config_file(parser, argv)
        args = parser.parse_args(argv)
        train(from_args(args))
    except Exception as exc:
        return failure_status(exc, "thinwire train")
    return 0


def enable_stack_dumps() -> None:
    """SIGUSR1 writes every thread's Python stack to stderr (and the run goes on): what the
    cluster launcher asks of a run it stops as stalled (`thinwire compare --stall-timeout`),
    and what a user can ask of a rank that seems stuck (`kill -USR1 PID`)."""
    import faulthandler
    import io
    import signal

    try:
        faulthandler.register(signal.SIGUSR1, all_threads=True, chain=False)
    except (AttributeError, ValueError, io.UnsupportedOperation):
        pass  # stderr is no file (main() called in-process, output captured): nothing to dump to
