"""What a training checkpoint must hold before any of it is loaded into a run.

The checksum (`thinwire.safefile`) proves a file is what was written; these checks prove that
what was written fits this run: every field present with its type and range, the model's and
the optimizer's tensors with this model's names, shapes and dtypes, the hook's memory well
formed. A file that fails is refused with `CheckpointMismatch` naming the field, and the loader
falls back to the previous checkpoint, so nothing wrong reaches `load_state_dict` (whose own
errors are tracebacks: "size mismatch", AttributeError, a failure at the first step).

PowerSGD's numpy RandomState is kept as plain data (`rng_to_plain` / `rng_from_plain`): the
MT19937 key as an int64 tensor plus its position and cached Gaussian, so the file loads with
``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from thinwire import collectives


class CheckpointMismatch(ValueError):
    """A checkpoint field that is missing, of the wrong type, out of range or of the wrong
    shape for this run."""


def rng_to_plain(rng: np.random.RandomState) -> dict:
    name, keys, pos, has_gauss, cached = rng.get_state(legacy=True)
    return {"bit_generator": str(name), "keys": torch.from_numpy(keys.astype(np.int64)),
            "pos": int(pos), "has_gauss": int(has_gauss), "cached_gaussian": float(cached)}


def rng_from_plain(state: dict) -> np.random.RandomState:
    _require(isinstance(state, dict) and state.get("bit_generator") == "MT19937",
             "hook.rng", "a MT19937 state", type(state).__name__)
    keys = state.get("keys")
    _require(isinstance(keys, torch.Tensor) and keys.shape == (624,) and keys.dtype == torch.int64
             and bool(((keys >= 0) & (keys < 2 ** 32)).all()), "hook.rng.keys",
             "624 integers in [0, 2**32)", getattr(keys, "shape", keys))
    _require(_is_int(state.get("pos")) and 0 <= state["pos"] <= 624, "hook.rng.pos",
             "an integer in [0, 624]", state.get("pos"))
    _require(_is_int(state.get("has_gauss")) and isinstance(state.get("cached_gaussian"), float),
             "hook.rng", "has_gauss (int) and cached_gaussian (float)",
             (state.get("has_gauss"), state.get("cached_gaussian")))
    rng = np.random.RandomState()
    rng.set_state(("MT19937", keys.numpy().astype(np.uint32), state["pos"],
                   int(state["has_gauss"]), float(state["cached_gaussian"])))
    return rng


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _require(ok: bool, field: str, allowed: str, got) -> None:
    if not ok:
        raise CheckpointMismatch(f"field {field!r} is {got!r}, expected {allowed}")


def check_fields(payload, steps_per_epoch: int, epochs: int) -> None:
    """Types and ranges of the plain fields (the data position above all)."""
    _require(isinstance(payload, dict), "checkpoint", "a dict", type(payload).__name__)
    for name, kind in (("identity", dict), ("model", dict), ("optimizer", dict),
                       ("scheduler", dict), ("metrics", dict)):
        _require(isinstance(payload.get(name), kind), name, f"a {kind.__name__}",
                 type(payload.get(name)).__name__)
    for name in ("world_size", "step", "epoch", "position"):
        _require(_is_int(payload.get(name)) and payload[name] >= 0, name,
                 "an integer >= 0", payload.get(name))
    _require(payload["position"] <= steps_per_epoch, "position",
             f"an integer in [0, {steps_per_epoch}] (batches per epoch)", payload["position"])
    _require(payload["epoch"] <= epochs, "epoch", f"an integer in [0, {epochs}]",
             payload["epoch"])
    expected = payload["epoch"] * steps_per_epoch + payload["position"]
    _require(payload["step"] == expected, "step",
             f"epoch x {steps_per_epoch} + position = {expected}", payload["step"])
    metrics = payload["metrics"]
    _require(isinstance(metrics.get("train_time_s"), (int, float))
             and isinstance(metrics.get("curve"), list)
             and all(isinstance(point, dict) for point in metrics["curve"]), "metrics",
             "{'train_time_s': number, 'curve': list of dicts}", sorted(metrics))
    _require(payload.get("scaler") is None or isinstance(payload["scaler"], dict), "scaler",
             "None or a dict", type(payload.get("scaler")).__name__)
    scaler = payload.get("scaler") or {}  # GradScaler's: {} where it was disabled
    if scaler:  # loaded after the model: a key missing there, or a NaN scale, came too late
        def positive(name):
            value = scaler.get(name)
            return isinstance(value, (int, float)) and not isinstance(value, bool) and \
                math.isfinite(value) and value > 0
        _require(all(positive(k) for k in ("scale", "growth_factor", "backoff_factor",
                                           "growth_interval"))
                 and isinstance(scaler.get("_growth_tracker"), int)
                 and scaler["_growth_tracker"] >= 0, "scaler",
                 "GradScaler's state: finite scale, growth_factor, backoff_factor and "
                 "growth_interval > 0, an integer _growth_tracker >= 0",
                 {k: scaler.get(k) for k in sorted(scaler)})


def check_model(saved: dict, module: torch.nn.Module) -> None:
    mine = module.state_dict()
    missing, extra = sorted(set(mine) - set(saved)), sorted(set(saved) - set(mine))
    _require(not missing and not extra, "model", f"this model's {len(mine)} tensors",
             f"missing {missing[:5]}, unexpected {extra[:5]}")
    for name, tensor in mine.items():
        got = saved[name]
        _require(isinstance(got, torch.Tensor) and got.shape == tensor.shape
                 and got.dtype == tensor.dtype, f"model.{name}",
                 f"a {tensor.dtype} tensor of shape {tuple(tensor.shape)}",
                 f"{getattr(got, 'dtype', type(got).__name__)} "
                 f"{tuple(getattr(got, 'shape', ()))}")
        _require_finite(got, f"model.{name}")


def _require_finite(tensor, field: str) -> None:
    """A floating tensor of a checkpoint holds no NaN/Inf (a valid checksum does not say so:
    a resumed run would train to NaN and exit 0)."""
    if isinstance(tensor, torch.Tensor) and tensor.is_floating_point():
        _require(bool(torch.isfinite(tensor).all()), field, "finite values",
                 "a NaN or Inf")


def _finite_number(value, low: float) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value) and value >= low)


def check_optimizer(saved: dict, optimizer: torch.optim.Optimizer) -> None:
    """Same groups holding the same parameters; every per-parameter tensor of the state
    (momentum buffers, Adam moments) shaped like its parameter, step counters scalar."""
    groups, mine = saved.get("param_groups"), optimizer.param_groups
    _require(isinstance(groups, list) and len(groups) == len(mine), "optimizer.param_groups",
             f"{len(mine)} groups", len(groups) if isinstance(groups, list) else groups)
    shapes = {}
    for index, (theirs, group) in enumerate(zip(groups, mine)):
        for setting in ("lr", "momentum", "weight_decay"):  # what the optimizer steps with
            if isinstance(theirs, dict) and setting in theirs:
                _require(_finite_number(theirs[setting], 0.0),
                         f"optimizer.param_groups[{index}].{setting}", "a finite number >= 0",
                         theirs[setting])
        params = theirs.get("params") if isinstance(theirs, dict) else None
        _require(isinstance(params, list) and len(params) == len(group["params"])
                 and all(_is_int(p) for p in params), f"optimizer.param_groups[{index}]",
                 f"{len(group['params'])} parameter indices", params)
        shapes.update({p: q.shape for p, q in zip(params, group["params"])})
    state = saved.get("state")
    _require(isinstance(state, dict), "optimizer.state", "a dict", type(state).__name__)
    for key, values in state.items():
        _require(key in shapes and isinstance(values, dict), f"optimizer.state[{key!r}]",
                 f"the state of one of parameters {sorted(shapes)[:3]}...", type(values))
        for name, value in values.items():
            if isinstance(value, torch.Tensor) and value.dim() > 0:
                _require(value.shape == shapes[key], f"optimizer.state[{key}].{name}",
                         f"shape {tuple(shapes[key])}", tuple(value.shape))
                _require_finite(value, f"optimizer.state[{key}].{name}")
            else:
                _require(isinstance(value, (int, float, torch.Tensor)) or value is None,
                         f"optimizer.state[{key}].{name}", "a number or tensor",
                         type(value).__name__)


def check_scheduler(saved: dict, scheduler) -> None:
    """The schedule's position and its factor's settings (LambdaLR copies them into the
    factor objects on load, so a wrong type would fail at the next step)."""
    mine = scheduler.state_dict()
    _require(_is_int(saved.get("last_epoch")) and saved["last_epoch"] >= 0,
             "scheduler.last_epoch", "an integer >= 0", saved.get("last_epoch"))
    for name in ("base_lrs", "_last_lr"):  # the schedule's rates: a NaN here trained to NaN
        if name in mine:
            rates = saved.get(name)
            _require(isinstance(rates, list) and len(rates) == len(mine[name])
                     and all(_finite_number(r, 0.0) for r in rates), f"scheduler.{name}",
                     f"{len(mine[name])} finite learning rate(s) >= 0", rates)
    lambdas, expected = saved.get("lr_lambdas"), mine.get("lr_lambdas")
    _require(isinstance(lambdas, list) and len(lambdas) == len(expected),
             "scheduler.lr_lambdas", f"a list of {len(expected)}", type(lambdas).__name__)
    for index, (theirs, ours) in enumerate(zip(lambdas, expected)):
        ours = ours or {}
        _require(isinstance(theirs, dict) and set(theirs) == set(ours)
                 and all(type(theirs[k]) is type(v) for k, v in ours.items()),
                 f"scheduler.lr_lambdas[{index}]", f"settings {sorted(ours)}", theirs)


def _check_tensor_dict(value, field: str, most: int) -> None:
    _require(isinstance(value, dict), field, "a dict of bucket index -> tensor",
             type(value).__name__)
    for index, tensor in value.items():
        _require(_is_int(index) and index >= 0, f"{field} key", "a bucket index >= 0", index)
        _require(isinstance(tensor, torch.Tensor) and tensor.is_floating_point()
                 and tensor.numel() <= most, f"{field}[{index}]",
                 f"a floating tensor of at most {most} elements (the model's size)",
                 f"{getattr(tensor, 'dtype', type(tensor).__name__)} "
                 f"{tuple(getattr(tensor, 'shape', ()))}")
        _require_finite(tensor, f"{field}[{index}]")


def _check_layouts(value, field: str) -> None:
    _require(isinstance(value, dict), field, "a dict", type(value).__name__)
    for index, layout in value.items():
        _require(_is_int(index) and (layout is None or (isinstance(layout, (list, tuple))
                                                        and all(_is_int(i) for i in layout))),
                 f"{field}[{index!r}]", "None or a list of parameter indices", layout)


def check_per_step_hook(saved, algorithm: str, shapes: list) -> None:
    """A per-step run's hook memory: residuals and velocities (thinwire's algorithms), error
    and P/Q memories and the generator (PowerSGD), nothing (DDP's own). ``shapes``: the
    model's trained parameters' shapes, in order."""
    numel = sum(math.prod(shape) for shape in shapes)
    if algorithm in collectives.names():
        _check_sync_state(saved, "hook", numel)
    elif algorithm == "powersgd":
        _require(isinstance(saved, dict), "hook", "a PowerSGD state", type(saved).__name__)
        _require(_is_int(saved.get("iter")) and saved["iter"] >= 0, "hook.iter",
                 "an integer >= 0", saved.get("iter"))
        for name in ("error_dict", "p_memory_dict", "q_memory_dict"):
            _check_tensor_dict(saved.get(name), f"hook.{name}", numel)
        _check_layouts(saved.get("layouts"), "hook.layouts")
        rng_from_plain(saved.get("rng"))
    else:
        check_no_hook(saved, algorithm)


def check_diloco_hook(saved, algorithm: str, shapes: list) -> None:
    """DiLoCo's sync: anchor and outer momentum (one tensor per trained parameter, of its
    shape: a one-element anchor loaded by broadcasting), the exchange in flight, the inner
    SyncState."""
    numel = sum(math.prod(shape) for shape in shapes)
    _require(isinstance(saved, dict) and _is_int(saved.get("inner_steps"))
             and saved["inner_steps"] >= 0 and isinstance(saved.get("pending"), dict),
             "hook", "a DiLoCo state (inner_steps >= 0, pending)", type(saved).__name__)
    for name in ("anchor", "momentum"):
        tensors = saved.get(name)
        _require(isinstance(tensors, list) and len(tensors) == len(shapes) and all(
            isinstance(t, torch.Tensor) and t.is_floating_point()
            and tuple(t.shape) == tuple(shape) for t, shape in zip(tensors, shapes)),
            f"hook.{name}", f"{len(shapes)} floating tensors shaped like the parameters",
            [tuple(getattr(t, "shape", ())) for t in tensors][:4]
            if isinstance(tensors, list) else type(tensors).__name__)
        for index, tensor in enumerate(tensors):
            _require_finite(tensor, f"hook.{name}[{index}]")
    _check_sync_state(saved.get("sync"), "hook.sync", numel)


def check_no_hook(saved, algorithm: str) -> None:
    """A run whose synchronisation keeps no state (ddp, ddp-fp16)."""
    _require(saved is None, "hook", f"None (--algorithm {algorithm} keeps no state)",
             type(saved).__name__)


def _check_sync_state(saved, where: str, numel: int) -> None:
    """A thinwire SyncState's state_dict: step count, residuals and velocities."""
    _require(isinstance(saved, dict) and isinstance(saved.get("feedback"), dict), where,
             "a SyncState state_dict", type(saved).__name__)
    _require(_is_int(saved.get("steps")) and saved["steps"] >= 0, f"{where}.steps",
             "an integer >= 0", saved.get("steps"))
    feedback = saved["feedback"]
    _require(isinstance(feedback.get("enabled"), bool), f"{where}.feedback.enabled", "a bool",
             feedback.get("enabled"))
    for name in ("residuals", "velocities"):
        _check_tensor_dict(feedback.get(name, {}), f"{where}.feedback.{name}", numel)
    _check_layouts(feedback.get("layouts", {}), f"{where}.feedback.layouts")


