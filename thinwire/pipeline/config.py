"""One pipeline run's settings, its command-line options, and the data stream it trains on."""

from __future__ import annotations

import argparse
import dataclasses
import math
from dataclasses import dataclass, field

import torch

from thinwire.options import checked_as_flags
from thinwire.pipeline import schedules, split

DATASETS = ("digits", "mnist5k")
DTYPES = {"float32": torch.float32, "float64": torch.float64}


# far above any useful step size: past it the first update overflows (the training loop's)
MAX_LR = 1e3


@dataclass
class PipelineConfig:
    schedule: str = "pb"
    stages: int = 4
    cuts: list[int] | None = None        # layer indices; None = balanced
    dataset: str = "digits"
    hidden: list[int] = field(default_factory=lambda: [128, 128, 64])
    micro_batch: int = 1                 # m: samples per micro-batch
    group: int = 4                       # M: micro-batches per update (gpipe, 1f1b)
    epochs: int = 1
    train_samples: int = 0               # 0 = the whole training set
    lr: float = 0.05
    momentum: float = 0.9
    sc: bool = True
    lwp: bool = True
    lwp_form: str = "velocity"           # or "weights" (see thinwire/pipeline/optim.py)
    seed: int = 0
    dtype: str = "float32"
    out: str | None = None
    timeout_s: float = 600.0

    def validate(self) -> None:
        schedules.check_schedule(self.schedule, self.stages, 1, 1)
        if self.dataset not in DATASETS:
            raise ValueError(f"dataset must be one of {', '.join(DATASETS)}, got {self.dataset!r}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        if not isinstance(self.micro_batch, int) or self.micro_batch < 1:
            raise ValueError(f"micro_batch must be an integer >= 1, got {self.micro_batch!r}")
        if not isinstance(self.group, int) or self.group < 1:
            raise ValueError(f"group (M, micro-batches per update) must be >= 1, got {self.group!r}")
        if self.schedule == "ticktock" and self.group % 2:
            raise ValueError(f"group (M) must be even for ticktock (M/2 micro-batches per wave), "
                             f"got {self.group}")
        if self.epochs < 1:
            raise ValueError(f"epochs must be >= 1, got {self.epochs}")
        if self.train_samples < 0:
            raise ValueError(f"train_samples must be >= 0 (0 = all), got {self.train_samples}")
        if any(h < 1 for h in self.hidden):
            raise ValueError(f"hidden widths must be >= 1, got {self.hidden}")
        layers = len(self.hidden) + 1
        split.check_stages(layers, self.stages)
        if self.cuts is not None:
            split.split_sequential(torch.nn.Sequential(*[torch.nn.Identity()] * layers),
                                   self.cuts)
            if len(self.cuts) + 1 != self.stages:
                raise ValueError(f"cuts {self.cuts} make {len(self.cuts) + 1} stages, but "
                                 f"stages={self.stages}")
        if not (isinstance(self.lr, (int, float)) and math.isfinite(self.lr)
                and 0 < self.lr <= MAX_LR):
            raise ValueError(f"lr must be a number in (0, {MAX_LR:g}], got {self.lr!r}")
        if not (isinstance(self.momentum, (int, float)) and 0 <= self.momentum < 1):
            raise ValueError(f"momentum must be in [0, 1), got {self.momentum!r}")
        if self.lwp_form not in ("velocity", "weights"):
            raise ValueError(f"lwp_form must be 'velocity' or 'weights', got {self.lwp_form!r}")
        if not (isinstance(self.timeout_s, (int, float)) and math.isfinite(self.timeout_s)
                and self.timeout_s > 0):
            raise ValueError(f"timeout must be > 0 seconds, got {self.timeout_s}")


class Stream:
    """Micro-batch i of the run: epochs of a seeded permutation, cut into micro-batches of m
    (a remainder at the end of an epoch is skipped). Every rank builds the same stream."""

    def __init__(self, cfg: PipelineConfig, train_size: int):
        self.n = train_size if cfg.train_samples == 0 else min(cfg.train_samples, train_size)
        self.m, self.seed = cfg.micro_batch, cfg.seed
        self.per_epoch = self.n // self.m
        if self.per_epoch == 0:
            raise ValueError(f"micro_batch {self.m} is larger than the {self.n} training samples")
        self.total = self.per_epoch * cfg.epochs
        if cfg.schedule != "pb":
            self.total -= self.total % cfg.group
            if self.total == 0:
                raise ValueError(f"{cfg.schedule} with M={cfg.group} needs at least "
                                 f"{cfg.group} micro-batches, the data give {self.per_epoch}")
        self._orders: dict[int, torch.Tensor] = {}

    def indices(self, i: int) -> torch.Tensor:
        epoch, j = divmod(i, self.per_epoch)
        if epoch not in self._orders:
            gen = torch.Generator().manual_seed(self.seed * 1000 + epoch)
            self._orders[epoch] = torch.randperm(self.n, generator=gen)
        return self._orders[epoch][j * self.m:(j + 1) * self.m]


def build_stages(cfg: PipelineConfig, in_features: int, classes: int) -> list[torch.nn.Module]:
    model = split.mlp(in_features, cfg.hidden, classes, seed=cfg.seed, dtype=DTYPES[cfg.dtype])
    return split.as_stages(model, stages=cfg.stages, cuts=cfg.cuts)


def optimizer_args(cfg: PipelineConfig, stage: int) -> dict:
    """Each stage's StageSGD settings: its own delay D_s (from the schedule formula)."""
    return dict(lr=cfg.lr, momentum=cfg.momentum,
                delay=schedules.delay_formula(cfg.schedule, cfg.stages, stage),
                spike_compensation=cfg.sc, weight_prediction=cfg.lwp, prediction=cfg.lwp_form)


def scale_for_batch_one(lr: float, momentum: float, batch: int) -> tuple[float, float]:
    """Hyper-parameters tuned at batch B, moved to batch 1 (see docs/design.md): the momentum
    keeps its decay per *sample* (m1 = m^(1/B)) and every sample keeps its total contribution to
    the weights, lr / (B (1 - m)) = lr1 / (1 - m1)."""
    if batch < 1:
        raise ValueError(f"batch must be >= 1, got {batch}")
    if not 0.0 <= momentum < 1.0:
        raise ValueError(f"momentum must be in [0, 1), got {momentum}")
    m1 = momentum ** (1.0 / batch)
    return lr * (1.0 - m1) / (batch * (1.0 - momentum)), m1


def add_arguments(p: argparse.ArgumentParser) -> None:
    d = PipelineConfig()
    p.add_argument("--schedule", default=d.schedule,
                   help="pb, gpipe, 1f1b or ticktock (Wavelet; M even, two waves of M/2)")
    p.add_argument("--stages", type=int, default=d.stages, help=f"default {d.stages}")
    p.add_argument("--cuts", default=None, metavar="I,J,..",
                   help="layer indices to cut at (default: balanced)")
    p.add_argument("--dataset", default=d.dataset, help="digits or mnist5k")
    p.add_argument("--hidden", default=",".join(map(str, d.hidden)), metavar="W1,W2,..",
                   help="hidden widths of the MLP (len+1 layers)")
    p.add_argument("--micro-batch", type=int, default=d.micro_batch, help="m, samples per slot")
    p.add_argument("--group", type=int, default=d.group,
                   help="M, micro-batches per update for gpipe and 1f1b")
    p.add_argument("--epochs", type=int, default=d.epochs, help="training epochs")
    p.add_argument("--train-samples", type=int, default=0, help="first N samples (0 = all)")
    p.add_argument("--lr", type=float, default=d.lr, help="SGD learning rate")
    p.add_argument("--momentum", type=float, default=d.momentum, help="SGD momentum")
    p.add_argument("--sc", action=argparse.BooleanOptionalAction, default=True,
                   help="spike compensation (pb only; default on)")
    p.add_argument("--lwp", action=argparse.BooleanOptionalAction, default=True,
                   help="linear weight prediction (pb only; default on)")
    p.add_argument("--lwp-form", default=d.lwp_form,
                   help="velocity (w - lr D v, default) or weights (w + D (w_t - w_(t-1)))")
    p.add_argument("--seed", type=int, default=d.seed,
                   help="seed of the initial weights and the data order")
    p.add_argument("--dtype", default=d.dtype, help="float32 or float64")
    p.add_argument("--out", default=None, metavar="DIR", help="results.json and timeline.png")
    p.add_argument("--timeout", type=float, default=d.timeout_s, metavar="SECONDS",
                   help="stop every rank and fail after this long")


def _int_list(text: str, name: str) -> list[int]:
    try:
        return [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise ValueError(f"{name} must be comma-separated integers, got {text!r}") from None


def from_args(args: argparse.Namespace) -> PipelineConfig:
    cfg = PipelineConfig(
        schedule=args.schedule, stages=args.stages,
        cuts=None if args.cuts is None else _int_list(args.cuts, "--cuts"),
        dataset=args.dataset, hidden=_int_list(args.hidden, "--hidden"),
        micro_batch=args.micro_batch, group=args.group, epochs=args.epochs,
        train_samples=args.train_samples, lr=args.lr, momentum=args.momentum, sc=args.sc,
        lwp=args.lwp, lwp_form=args.lwp_form, seed=args.seed, dtype=args.dtype, out=args.out,
        timeout_s=args.timeout)
    return checked_as_flags(lambda: cfg.validate() or cfg,
                            [f.name for f in dataclasses.fields(PipelineConfig)],
                            {"timeout_s": "--timeout", "sc": "--sc", "lwp": "--lwp"})


def to_argv(cfg: PipelineConfig) -> list[str]:
    """The options that make `from_args` give back ``cfg`` (for the ranks a launch starts)."""
    argv = []
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        flag = "--" + ("timeout" if f.name == "timeout_s" else f.name.replace("_", "-"))
        if f.name in ("sc", "lwp"):
            argv.append(flag if value else f"--no-{f.name}")
        elif value is None:
            continue
        elif isinstance(value, list):
            argv += [flag, ",".join(map(str, value))]
        else:
            argv += [flag, str(value)]
    return argv
