"""SyncState: one rank's configuration and memory for gradient synchronisation.

It takes every setting of the synchronisation in its constructor and checks it there (the one
place a setting enters), holds what the algorithms need (topology, compressor, error feedback,
wire dtype) and what they report (bytes intra- and inter-node, seconds in selection and in
communication, per step). The DDP hook (:mod:`thinwire.ddp`) and :func:`thinwire.synchronize`
both go through :meth:`add_weight_decay` and :meth:`reduce`, so they give the same result for
the same settings. It pickles for checkpoints without its process groups, as PyTorch's own hook
states do: ``__getstate__`` drops the topology, :meth:`attach` gives it back.
"""

from __future__ import annotations

import math
import time
from contextlib import contextmanager

import torch

from thinwire import collectives
from thinwire.collectives.primitives import all_reduce_sum, dense_allreduce
from thinwire.collectives.registry import DEFAULT_DENSE_BELOW_BYTES
from thinwire.collectives.traffic import Traffic
from thinwire.compress import TopK, sparse_wire_dtype, wire_dtype
from thinwire.feedback import ErrorFeedback
from thinwire.peer_failure import where_note

# What a checkpoint must agree on to continue this state's residuals (see load_state_dict).
IDENTITY = ("algorithm", "density", "selector", "momentum_correction", "error_feedback")
NONFINITE_POLICIES = ("raise", "skip")
PHASES = {"select": "top-k selection", "intra": "intra-node", "inter": "inter-node"}