def check_handover(saved, params: list) -> None:
    """A re-planning switch's residuals still owed to coming steps
    (:meth:`thinwire.train.replan.HandOver.state_dict`): None, or per parameter of the model
    None or a finite tensor of its shape and dtype, with 1 <= left <= steps shares and the
    positive loss scale they were kept at."""
    if saved is None:
        return
    _require(isinstance(saved, dict) and set(saved) == {"owed", "steps", "left", "scale"},
             "handover", "None or {'owed', 'steps', 'left', 'scale'}",
             sorted(saved) if isinstance(saved, dict) else type(saved).__name__)
    owed = saved["owed"]
    _require(isinstance(owed, list) and len(owed) == len(params), "handover.owed",
             f"a list of {len(params)} entries (one per parameter)",
             len(owed) if isinstance(owed, list) else type(owed).__name__)
    for i, (tensor, param) in enumerate(zip(owed, params)):
        if tensor is None:
            continue
        _require(isinstance(tensor, torch.Tensor) and tensor.shape == param.shape
                 and tensor.dtype == param.dtype, f"handover.owed[{i}]",
                 f"None or a {param.dtype} tensor of shape {tuple(param.shape)}",
                 getattr(tensor, "shape", type(tensor).__name__))
        _require_finite(tensor, f"handover.owed[{i}]")
    _require(_is_int(saved["steps"]) and saved["steps"] >= 1, "handover.steps",
             "an integer >= 1", saved["steps"])
    _require(_is_int(saved["left"]) and 1 <= saved["left"] <= saved["steps"], "handover.left",
             f"an integer in [1, {saved['steps']}]", saved["left"])
    _require(_finite_number(saved["scale"], 0.0) and saved["scale"] > 0, "handover.scale",
             "a finite number > 0", saved["scale"])
