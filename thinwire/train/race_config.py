"""The training configuration of one run of a race: a workload's settings, the user's overrides,
and what the run's algorithm does not use reset to its default.

`thinwire compare` builds every run's config here, and so do the lab's readers of its results
(`thinwire plan` rebuilds a measured run's config to know what it measured, and builds its
candidates' the same way), without importing compare's runner.
"""

from __future__ import annotations

import dataclasses

from thinwire.train import modes, settings, workloads
from thinwire.train.config import TrainConfig

# TrainConfig fields a race sets for each run itself; every other field is a user override.
PER_RUN = ("algorithm", "checkpoint", "checkpoint_every", "resume", "metrics", "summary",
           "stop_after", "eval_every", "progress", "ranks_per_node", "target_accuracy",
           "target_bits_per_byte", "stop_at_target", "budget_s", "log_every", "device",
           "fault_tolerant", "resume_if_present")  # compare --fault-tolerant sets the first
TRAIN_FIELDS = tuple(f.name for f in dataclasses.fields(TrainConfig) if f.name not in PER_RUN)


def base_config(workload: str, train: dict) -> TrainConfig:
    """The workload's training settings with the user's overrides (no run's yet)."""
    wl = workloads.WORKLOADS[workload]
    return dataclasses.replace(TrainConfig(), **{
        "model": wl.model, "epochs": wl.epochs, "batch_size": wl.batch_size, "lr": wl.lr,
        **wl.sparse, **train})


def run_config(workload: str, algorithm: str, train: dict, *, ranks_per_node: int,
               target: float | None = None, budget_s: float | None = None,
               eval_every: int = 0, stop_at_target: bool = True, lr: float | None = None,
               seed: int | None = None) -> TrainConfig:
    """One run's config: ``target``/``budget_s`` None and ``eval_every`` 0 are the
    workload's."""
    wl = workloads.WORKLOADS[workload]
    base = base_config(workload, train)
    target = wl.target if target is None else target
    mode = modes.mode_of(algorithm)
    cfg = dataclasses.replace(base, algorithm=algorithm,
                              **mode.compare_recipe)  # torchft's: its documented one
    # a race's setting this run does not use goes back to its default (ddp takes no
    # --density); resetting one can make another inapplicable (--density-warmup-from)
    while reset := settings.inapplicable(cfg):
        cfg = dataclasses.replace(cfg, **reset)
    # each run takes the declared options of the algorithms it runs, not the race's others
    runs = mode.collectives(cfg)
    return dataclasses.replace(
        cfg, lr=base.lr if lr is None else lr,
        seed=base.seed if seed is None else seed, progress=False, log_every=1,
        eval_every=eval_every or wl.eval_every, ranks_per_node=ranks_per_node,
        target_accuracy=target if wl.metric == "test_accuracy" else None,
        target_bits_per_byte=target if wl.metric == "bits_per_byte" else None,
        stop_at_target=stop_at_target,
        budget_s=wl.budget_s if budget_s is None else budget_s,
        algorithm_options={name: values for name, values
                           in base.algorithm_options.items() if name in runs})
