"""Every setting of one training run, declared once, grouped by concern.

Each :class:`Setting` is an :class:`thinwire.options.Option` (name, type, default, range or
choices, help) plus where it belongs on the command line and which runs it applies to. From
this one table come:

* :class:`thinwire.train.config.TrainConfig`'s fields and defaults;
* the options of `thinwire train`, `python -m thinwire.train` and `thinwire compare`
  (:func:`thinwire.train.config.add_arguments`);
* each value's type and range check in ``TrainConfig.validate`` (a bool is a bool, a number is
  finite: a config file's ``"false"`` is refused, not taken as true);
* the refusal of a setting given to a run it does not apply to (``--sync-every`` with hitopk,
  ``--outer-bits`` with a dense outer step, ``--wave-turn`` without ``--waves 2``), and
  compare's per-run reset of such settings (:func:`inapplicable`).

What relates several settings (``--density-warmup-from`` within [--density, 1], targets and
checkpoints, a mode's own rules) stays in ``TrainConfig.validate`` and the modes' checks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from thinwire import collectives, plan_choice
from thinwire.compress import SPARSE_WIRES, WIRE_DTYPES
from thinwire.local_sgd.chunked import MAX_CHUNK
from thinwire.local_sgd.sparse_outer import NAME as SPARSELOCO
from thinwire.sim import repeats
from thinwire.options import Option
from thinwire.train import grad_sync, models, modes
from thinwire.wavelet.schedule import TURNS, check_waves

OPTIMIZERS = ("sgd", "lars")
AMP_MODES = ("none", "bf16", "fp16")
DEVICES = ("auto", "cpu", "cuda")
# Far above any useful peak (LARS's large-batch runs use up to ~30); beyond it the first step
# overflows and the run ends in a traceback from deep inside instead of this check.
MAX_LR = 1e3
# DiLoCo's outer learning rate: the papers use 0.7 (Nesterov); far above, the first outer step
# throws the model away (1e30 trained to NaN and exited 0).
MAX_OUTER_LR = 10.0


@dataclass(frozen=True)
class Setting(Option):
    """``concern``: its group in --help; ``flag``: default ``--name-with-dashes``;
    ``negate``: a bool whose flag turns it off (``--no-progress``); ``applies(cfg)``: whether a
    run uses it, ``applies_to`` says to which runs in words (a value other than the default
    is refused where it does not apply); ``check_with(value, flag)``: a check with a richer
    message than the declaration's (returns the value)."""

    concern: str = "run"
    flag: str | None = None
    negate: bool = False
    applies: Callable[[Any], bool] | None = None
    applies_to: Any = ""  # words, or a function returning them (a registry's names)
    check_with: Callable[[Any, str], Any] | None = None
    metavar: str | None = None

    @property
    def applies_text(self) -> str:
        return self.applies_to() if callable(self.applies_to) else self.applies_to

    @property
    def cli_flag(self) -> str:
        return self.flag or "--" + self.name.replace("_", "-")

    def checked(self, value) -> Any:
        """The value, checked against the declaration, named by its command-line flag."""
        if self.check_with is not None:
            return self.check_with(value, self.cli_flag)
        return self.check(value, label=self.cli_flag)


def _sparse_text() -> str:
    return f"a sparse per-step algorithm ({', '.join(collectives.sparse_names())})"


def _per_step(cfg) -> bool:
    return modes.mode_of(cfg.algorithm).per_step


def _local_sgd(cfg) -> bool:
    return not _per_step(cfg)


def _sparse_per_step(cfg) -> bool:
    return grad_sync.is_sparse(cfg.algorithm)


def _top_k(cfg) -> bool:
    """A top-k runs somewhere: a sparse per-step algorithm, or a sparse DiLoCo outer step."""
    return _sparse_per_step(cfg) or (_local_sgd(cfg) and (
        cfg.outer_algorithm in collectives.sparse_names() or cfg.outer_algorithm == SPARSELOCO))


def _selector(cfg) -> bool:
    return _sparse_per_step(cfg) or (_local_sgd(cfg)
                                     and cfg.outer_algorithm in collectives.sparse_names())


def _sparseloco(cfg) -> bool:
    return _local_sgd(cfg) and cfg.outer_algorithm == SPARSELOCO


def _outer_algorithms() -> tuple[str, ...]:
    return collectives.names() + (SPARSELOCO,)