def _check_int(name: str, value, low: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
    return value


def _check_warmup_from(value, density: float, steps: int) -> float:
    """A density in (0, 1]; with a warm-up (steps > 0) at least the final density."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or \
            not 0 < value <= 1 or (steps and value < density):
        raise ValueError(f"density_warmup_from must be a number in [density, 1] (density="
                         f"{density!r}), got {value!r}")
    return float(value)


def _check_finite(name: str, value, low: float = 0.0) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or \
            not math.isfinite(value) or value < low:
        raise ValueError(f"{name} must be a finite number >= {low}, got {value!r}")
    return float(value)


class SyncState:
    """Settings (each checked here):

    * ``algorithm``: a name from :func:`thinwire.collectives.names`;
    * ``density``, ``selector``, ``selector_options``: the top-k of the sparse algorithms;
    * ``wire``: ``None``/"none", "fp16" or "bf16" for the dense parts on the wire;
    * ``sparse_wire``: "fp32" (default), "fp16" or "bf16" for the selected values of the
      sparse algorithms that take it (``Algorithm.sparse_wire``); the rounding error stays in
      the error-feedback residual. Their indices are always coded narrow (exact; compress.py);
    * ``error_feedback``: keep what top-k did not send (sparse algorithms);
    * ``dense_below_bytes``: buckets smaller than this are all-reduced densely, whichever
      sparse algorithm (here, once: no algorithm file repeats it);
    * ``momentum_correction``: DGC's momentum in the hook (sparse, with error feedback); the
      optimizer then runs without momentum;
    * ``dense_iterations``: the first N steps are all-reduced densely (a warm-up);
    * ``density_warmup_steps``, ``density_warmup_from``: DGC's density warm-up (sparse
      algorithms): for N steps after the dense ones the density falls exponentially from
      ``density_warmup_from`` to ``density`` (step t of the warm-up selects at
      ``from * (density / from) ** (t / N)``), instead of jumping to the final density;
    * ``weight_decay``: ``wd * p`` added to every gradient before any momentum (the optimizer's
      own weight decay must then be 0);
    * ``nonfinite``: what a NaN/Inf in any rank's gradient does, decided by all ranks
      together. "raise" (default) ends the step with FloatingPointError on every rank, naming
      the ranks and buckets: each bucket's check stays on the device (no host read on CUDA)
      and a bad bucket is zeroed there so every rank's collectives go on in step; the ranks'
      flags travel once per step, in one small all-reduce at :meth:`end_step`. "skip"
      decides per bucket before anything of it is sent (a one-hot flag all-reduced per
      bucket), returns a zero bucket on every rank, keeps the residuals exactly as they were,
      and sets ``last_step["nonfinite"]`` on every rank: skip ``optimizer.step()`` then, as
      GradScaler does (its other buckets were sent as usual; their step is dropped with it).
    * ``algorithm_options``: the algorithm's own settings (e.g. oktopk's ``tau``), checked by it.
    """

    def __init__(self, topology, algorithm: str = "hitopk", density: float = 0.01,
                 selector: str = "auto", selector_options: dict | None = None,
                 wire: str | None = None, error_feedback: bool = True,
                 dense_below_bytes: int = DEFAULT_DENSE_BELOW_BYTES,
                 momentum_correction: float = 0.0, dense_iterations: int = 0,
                 weight_decay: float = 0.0, nonfinite: str = "raise",
                 algorithm_options: dict | None = None, density_warmup_steps: int = 0,
                 density_warmup_from: float = 0.25, sparse_wire: str = "fp32"):
        spec = collectives.get(algorithm)
        if not isinstance(error_feedback, bool):
            raise ValueError(f"error_feedback must be True or False, got {error_feedback!r}")
        self.algorithm = algorithm
        self.algorithm_options = spec.check_options(algorithm_options)
        self.algorithm_state: dict = {}  # per bucket, the algorithm's own (e.g. thresholds)
        self.compressor = TopK(density, selector, dict(selector_options or {}))
        self.wire = None if wire in (None, "none") else wire
        self.wire_dtype = wire_dtype(wire)
        self.sparse_wire_dtype = sparse_wire_dtype(sparse_wire)
        if sparse_wire != "fp32" and not spec.sparse_wire:
            raise ValueError(f"sparse_wire={sparse_wire!r} applies to the algorithms that send "
                             f"their own selection ({', '.join(collectives.sparse_wire_names())}"
                             f"); {algorithm!r} sends values in the gradient's dtype, so "
                             "sparse_wire must be 'fp32' there")
        self.sparse_wire = sparse_wire
        self.dense_below_bytes = _check_int("dense_below_bytes", dense_below_bytes)
        self.dense_iterations = _check_int("dense_iterations", dense_iterations)
        self.density_warmup_steps = _check_int("density_warmup_steps", density_warmup_steps)
        if self.density_warmup_steps and not spec.sparse:
            raise ValueError(f"density_warmup_steps applies to the sparse algorithms "
                             f"({', '.join(collectives.sparse_names())}), got algorithm="
                             f"{algorithm!r}, density_warmup_steps={density_warmup_steps!r}")
        self.density_warmup_from = _check_warmup_from(
            density_warmup_from, self.compressor.density, self.density_warmup_steps)
        self.weight_decay = _check_finite("weight_decay", weight_decay)
        if momentum_correction and not (spec.sparse and error_feedback):
            raise ValueError(f"momentum_correction needs a sparse algorithm with error feedback "
                             f"({', '.join(collectives.sparse_names())}), got algorithm="
                             f"{algorithm!r}, error_feedback={error_feedback!r}")
        if self.dense_iterations and not spec.sparse:
            raise ValueError(f"dense_iterations applies to the sparse algorithms "
                             f"({', '.join(collectives.sparse_names())}); {algorithm!r} is dense "
                             f"every step already, got dense_iterations={dense_iterations!r}")
        if nonfinite not in NONFINITE_POLICIES:
            raise ValueError(f"nonfinite must be one of {', '.join(NONFINITE_POLICIES)}, got "
                             f"{nonfinite!r}")
        self.nonfinite = nonfinite
        self.error_feedback = error_feedback
        self.feedback = ErrorFeedback(error_feedback and spec.sparse, momentum_correction)
        self.topology = topology
        self.auto = None  # algorithm="auto": what thinwire.ddp.register chose, and why
        self.steps = 0
        self._bucket = None  # the bucket being reduced, for error messages
        self._first_bad = None  # "raise": this step's first non-finite bucket + 1 (a tensor)
        self._step_device = None  # where this step's buckets live (None: none reduced yet)
        self._device = None  # where the last bucket lived (how phases are timed)
        self._phase_events: list = []  # CUDA: (phase, start event, end event) of this step
        self.last_step: dict = {}
        self.totals = _empty_step()
        self._current = _empty_step()

    @property
    def settings(self) -> dict:
        """Every setting, as plain values (part of :meth:`state_dict`)."""
        return {"algorithm": self.algorithm, "density": self.compressor.density,
                "selector": self.compressor.selector,
                "selector_options": dict(self.compressor.options), "wire": self.wire,
                "sparse_wire": self.sparse_wire,
                "error_feedback": self.error_feedback,
                "dense_below_bytes": self.dense_below_bytes,
                "momentum_correction": self.feedback.momentum,
                "dense_iterations": self.dense_iterations,
                "density_warmup_steps": self.density_warmup_steps,
                "density_warmup_from": self.density_warmup_from,
                "weight_decay": self.weight_decay,
                "nonfinite": self.nonfinite,
                "algorithm_options": dict(self.algorithm_options)}

    # ------------------------------------------------------------------ the algorithm

    def add_weight_decay(self, flat: torch.Tensor, params) -> None:
        """``flat += weight_decay * params`` (``params`` in the order of ``flat``), in place."""
        if not self.weight_decay:
            return
        values = torch.cat([p.detach().reshape(-1) for p in params])
        if values.numel() != flat.numel():
            raise RuntimeError(f"bucket of {flat.numel()} gradient elements holds parameters of "
                               f"{values.numel()}: cannot add weight decay")
        flat.add_(values.to(flat.dtype), alpha=self.weight_decay)

    def reduce(self, bucket_index: int, flat: torch.Tensor, layout: tuple | None = None
               ) -> torch.Tensor:
        """The average of ``flat`` (one bucket, its parameters in model order) over all ranks,
        by the configured algorithm, or densely during the first ``dense_iterations`` steps.
        ``layout`` names the bucket's parameters: a residual kept for another layout starts
        again at zero."""
        if self.topology is None:
            raise RuntimeError("this SyncState has no topology: call state.attach(Topology"
                               ".build(...)) after loading it from a checkpoint")
        if not flat.is_floating_point():
            raise TypeError(f"gradients must have a floating dtype, got {flat.dtype}")
        self.feedback.layout = layout
        self._bucket = bucket_index
        self._step_device = self._device = flat.device
        if self.nonfinite == "skip":
            if self._any_rank_nonfinite(flat):
                return torch.zeros_like(flat)
        else:
            flat = self._note_nonfinite(bucket_index, flat)
        if self.steps < self.dense_iterations:
            return self.feedback.dense_momentum(bucket_index, dense_allreduce(self, flat))
        algorithm = collectives.get(self.algorithm)
        if algorithm.sparse and flat.numel() * flat.element_size() < self.dense_below_bytes:
            # a small bucket is latency-bound: every sparse algorithm all-reduces it densely
            return self.feedback.dense_momentum(bucket_index, dense_allreduce(self, flat))
        density = self.density_at(self.steps)
        if density == self.compressor.density:
            return algorithm.reduce(self, bucket_index, flat)
        # A warm-up step: the algorithms read state.compressor, so it is this step's for the
        # length of the call (buckets are reduced one at a time, by one thread).
        configured = self.compressor
        self.compressor = TopK(density, configured.selector, dict(configured.options))
        try:
            return algorithm.reduce(self, bucket_index, flat)
        finally:
            self.compressor = configured

    def density_at(self, step: int) -> float:
        """The top-k density of ``step`` (the density warm-up's, or the configured one)."""
        t = step - self.dense_iterations
        final = self.compressor.density
        if not 0 <= t < self.density_warmup_steps or self.density_warmup_from <= final:
            return final
        start = self.density_warmup_from
        return start * (final / start) ** (t / self.density_warmup_steps)

    def _note_nonfinite(self, bucket_index: int, flat: torch.Tensor) -> torch.Tensor:
        """Policy "raise": remember whether this bucket holds a NaN/Inf (``end_step`` decides
        for all ranks at once) and return it finite, so that the selection and the collectives
        of every rank go on in step until then. On the CPU the check is read at once (a bucket
        that is finite is returned untouched); on CUDA it stays on the device and the bucket
        is cleaned in place (its values are thrown away with the step if it was bad)."""
        if flat.device.type == "cpu":
            if _all_finite(flat):
                return flat
            bad = torch.tensor(True)
            flat = torch.nan_to_num(flat, nan=0.0, posinf=0.0, neginf=0.0)
        else:
            bad = ~torch.isfinite(flat).all()
            flat.nan_to_num_(nan=0.0, posinf=0.0, neginf=0.0)
        here = torch.where(bad, bucket_index + 1, 0).to(torch.int64)
        self._first_bad = here if self._first_bad is None else torch.where(
            self._first_bad > 0, self._first_bad, here)
        return flat

    def _decide_nonfinite(self) -> None:
        """Policy "raise", once per step: every rank learns which ranks had a non-finite
        bucket (one all-reduce of one integer per rank) and all of them raise together."""
        topo, device = self.topology, self._step_device
        first_bad, self._first_bad, self._step_device = self._first_bad, None, None
        if device is None:  # nothing was reduced this step
            return
        flags = torch.zeros(topo.world_size, dtype=torch.int64, device=device)
        if first_bad is not None:
            flags[topo.rank] = first_bad.to(device)
        if topo.world_size > 1:
            with self.timer("inter" if topo.nodes > 1 else "intra"):
                all_reduce_sum(flags, topo.world)
        bad = {rank: flag - 1 for rank, flag in enumerate(flags.tolist()) if flag}
        if not bad:
            return
        self._phase_events = []
        self._current = _empty_step()
        self.last_step = {**self._current, "nonfinite": 1.0}
        where = ", ".join(f"rank {rank} bucket {bucket}" for rank, bucket in bad.items())
        error = FloatingPointError(
            f"non-finite gradient (NaN or Inf) at step {self.steps} on rank(s) {sorted(bad)} "
            f"(first in {where}); every rank stops here. To skip such steps instead, as "
            "GradScaler does, use nonfinite='skip' and skip optimizer.step() when "
            "state.last_step['nonfinite'] is set")
        error.where = where  # for a caller that counts steps its own way (DiLoCo)
        raise error

    def abandon_step(self) -> None:
        """Forget what a step that failed part-way noted (the next step starts clean)."""
        self._first_bad, self._step_device, self._phase_events = None, None, []

    def _any_rank_nonfinite(self, flat: torch.Tensor) -> bool:
        """Policy "skip": all ranks learn together, before anything of the bucket is sent,
        whether any rank's bucket holds a NaN or Inf (a sparse selection would fail on one rank
        only and leave the others waiting)."""
        topo = self.topology
        flags = torch.zeros(topo.world_size, dtype=torch.float32, device=flat.device)
        flags[topo.rank] = 0.0 if _all_finite(flat) else 1.0
        if topo.world_size > 1:
            with self.timer("inter" if topo.nodes > 1 else "intra"):
                all_reduce_sum(flags, topo.world)
        if not any(flags.tolist()):
            return False
        self._current["nonfinite"] = 1.0
        return True

    def end_step(self) -> None:
        """The step's last bucket is done: its counters become ``last_step`` (and, policy
        "raise", all ranks decide together whether one of them saw a NaN/Inf)."""
        if self.nonfinite == "raise":
            self._decide_nonfinite()
        self._read_phase_events()
        self._current["comm_s"] = self._current["intra_s"] + self._current["inter_s"]
        self.last_step = dict(self._current)
        for key, value in self._current.items():
            self.totals[key] = self.totals.get(key, 0.0) + value
        self.steps += 1
        self._current = _empty_step()

    # ------------------------------------------------------------------ accounting

    def record(self, traffic: Traffic) -> None:
        self._current["bytes_intra"] += traffic.intra
        self._current["bytes_inter"] += traffic.inter

    def count(self, name: str, value: float) -> None:
        """Adds ``value`` to an algorithm's own counter ``name`` of this step (in last_step)."""
        self._current[name] = self._current.get(name, 0.0) + value

    @contextmanager
    def timer(self, what: str, members: int | None = None):
        """Adds the time of the block to ``what`` ("select", "intra" or "inter").

        On the CPU that is wall time. On CUDA it is the time the bucket's stream spends between
        two events recorded around the block, read at :meth:`end_step`: no device-wide
        synchronisation holds the host, so the bucket's work overlaps the rest of backward
        (``thinwire.ddp`` runs it on a side stream).

        ``members``: how many ranks the timed collective spans. With one, no byte crosses the
        link the label names (the collective is a local copy), so its time is not filed there:
        a phase's time and its bytes always sit under the same label."""
        on_cuda = self._device is not None and self._device.type == "cuda"
        if on_cuda:
            start = torch.cuda.Event(enable_timing=True)
            start.record()
        else:
            begin = time.perf_counter()
        try:
            yield
        except Exception as exc:  # name where it failed (a timeout names the stuck phase)
            exc.add_note(where_note(self.algorithm, PHASES.get(what, what), self._bucket,
                                    self.steps))
            raise
        finally:
            if members != 1:
                if on_cuda:
                    end = torch.cuda.Event(enable_timing=True)
                    end.record()
                    self._phase_events.append((what, start, end))
                else:
                    self._current[f"{what}_s"] += time.perf_counter() - begin

    def _read_phase_events(self) -> None:
        """CUDA phase times of this step, from their events (waits for the last one)."""
        for what, start, end in self._phase_events:
            end.synchronize()
            self._current[f"{what}_s"] += start.elapsed_time(end) / 1e3
        self._phase_events = []

    # ------------------------------------------------------------------ checkpoints

    def attach(self, topology) -> None:
        self.topology = topology

    def __getstate__(self):
        state = self.__dict__.copy()
        state["topology"] = None  # process groups do not pickle
        for name in ("_first_bad", "_step_device", "_device"):  # a step's, not the state's
            state[name] = None
        state["_phase_events"] = []
        state["feedback"] = self.feedback.state_dict()
        state["wire_dtype"] = None
        state["sparse_wire_dtype"] = None
        return state

    def __setstate__(self, state):
        # settings added later keep their old behaviour in pickles written before them
        for name, default in (("nonfinite", "raise"), ("dense_iterations", 0),
                              ("density_warmup_steps", 0), ("density_warmup_from", 0.25),
                              ("weight_decay", 0.0), ("_bucket", None),
                              ("algorithm_options", {}), ("algorithm_state", {}),
                              ("sparse_wire", "fp32"), ("_first_bad", None),
                              ("_step_device", None), ("_device", None), ("auto", None)):
            state.setdefault(name, default)
        state.setdefault("_phase_events", [])  # a list of its own
        state.setdefault("error_feedback", bool(state["feedback"].get("enabled", True)))
        feedback = ErrorFeedback()
        feedback.load_state_dict(state["feedback"])
        state["feedback"] = feedback
        self.__dict__.update(state)
        self.wire_dtype = wire_dtype(self.wire)
        self.sparse_wire_dtype = sparse_wire_dtype(self.sparse_wire)

    # ------------------------------------------------------------------ fault tolerance

    def snapshot(self) -> dict:
        """The state at a step's start, for :meth:`rollback`: a step the quorum of a
        fault-tolerant run does not commit (a peer failed in the middle of it) must leave the
        residuals, velocities and the algorithms' per-bucket state as they were, or the mass
        that step selected would be sent neither then nor later. (dlcp names its transport's
        rounds by step and bucket: a retried step would reuse a finished round's name, so dlcp
        is not for rollback.)"""
        return {"steps": self.steps, "feedback": self.feedback.snapshot(),
                "algorithm_state": {i: dict(s) for i, s in self.algorithm_state.items()}}

    def rollback(self, snapshot: dict) -> None:
        """Back to ``snapshot`` (the step in progress is abandoned: its counters too)."""
        self.steps = snapshot["steps"]
        self.feedback.restore(snapshot["feedback"])
        self.algorithm_state = {i: dict(s) for i, s in snapshot["algorithm_state"].items()}
        self._current = _empty_step()
        self.abandon_step()

    def healing_state_dict(self) -> dict:
        """What a joining rank takes from a live peer: everything but the residuals and
        velocities, which are the donor's own unsent mass (a joining rank starts with none:
        copying them would send the donor's mass twice)."""
        state = self.state_dict()
        state["feedback"] = dict(state["feedback"], residuals={}, velocities={}, layouts={})
        return state

    def residual_mass(self) -> dict:
        """This rank's unsent mass (``ErrorFeedback.mass``): what leaves with it."""
        return self.feedback.mass()

    def state_dict(self) -> dict:
        """Plain tensors and numbers (loads with ``torch.load(weights_only=True)``)."""
        return {**self.settings, "steps": self.steps, "feedback": self.feedback.state_dict(),
                "algorithm_state": {i: dict(s) for i, s in self.algorithm_state.items()}}

    def load_state_dict(self, state: dict) -> None:
        """Residuals and step count of a checkpoint whose identity settings equal this state's
        (the others, e.g. ``wire``, may change between runs)."""
        if not isinstance(state, dict):
            raise ValueError(f"SyncState checkpoint must be a dict, got {type(state).__name__}")
        saved = {"momentum_correction": state.get("feedback", {}).get("momentum", 0.0),
                 "error_feedback": state.get("feedback", {}).get("enabled", True)
                 or not collectives.get(self.algorithm).sparse, **state}
        mine = self.settings
        if not collectives.get(self.algorithm).sparse:
            saved["error_feedback"] = mine["error_feedback"]  # meaningless for dense ones
        differ = {k: (saved.get(k), mine[k]) for k in IDENTITY if saved.get(k) != mine[k]}
        if differ:
            raise ValueError("checkpoint differs from this SyncState in " + ", ".join(
                f"{k} (checkpoint {a!r}, now {b!r})" for k, (a, b) in sorted(differ.items())))
        steps = state.get("steps")
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
            raise ValueError(f"SyncState checkpoint: steps must be an int >= 0, got {steps!r}")
        self.steps = steps
        for name in ("dense_iterations", "density_warmup_steps"):
            # a hook switched in mid-run (auto) skipped the start's warm-ups, and its step count
            # starts at the switch: built again from the run's settings, a resume would run
            # them again. The checkpoint's schedule stands where it is shorter, never longer.
            value = state.get(name)
            if isinstance(value, int) and not isinstance(value, bool) and \
                    0 <= value < getattr(self, name):
                setattr(self, name, value)
        self.feedback.load_state_dict(state["feedback"])
        self.algorithm_state = {int(i): dict(s)
                                for i, s in state.get("algorithm_state", {}).items()}


def _all_finite(flat: torch.Tensor) -> bool:
    """Whether every entry is finite. A sum reads the bucket once and is finite whenever every
    entry is (NaN and Inf propagate); only a non-finite sum (a NaN/Inf, or an overflow of
    finite entries) needs the exact check, which writes a mask of the whole bucket (5x slower
    on the CPU: ~7 ms for a 1.6M-entry bucket here, every step, on every rank)."""
    return bool(torch.isfinite(flat.sum())) or bool(torch.isfinite(flat).all())


def _empty_step() -> dict:
    # intra_s: collectives inside a node; inter_s: collectives that span nodes (the inter-node
    # groups and the world group); comm_s = intra_s + inter_s.
    return {"bytes_intra": 0.0, "bytes_inter": 0.0, "select_s": 0.0, "intra_s": 0.0,
            "inter_s": 0.0, "comm_s": 0.0, "nonfinite": 0.0}
