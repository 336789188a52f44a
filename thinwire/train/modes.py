"""How a run synchronises, one registry: every ``--algorithm`` name belongs to exactly one mode.

* ``per-step``: DDP across every rank, the gradient synchronised at every step by a hook: the
  algorithms of thinwire's registry and PyTorch's peers (``thinwire.train.grad_sync``);
* ``diloco``: DDP inside each node, thinwire's DiLoCo across nodes every ``--sync-every`` steps
  (``thinwire.local_sgd.train_adapter``);
* ``torchft-diloco``: the same nodes with torchft's DiLoCo across them, the peer
  (``thinwire.local_sgd.torchft_train``).

A mode checks a ``TrainConfig`` (``check``), builds the run's sync for a module (``build``: an
object with ``model``, ``attach(optimizer)``, ``finish(stopped)``, ``close()``,
``state_dict()``, ``load_state_dict()``, ``totals()``), checks a checkpoint's hook state
(``check_hook``), and names the settings ``thinwire compare`` runs it with (``compare_recipe``).
The training loop, the configuration, compare and the checkpoint checks ask the registry;
none of them compares an algorithm's name with a mode's. How many waves a run has
(``--waves``) is the other axis: ``thinwire.train.entry``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from torch.nn.parallel import DistributedDataParallel

from thinwire import collectives
from thinwire.train import checkpoint_checks, grad_sync


@dataclass(frozen=True)
class Mode:
    name: str
    algorithms: Callable[[], tuple[str, ...]]  # the --algorithm names it takes (read late)
    check: Callable[[Any], None]                # a TrainConfig with one of those names
    build: Callable[[Any, Any, Any], Any]       # (cfg, module, device_ids) -> the run's sync
    check_hook: Callable[[Any, str, list], None]  # (saved hook state, algorithm, param shapes)
    per_step: bool                              # synchronises every step (what --waves 2 needs)
    in_default_race: bool                       # thinwire compare races it without being asked
    compare_recipe: dict = field(default_factory=dict)  # TrainConfig settings compare forces
    # the registered algorithms (thinwire.collectives) a TrainConfig of this mode runs: the
    # ones whose declared options (--algorithm-option) it takes
    collectives: Callable[[Any], tuple[str, ...]] = lambda cfg: ()
    # a mode whose runs choose their algorithm when they start (auto): (cfg, measure_compute)
    # -> (the chosen cfg, a record for the summary), collective; the run then builds the
    # chosen mode. measure_compute(): this rank's compute-only step in ms (collective)
    resolve: Callable[[Any, Callable[[], Any]], tuple[Any, dict]] | None = None


def _check_per_step(cfg) -> None:
    grad_sync.check_algorithm(cfg.algorithm)


def _build_per_step(cfg, module, device_ids):
    model = DistributedDataParallel(module, device_ids=device_ids)
    return grad_sync.register_sync(cfg, model, cfg.ranks_per_node)


def _check_diloco(cfg) -> None:
    from thinwire.local_sgd.train_adapter import check_config

    check_config(cfg)


def _build_diloco(cfg, module, device_ids):
    from thinwire.local_sgd.train_adapter import DiLoCoSync
    from thinwire.topology import Topology

    return DiLoCoSync(cfg, module, Topology.build(cfg.ranks_per_node), device_ids)


def _check_torchft(cfg) -> None:
    from thinwire.local_sgd.torchft_train import check_config

    check_config(cfg)


def _build_torchft(cfg, module, device_ids):
    from thinwire.local_sgd.torchft_train import TorchftDiLoCoSync
    from thinwire.topology import Topology

    return TorchftDiLoCoSync(cfg, module, Topology.build(cfg.ranks_per_node), device_ids)


def _check_no_hook_state(saved, algorithm: str, shapes: list) -> None:
    checkpoint_checks.check_no_hook(saved, algorithm)


def _registered(*names: str) -> tuple[str, ...]:
    return tuple(name for name in names if name in collectives.names())


PER_STEP = Mode("per-step", grad_sync.algorithm_names, _check_per_step, _build_per_step,
                checkpoint_checks.check_per_step_hook, per_step=True, in_default_race=True,
                collectives=lambda cfg: _registered(cfg.algorithm))
DILOCO = Mode("diloco", lambda: ("diloco",), _check_diloco, _build_diloco,
              checkpoint_checks.check_diloco_hook, per_step=False, in_default_race=False,
              collectives=lambda cfg: _registered(cfg.outer_algorithm))
# torchft's recipe as its docs deploy it: one fragment, dense, no overlap
TORCHFT_DILOCO = Mode("torchft-diloco", lambda: ("torchft-diloco",), _check_torchft,
                      _build_torchft, _check_no_hook_state, per_step=False,
                      in_default_race=False,
                      compare_recipe={"outer_algorithm": "allreduce", "fragments": 1,
                                      "overlap": False})
MODES = [PER_STEP, DILOCO, TORCHFT_DILOCO]


def register(mode: Mode) -> Mode:
    """Add a mode defined outside this file (``auto``, in thinwire.train.auto: it plans with
    the lab's cost model, which reads this registry: registering from there keeps the arrow
    one way). Registering the same mode again changes nothing."""
    known = {m.name: m for m in MODES}
    if mode.name in known:
        if known[mode.name] is not mode:
            raise ValueError(f"a training mode named {mode.name!r} is registered already")
        return mode
    clash = set(mode.algorithms()) & set(algorithm_names())
    if clash:
        raise ValueError(f"mode {mode.name!r}: --algorithm names {sorted(clash)} belong to "
                         f"another mode")
    MODES.append(mode)
    return mode


def algorithm_names() -> tuple[str, ...]:
    """Every name ``--algorithm`` takes, mode by mode."""
    return tuple(name for mode in MODES for name in mode.algorithms())


def mode_of(algorithm: str) -> Mode:
    """The mode an ``--algorithm`` name belongs to; a clear error for an unknown name."""
    for mode in MODES:
        if algorithm in mode.algorithms():
            return mode
    raise ValueError(f"--algorithm must be one of {', '.join(algorithm_names())}, "
                     f"got {algorithm!r}")


def check_algorithm_options(cfg) -> dict:
    """``cfg.algorithm_options`` ({algorithm: {name: value}}) checked against the registry's
    declarations, defaults filled in; options of an algorithm this run does not use are
    refused by name (they would be ignored)."""
    given = cfg.algorithm_options
    if not isinstance(given, dict) or not all(isinstance(v, dict) for v in given.values()):
        raise ValueError(f"algorithm_options must be a dict of algorithm -> {{name: value}}, "
                         f"got {given!r}")
    used = mode_of(cfg.algorithm).collectives(cfg)
    for name in given:
        if name not in used:
            runs = ", ".join(used) if used else "none of thinwire's algorithms"
            raise ValueError(f"--algorithm-option {name}:{','.join(given[name]) or '...'}: this "
                             f"run (--algorithm {cfg.algorithm}) uses {runs}, so {name}'s "
                             f"options would be ignored")
    return {name: collectives.get(name).check_options(given[name]) for name in given}
