"""One training run's configuration: plain values, checked once, shared by the command line.

`add_arguments(parser)` is used by both `thinwire train` and `python -m thinwire.train`, so the
two entry points take exactly the same options.
"""

from __future__ import annotations

import argparse
import math
import os
from dataclasses import asdict, dataclass, field, fields

from thinwire import collectives
from thinwire.cliargs import add_algorithm_option, options_by_algorithm
from thinwire.compress import SPARSE_WIRES, WIRE_DTYPES
from thinwire.train import grad_sync, models, modes, quality

OPTIMIZERS = ("sgd", "lars")
AMP_MODES = ("none", "bf16", "fp16")
DEVICES = ("auto", "cpu", "cuda")
# Far above any useful peak (LARS's large-batch runs use up to ~30); beyond it the first step
# overflows and the run ends in a traceback from deep inside instead of this check.
MAX_LR = 1e3


@dataclass
class TrainConfig:
    model: str = "mlp"
    algorithm: str = "hitopk"
    density: float = 0.01
    selector: str = "mstopk"
    wire: str = "none"               # thinwire algorithms: dense parts on the wire (fp16, bf16)
    sparse_wire: str = "fp32"        # sparse algorithms: the selected values on the wire
    powersgd_rank: int = 4
    optimizer: str = "sgd"
    lr: float | None = None          # None: the model's default (models.MODELS)
    momentum: float = 0.9
    momentum_correction: bool = False  # sparse algorithms + sgd: momentum moves into the hook
    dense_warmup_steps: int = 0      # sparse algorithms: the first N steps all-reduce densely
    density_warmup_steps: int = 0    # sparse algorithms: DGC's exponential density warm-up
    density_warmup_from: float = 0.25  # its first density (falls to --density over N steps)
    powersgd_start_iter: int = 2     # powersgd: dense steps before compression (PyTorch's knob)
    # An algorithm's own settings, {algorithm: {name: value}}, as its registry entry declares
    # them (e.g. {"oktopk": {"tau": 16}}; `--algorithm-option oktopk:tau=16`).
    algorithm_options: dict = field(default_factory=dict)
    weight_decay: float = 5e-4
    warmup_steps: int | None = None  # None: 5% of the run
    epochs: int = 1
    max_iters: int = 0               # 0: no cap, train all epochs
    stop_after: int = 0              # 0: run to the end; N: stop (and checkpoint) after N steps
    batch_size: int = 32             # per rank
    amp: str = "none"
    device: str = "auto"
    seed: int = 0
    checkpoint: str | None = None    # a directory, one file per rank
    checkpoint_every: int = 0
    resume: str | None = None
    metrics: str | None = None       # JSONL, written by rank 0
    summary: str | None = None       # JSON, written by rank 0 at the end
    eval_every: int = 0              # steps; 0: at the end of every epoch
    log_every: int = 10
    target_accuracy: float | None = None
    target_bits_per_byte: float | None = None  # language models: held-out bits per byte
    stop_at_target: bool = False     # end the run at the first evaluation that reaches the target
    budget_s: float = 0.0            # end the run at the first evaluation past this much
    #                                  training time (seconds, evaluation excluded); 0 = none
    compute_probe_iters: int = 5     # 0: do not measure compute-only time
    ranks_per_node: int | None = None
    progress: bool = True
    # --algorithm diloco (thinwire.local_sgd): nodes are DiLoCo workers, DDP inside a node
    sync_every: int = 0
    outer_algorithm: str = "hier_allreduce"
    outer_lr: float = 0.7
    outer_momentum: float = 0.9
    fragments: int = 1
    overlap: bool = False
    outer_chunk: int = 4096          # --outer-algorithm sparseloco: top-k chunk, value bits
    outer_bits: int = 2              # (0 = float32) and error-feedback decay
    outer_decay: float = 0.95
    waves: int = 1                   # 2: Wavelet tick-tock, two processes per slot (thinwire.wavelet)
    wave_turn: str = "backward"      # --waves 2: the tock's forward follows the tick's forward/backward

    def validate(self) -> "TrainConfig":
        models.check_model(self.model)
        from thinwire.wavelet.schedule import check_waves
        check_waves(self.waves)
        modes.mode_of(self.algorithm).check(self)
        self.density = grad_sync.check_density(self.density)
        grad_sync.check_selector(self.selector)
        _choice("--wire", self.wire, tuple(WIRE_DTYPES))
        if self.wire != "none" and not grad_sync.is_thinwire(self.algorithm):
            raise ValueError(f"--wire applies to thinwire's algorithms "
                             f"({', '.join(collectives.names())}); --algorithm {self.algorithm} "
                             f"has its own wire format, got --wire {self.wire}")
        _choice("--sparse-wire", self.sparse_wire, tuple(SPARSE_WIRES))
        if self.sparse_wire != "fp32" and self.algorithm not in collectives.sparse_wire_names():
            raise ValueError(f"--sparse-wire applies to {', '.join(collectives.sparse_wire_names())}"
                             f"; got --algorithm {self.algorithm} with --sparse-wire "
                             f"{self.sparse_wire}")
        grad_sync.check_powersgd_rank(self.powersgd_rank)
        _choice("--optimizer", self.optimizer, OPTIMIZERS)
        _choice("--amp", self.amp, AMP_MODES)
        _choice("--device", self.device, DEVICES)
        if self.lr is not None:
            _positive("--lr", self.lr)
            if self.lr > MAX_LR:
                raise ValueError(f"--lr must be a number in (0, {MAX_LR:g}], got {self.lr!r}")
        for name in ("momentum", "weight_decay"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
                raise ValueError(f"--{name.replace('_', '-')} must be a number >= 0, got {value!r}")
        if not self.momentum < 1:  # a momentum >= 1 never forgets: the steps grow without bound
            raise ValueError(f"--momentum must be a number in [0, 1), got {self.momentum!r}")
        for name in ("checkpoint", "resume"):
            path = getattr(self, name)
            if path is not None and os.path.exists(path) and not os.path.isdir(path):
                raise ValueError(f"--{name} must be a directory (one file per rank inside), "
                                 f"got {path!r}, which is a file")
        _integer("--epochs", self.epochs, 1)
        _integer("--batch-size", self.batch_size, 1)
        for name in ("max_iters", "stop_after", "checkpoint_every", "eval_every",
                     "compute_probe_iters"):
            _integer("--" + name.replace("_", "-"), getattr(self, name), 0)
        _integer("--log-every", self.log_every, 1)
        if self.warmup_steps is not None:
            _integer("--warmup-steps", self.warmup_steps, 0)
        _integer("--dense-warmup-steps", self.dense_warmup_steps, 0)
        _integer("--density-warmup-steps", self.density_warmup_steps, 0)
        if self.density_warmup_steps:
            if not grad_sync.is_sparse(self.algorithm):
                raise ValueError(f"--density-warmup-steps needs a sparse algorithm "
                                 f"({', '.join(collectives.sparse_names())}), got --algorithm "
                                 f"{self.algorithm}")
            if not (isinstance(self.density_warmup_from, (int, float))
                    and self.density <= self.density_warmup_from <= 1):
                raise ValueError(f"--density-warmup-from must be a number in [--density, 1] = "
                                 f"[{self.density:g}, 1], got {self.density_warmup_from!r}")
        self.algorithm_options = modes.check_algorithm_options(self)
        # PyTorch's powerSGD_hook needs start_powerSGD_iter > 1 with error feedback
        _integer("--powersgd-start-iter", self.powersgd_start_iter, 2)
        if self.dense_warmup_steps and not grad_sync.is_sparse(self.algorithm):
            raise ValueError(f"--dense-warmup-steps needs a sparse algorithm "
                             f"({', '.join(collectives.sparse_names())}), got --algorithm "
                             f"{self.algorithm}")
        if self.momentum_correction and self.amp == "fp16":
            raise ValueError("--momentum-correction cannot be used with --amp fp16: the hook's "
                             "velocities would hold loss-scaled (and, on overflow, inf) "
                             "gradients; use --amp bf16 or none")
        if self.momentum_correction:
            if not grad_sync.is_sparse(self.algorithm) or self.optimizer != "sgd":
                raise ValueError(
                    f"--momentum-correction needs --optimizer sgd and a sparse algorithm "
                    f"({', '.join(collectives.sparse_names())}), got --optimizer {self.optimizer} "
                    f"--algorithm {self.algorithm}")
            if not self.momentum < 1:
                raise ValueError(f"--momentum must be < 1 with --momentum-correction, got "
                                 f"{self.momentum!r}")
        if self.target_accuracy is not None and not 0 < self.target_accuracy <= 1:
            raise ValueError(f"--target-accuracy must be in (0, 1], got {self.target_accuracy!r}")
        if self.target_bits_per_byte is not None:
            quality.check_target("bits_per_byte", self.target_bits_per_byte,
                                 "--target-bits-per-byte")
            if models.data_name(self.model) != "stdlib_text":
                raise ValueError(f"--target-bits-per-byte needs a language model (transformer),"
                                 f" got --model {self.model}")
        if self.target_accuracy is not None and self.target_bits_per_byte is not None:
            raise ValueError("give --target-accuracy or --target-bits-per-byte, not both")
        if self.stop_at_target and self.target_accuracy is None \
                and self.target_bits_per_byte is None:
            raise ValueError("--stop-at-target needs --target-accuracy or --target-bits-per-byte")
        quality.check_budget(self.budget_s)
        if self.checkpoint_every and not self.checkpoint:
            raise ValueError("--checkpoint-every needs --checkpoint DIR (where to write it)")
        if self.stop_after and not self.checkpoint:
            raise ValueError("--stop-after needs --checkpoint DIR (to resume from later)")
        if self.waves == 2:
            from thinwire.wavelet.schedule import check_train_config
            check_train_config(self)
        return self

    def to_dict(self) -> dict:
        return asdict(self)


def _choice(param: str, value, allowed) -> None:
    if value not in allowed:
        raise ValueError(f"{param} must be one of {', '.join(allowed)}, got {value!r}")


def _positive(param: str, value) -> None:
    if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
        raise ValueError(f"{param} must be a number > 0, got {value!r}")


def _integer(param: str, value, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{param} must be an integer >= {low}, got {value!r}")


def add_arguments(parser: argparse.ArgumentParser, exclude: tuple = ()) -> None:
    """The training options; ``exclude``: TrainConfig field names to leave out (`thinwire
    compare` sets those per run itself)."""
    d = TrainConfig()

    def a(flag, **kwargs):
        if kwargs.get("dest", flag.lstrip("-").replace("-", "_")) not in exclude:
            parser.add_argument(flag, **kwargs)
    # Choices are checked in TrainConfig.validate (one message style for CLI and Python).
    a("--model", default=d.model, help=f"one of {', '.join(models.MODELS)} (default {d.model})")
    a("--algorithm", default=d.algorithm,
      help=f"one of {', '.join(modes.algorithm_names())} (default {d.algorithm})")
    a("--density", type=float, default=d.density, help="top-k density for the sparse algorithms")
    a("--selector", default=d.selector, help=f"top-k selector: {', '.join(grad_sync.SELECTORS)}")
    a("--wire", default=d.wire, help=f"thinwire's algorithms: dtype of the dense parts on the "
      f"wire, one of {', '.join(WIRE_DTYPES)} (default {d.wire})")
    a("--sparse-wire", default=d.sparse_wire,
      help=f"sparse algorithms that send their own top-k ({', '.join(collectives.sparse_wire_names())}"
      f"): dtype of the selected values on the wire, one of {', '.join(SPARSE_WIRES)} (default "
      f"{d.sparse_wire}; the rounding error stays in the error-feedback residual)")
    a("--powersgd-rank", type=int, default=d.powersgd_rank, help="PowerSGD's matrix rank")
    a("--optimizer", default=d.optimizer, help="sgd (momentum) or lars")
    a("--lr", type=float, default=None,
      help="peak learning rate (default: the model's for sgd, 2.0 for lars)")
    a("--momentum", type=float, default=d.momentum, help="SGD momentum")
    a("--dense-warmup-steps", type=int, default=d.dense_warmup_steps,
      help="sparse algorithms: all-reduce the first N steps densely (residuals start later)")
    a("--density-warmup-steps", type=int, default=d.density_warmup_steps,
      help="sparse algorithms: over the N steps after the dense ones the top-k density falls "
           "exponentially from --density-warmup-from to --density (DGC's warm-up)")
    a("--density-warmup-from", type=float, default=d.density_warmup_from,
      help="the density warm-up's first density, in [--density, 1]")
    a("--powersgd-start-iter", type=int, default=d.powersgd_start_iter,
      help="powersgd: steps all-reduced densely before compression starts (>= 2)")
    if "algorithm_options" not in exclude:
        add_algorithm_option(parser)
    a("--momentum-correction", action="store_true",
      help="sparse algorithms: DGC momentum correction (the momentum is applied before top-k, "
           "in the hook, and the optimizer runs without it)")
    a("--weight-decay", type=float, default=d.weight_decay, help="L2 weight decay")
    a("--warmup-steps", type=int, default=None, help="linear warm-up (default 5%% of the run)")
    a("--epochs", type=int, default=d.epochs, help="training epochs")
    a("--max-iters", type=int, default=d.max_iters, help="cap on steps (0 = all epochs)")
    a("--stop-after", type=int, default=d.stop_after,
      help="stop after N steps of this process and checkpoint (to resume later)")
    a("--batch-size", type=int, default=d.batch_size, help="samples per rank per step")
    a("--amp", default=d.amp, help="none, bf16 (CPU or CUDA) or fp16 (CUDA, with GradScaler)")
    a("--device", default=d.device, help="auto, cpu or cuda")
    a("--seed", type=int, default=d.seed, help="seed of the initial weights and the data order")
    a("--checkpoint", default=None, metavar="DIR", help="write checkpoints here (one file a rank)")
    a("--checkpoint-every", type=int, default=0, metavar="STEPS",
      help="steps between checkpoints (0 = only at the end of the run)")
    a("--resume", default=None, metavar="DIR", help="continue from this checkpoint")
    a("--metrics", default=None, metavar="PATH", help="JSONL metrics (rank 0)")
    a("--summary", default=None, metavar="PATH", help="JSON summary at the end (rank 0)")
    a("--eval-every", type=int, default=0, metavar="STEPS", help="0 = at each epoch's end")
    a("--log-every", type=int, default=d.log_every, metavar="STEPS",
      help="steps between progress log lines")
    a("--target-accuracy", type=float, default=None, help="report the time to reach it")
    a("--target-bits-per-byte", type=float, default=None,
      help="language models: report the time to reach this held-out bits per byte")
    a("--stop-at-target", action="store_true",
      help="end the run at the first evaluation that reaches the target")
    a("--budget-s", type=float, default=d.budget_s, metavar="SECONDS",
      help="end the run at the first evaluation past this much training time (0 = no budget)")
    a("--compute-probe-iters", type=int, default=d.compute_probe_iters,
      help="steps timed without communication, for the communication share (0 = skip)")
    a("--ranks-per-node", type=int, default=None,
      help="default: THINWIRE_RANKS_PER_NODE or torchrun's LOCAL_WORLD_SIZE")
    a("--no-progress", dest="progress", action="store_false", help="no tqdm bar")
    a("--sync-every", type=int, default=d.sync_every,
      help="--algorithm diloco: inner steps between outer steps across nodes")
    a("--outer-algorithm", default=d.outer_algorithm,
      help="--algorithm diloco: how the pseudo-gradient travels between nodes (hitopk: "
           "compressed with --density)")
    a("--outer-lr", type=float, default=d.outer_lr,
      help="--algorithm diloco: outer SGD learning rate")
    a("--outer-momentum", type=float, default=d.outer_momentum, help="Nesterov")
    a("--fragments", type=int, default=d.fragments, help="Streaming DiLoCo fragments")
    a("--overlap", action="store_true",
      help="--algorithm diloco: a fragment's exchange overlaps the next inner step")
    a("--outer-chunk", type=int, default=d.outer_chunk,
      help="--outer-algorithm sparseloco: elements per top-k chunk (--density within each)")
    a("--outer-bits", type=int, default=d.outer_bits,
      help="--outer-algorithm sparseloco: bits per sent value, 2, 4 or 8 (0 = float32)")
    a("--outer-decay", type=float, default=d.outer_decay,
      help="--outer-algorithm sparseloco: decay of the error-feedback residual, in [0, 1]")
    a("--waves", type=int, default=d.waves,
      help="1, or 2 for Wavelet tick-tock: two processes per device slot (launch twice the "
           "ranks per node), the second starting each forward after the first's (default 1)")
    a("--wave-turn", default=d.wave_turn,
      help="--waves 2: the tock wave's forward starts after the tick's forward, or after its "
           "backward (activations freed, the peaks never meet) (default backward)")


def add_config_file(parser: argparse.ArgumentParser, argv: list[str] | None) -> None:
    """``--config FILE``: a JSON object of TrainConfig fields that becomes the parser's
    defaults, so options given on the command line still win (how `thinwire compare` hands a
    run its whole configuration)."""
    import json
    import sys

    parser.add_argument("--config", default=None, metavar="FILE",
                        help="JSON object of training settings (command-line options win)")
    known, _ = parser.parse_known_args(argv if argv is not None else sys.argv[1:])
    if known.config:
        with open(known.config) as handle:
            values = json.load(handle)
        names = {f.name for f in fields(TrainConfig)}
        unknown = sorted(set(values) - names) if isinstance(values, dict) else []
        if not isinstance(values, dict) or unknown:
            raise ValueError(f"--config {known.config}: not a JSON object of training settings "
                             f"(unknown keys: {unknown})")
        parser.set_defaults(**values)


def algorithm_options(args: argparse.Namespace) -> dict:
    """{algorithm: {name: value}}: a --config file's algorithm_options with the command
    line's --algorithm-option values over them."""
    merged = {name: dict(values) for name, values in
              (getattr(args, "algorithm_options", None) or {}).items()}
    for name, values in options_by_algorithm(getattr(args, "algorithm_option", None) or [],
                                             collectives.names()).items():
        merged.setdefault(name, {}).update(values)
    return merged


def from_args(args: argparse.Namespace) -> TrainConfig:
    names = {f.name for f in fields(TrainConfig)}
    values = {k: v for k, v in vars(args).items() if k in names}
    values["algorithm_options"] = algorithm_options(args)
    return TrainConfig(**values).validate()
