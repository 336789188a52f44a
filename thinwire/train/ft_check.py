"""What `thinwire train --fault-tolerant` can run, checked before anything launches.

Fault-tolerant per-step training (thinwire.ft.per_step, run by thinwire.train.ft_job) heals a
node from a live peer instead of a checkpoint, synchronises after backward rather than in a
DDP hook, and runs one wave on the CPU's gloo groups: what needs otherwise is refused by name.
"""

from __future__ import annotations

from thinwire.ft.per_step import ALGORITHMS

# setting -> (its value when unused, why it does not go with --fault-tolerant)
REFUSED = {
    "checkpoint": (None, "a node heals from a live peer, not from a checkpoint"),
    "resume": (None, "a node heals from a live peer, not from a checkpoint"),
    "resume_if_present": (False, "a node heals from a live peer, not from a checkpoint"),
    "stop_after": (0, "a node heals from a live peer, not from a checkpoint"),
    "waves": (1, "the fault-tolerant step runs one wave"),
    "amp": ("none", "the fault-tolerant step runs in float32"),
    "budget_s": (0.0, "the fault-tolerant run stops at its target or its steps"),
}


def check_train_config(cfg) -> None:
    """Raises ValueError naming the flag, its value and what --fault-tolerant allows."""
    if cfg.algorithm not in ALGORITHMS:
        raise ValueError(f"--fault-tolerant runs --algorithm {', '.join(ALGORITHMS)}, got "
                         f"--algorithm {cfg.algorithm}")
    if cfg.device == "cuda":
        raise ValueError("--fault-tolerant trains on the CPU here (--device cpu or auto): its "
                         "node groups are gloo; the GPU path is tested through the library "
                         "(tests/distributed/test_ft_per_step.py), not this entry point")
    for name, (unused, why) in REFUSED.items():
        value = getattr(cfg, name)
        if value != unused:
            flag = "--" + name.replace("_", "-")
            raise ValueError(f"{flag} {value} cannot be used with --fault-tolerant: {why}")