S = Setting
SETTINGS: tuple[Setting, ...] = (
    # --- the model, its data and the device
    S("model", str, "mlp", "the model (and with it the data set)",
      choices=lambda: tuple(models.MODELS), concern="model"),
    S("epochs", int, 1, "training epochs", low=1, concern="model"),
    S("max_iters", int, 0, "cap on steps (0 = all epochs)", low=0, concern="model"),
    S("batch_size", int, 32, "samples per rank per step", low=1, concern="model"),
    S("seed", int, 0, "seed of the initial weights and the data order", low=0, concern="model"),
    S("amp", str, "none", "none, bf16 (CPU or CUDA) or fp16 (CUDA, with GradScaler)",
      choices=AMP_MODES, concern="model"),
    S("device", str, "auto", "auto, cpu or cuda", choices=DEVICES, concern="model"),
    # --- how gradients travel every step
    S("algorithm", str, "hitopk", "how gradients are synchronised (a per-step algorithm, or "
      "diloco / torchft-diloco: DDP inside a node, an outer step across nodes)",
      choices=modes.algorithm_names, concern="sync"),
    S("plan_from", str, "", "thinwire compare results of this workload (comma-separated "
      "paths): auto's plan is calibrated on them and reads steps to target from them",
      applies=lambda c: modes.mode_of(c.algorithm).resolve is not None,
      applies_to="--algorithm auto", concern="sync", metavar="RESULTS_JSON[,...]"),
    S("plan_steps_from", str, "", "auto: more thinwire compare results of this workload whose "
      "steps to target the plan reads too, not fitted on (races of other seeds, unshaped: "
      "steps do not depend on the link); the median over seeds is the estimate",
      applies=lambda c: modes.mode_of(c.algorithm).resolve is not None,
      applies_to="--algorithm auto", concern="sync", metavar="RESULTS_JSON[,...]"),
    S("plan_repeats", str, "each", "auto: " + repeats.HELP, choices=repeats.REPEATS,
      applies=lambda c: modes.mode_of(c.algorithm).resolve is not None,
      applies_to="--algorithm auto", concern="sync"),
    S("plan_algorithms", str, "", "auto: choose only among candidates of these algorithms "
      "(comma-separated; empty: every one the plan ranks)",
      applies=lambda c: modes.mode_of(c.algorithm).resolve is not None,
      applies_to="--algorithm auto", concern="sync", metavar="ALGORITHM[,...]"),
    S("replan_every_s", float, 10.0, "auto: seconds of training between probes of the link "
      "(after an evaluation); 0 = choose once", low=0.0,
      applies=lambda c: modes.mode_of(c.algorithm).resolve is not None,
      applies_to="--algorithm auto", concern="sync", metavar="SECONDS"),
    S("replan_share", float, 0.3, "auto: re-plan where the probed goodput moved by more than "
      "this share since the last plan", low=0.0, low_open=True, high=10.0,
      applies=lambda c: modes.mode_of(c.algorithm).resolve is not None,
      applies_to="--algorithm auto", concern="sync"),
    S("handover_steps", int, plan_choice.HANDOVER_STEPS, "auto: a switch hands the old "
      "algorithm's residuals to this many steps' gradients in equal shares (1: all to the "
      "next step)", low=1,
      applies=lambda c: modes.mode_of(c.algorithm).resolve is not None,
      applies_to="--algorithm auto", concern="sync", metavar="STEPS"),
    S("density", float, 0.01, "top-k density of the sparse algorithms (and of a sparse DiLoCo "
      "outer step)", low=0.0, low_open=True, high=1.0, applies=_top_k,
      applies_to=lambda: f"a sparse algorithm or --outer-algorithm "
                         f"({', '.join(collectives.sparse_names() + (SPARSELOCO,))})",
      concern="sync"),
    S("selector", str, "auto", "top-k selector", choices=grad_sync.SELECTORS,
      applies=_selector, applies_to="a sparse algorithm's top-k", concern="sync"),
    S("wire", str, "none", "thinwire's algorithms: dtype of the dense parts on the wire",
      choices=tuple(WIRE_DTYPES), applies=lambda c: grad_sync.is_thinwire(c.algorithm),
      applies_to=lambda: f"thinwire's algorithms ({', '.join(collectives.names())}; PyTorch's "
                         f"peers have their own wire format)",
      concern="sync"),
    S("sparse_wire", str, "fp32", "dtype of the selected values on the wire (the rounding "
      "error stays in the error-feedback residual)", choices=tuple(SPARSE_WIRES),
      applies=lambda c: c.algorithm in collectives.sparse_wire_names(),
      applies_to=lambda: f"the algorithms that send their own top-k "
                         f"({', '.join(collectives.sparse_wire_names())})", concern="sync"),
    S("momentum_correction", bool, False, "DGC momentum correction (the momentum is applied "
      "before top-k, in the hook, and the optimizer runs without it)", applies=_sparse_per_step,
      applies_to=_sparse_text, concern="sync"),
    S("dense_warmup_steps", int, 0, "all-reduce the first N steps densely (residuals start "
      "later)", low=0, applies=_sparse_per_step, applies_to=_sparse_text,
      concern="sync"),
    S("density_warmup_steps", int, 0, "over the N steps after the dense ones the top-k density "
      "falls exponentially from --density-warmup-from to --density (DGC's warm-up)", low=0,
      applies=_sparse_per_step, applies_to=_sparse_text, concern="sync"),
    S("density_warmup_from", float, 0.25, "the density warm-up's first density, in "
      "[--density, 1]", low=0.0, low_open=True, high=1.0,
      applies=lambda c: c.density_warmup_steps > 0, applies_to="--density-warmup-steps N > 0",
      concern="sync"),
    S("powersgd_rank", int, 4, "PowerSGD's matrix rank", low=1,
      applies=lambda c: grad_sync.takes_powersgd_settings(c.algorithm),
      applies_to="--algorithm powersgd", concern="sync"),
    S("powersgd_start_iter", int, 2, "steps all-reduced densely before PowerSGD compresses "
      "(PyTorch's own needs >= 2; thinwire's hook carries the error memory through DDP's "
      "bucket rebuild, so 0 and 1 run too)", low=0,
      applies=lambda c: grad_sync.takes_powersgd_settings(c.algorithm),
      applies_to="--algorithm powersgd", concern="sync"),
    # --- the optimizer and its schedule
    S("optimizer", str, "sgd", "sgd (momentum) or lars", choices=OPTIMIZERS, concern="optim"),
    S("lr", float, None, "peak learning rate (none: the model's for sgd, 2.0 for lars)",
      low=0.0, low_open=True, high=MAX_LR, optional=True, concern="optim"),
    S("momentum", float, 0.9, "SGD momentum", low=0.0, high=1.0, high_open=True,
      concern="optim"),
    S("weight_decay", float, 5e-4, "L2 weight decay", low=0.0, concern="optim"),
    S("warmup_steps", int, None, "linear warm-up steps (none: 5%% of the run)", low=0,
      optional=True, concern="optim"),
    # --- DiLoCo: nodes are workers, DDP inside a node (thinwire.local_sgd)
    S("sync_every", int, 0, "inner steps between outer steps across nodes", low=0,
      applies=_local_sgd, applies_to="--algorithm diloco or torchft-diloco", concern="diloco"),
    S("outer_algorithm", str, "hier_allreduce", "how the pseudo-gradient travels between nodes "
      "(a sparse one: compressed with --density)", choices=_outer_algorithms,
      applies=_local_sgd, applies_to="--algorithm diloco or torchft-diloco", concern="diloco"),
    S("outer_lr", float, 0.7, "outer SGD learning rate (Nesterov)", low=0.0, low_open=True,
      high=MAX_OUTER_LR, applies=_local_sgd, applies_to="--algorithm diloco or torchft-diloco",
      concern="diloco"),
    S("outer_momentum", float, 0.9, "outer Nesterov momentum", low=0.0, high=1.0,
      high_open=True, applies=_local_sgd, applies_to="--algorithm diloco or torchft-diloco",
      concern="diloco"),
    S("fragments", int, 1, "Streaming DiLoCo fragments", low=1, applies=_local_sgd,
      applies_to="--algorithm diloco or torchft-diloco", concern="diloco"),
    S("overlap", bool, False, "a fragment's exchange overlaps the next inner step",
      applies=_local_sgd, applies_to="--algorithm diloco or torchft-diloco", concern="diloco"),
    S("outer_chunk", int, 4096, "elements per top-k chunk (--density within each)", low=1,
      high=MAX_CHUNK,
      applies=_sparseloco, applies_to="--outer-algorithm sparseloco", concern="diloco"),
    S("outer_bits", int, 2, "bits per sent value, 2, 4 or 8 (0 = float32)", low=0, high=8,
      applies=_sparseloco, applies_to="--outer-algorithm sparseloco", concern="diloco"),
    S("outer_decay", float, 0.95, "decay of the error-feedback residual", low=0.0, high=1.0,
      applies=_sparseloco, applies_to="--outer-algorithm sparseloco", concern="diloco"),
    # --- Wavelet tick-tock (thinwire.wavelet)
    S("waves", int, 1, "1, or 2 for Wavelet tick-tock: two processes per device slot (launch "
      "twice the ranks per node), the second starting each forward after the first's",
      check_with=check_waves, concern="waves"),
    S("wave_turn", str, "backward", "the tock wave's forward starts after the tick's forward, "
      "or after its backward (activations freed, the peaks never meet)", choices=TURNS,
      applies=lambda c: c.waves == 2, applies_to="--waves 2", concern="waves"),
    # --- what the run measures, writes and when it stops
    S("stop_after", int, 0, "stop after N steps of this process and checkpoint (to resume "
      "later; 0 = run to the end)", low=0),
    S("checkpoint", str, None, "write checkpoints here (a directory, one file a rank)",
      optional=True, metavar="DIR"),
    S("checkpoint_every", int, 0, "steps between checkpoints (0 = only at the end of the run)",
      low=0, metavar="STEPS"),
    S("resume", str, None, "continue from this checkpoint directory", optional=True,
      metavar="DIR"),
    S("fault_tolerant", bool, False, "go on when a node vanishes and heal it when it comes "
      "back, without a restart (torchft's quorum; allreduce, hier_allreduce, topk_allgather "
      "or hitopk): launch it with `thinwire cluster run --fault-tolerant`"),
    S("resume_if_present", bool, False, "continue from --checkpoint's directory when it holds "
      "checkpoints, start afresh when it holds none: one command line for the first start and "
      "torchrun's restarts (--max-restarts)"),
    S("metrics", str, None, "JSONL metrics (rank 0)", optional=True, metavar="PATH"),
    S("summary", str, None, "JSON summary at the end (rank 0)", optional=True, metavar="PATH"),
    S("eval_every", int, 0, "steps between evaluations (0 = at each epoch's end)", low=0,
      metavar="STEPS"),
    S("log_every", int, 10, "steps between progress log lines", low=1, metavar="STEPS"),
    S("target_accuracy", float, None, "report the time to reach this test accuracy",
      low=0.0, low_open=True, high=1.0, optional=True),
    S("target_bits_per_byte", float, None, "language models: report the time to reach this "
      "held-out bits per byte", optional=True),
    S("stop_at_target", bool, False, "end the run at the first evaluation that reaches the "
      "target"),
    S("budget_s", float, 0.0, "end the run at the first evaluation past this much training "
      "time in seconds (0 = no budget)", low=0.0, metavar="SECONDS"),
    S("compute_probe_iters", int, 5, "steps timed without communication, for the "
      "communication share (0 = skip)", low=0),
    S("collective_timeout_s", float, 300.0, "seconds a collective waits for a peer before the "
      "step fails on every surviving rank (the process groups' and torchft's timeout; "
      "PyTorch's own default is 1800)",
      low=1.0, high=7 * 86400.0, flag="--collective-timeout", metavar="SECONDS"),
    S("ranks_per_node", int, None, "none: THINWIRE_RANKS_PER_NODE or torchrun's "
      "LOCAL_WORLD_SIZE", low=1, optional=True),
    S("progress", bool, True, "a tqdm progress bar", flag="--no-progress", negate=True),
)
BY_NAME = {setting.name: setting for setting in SETTINGS}
CONCERNS = {"model": "the model, its data and the device", "sync": "gradient synchronisation",
            "optim": "the optimizer and its schedule",
            "diloco": "DiLoCo (--algorithm diloco / torchft-diloco)",
            "waves": "Wavelet tick-tock (--waves 2)",
            "run": "what the run measures, writes, and when it stops"}


def refuse_inapplicable(cfg) -> None:
    """A setting given a value other than its default where the run does not use it is
    refused by name (it would be ignored without a word)."""
    for name in inapplicable(cfg):  # the first, in declaration order
        setting = BY_NAME[name]
        raise ValueError(f"{setting.cli_flag} applies to {setting.applies_text}; this run "
                         f"(--algorithm {cfg.algorithm}) does not use it, got "
                         f"{setting.cli_flag} {_shown(getattr(cfg, name))}")


def inapplicable(cfg) -> dict:
    """{name: default} of the settings ``cfg`` holds a value for that its run does not use
    (what `thinwire compare` resets for each run of a race)."""
    return {s.name: s.default for s in SETTINGS
            if s.applies is not None and getattr(cfg, s.name) != s.default
            and not s.applies(cfg)}


def _shown(value) -> str:
    return "" if value is True else str(value)
