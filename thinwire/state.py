"""SyncState: one rank's configuration and memory for gradient synchronisation.

It holds what the algorithms need (topology, compressor, error feedback, wire dtype) and what
they report (bytes intra- and inter-node, seconds in selection and in communication, per step).
It pickles for checkpoints without its process groups, as PyTorch's own hook states do:
``__getstate__`` drops the topology, :meth:`attach` gives it back.
"""

from __future__ import annotations

import time
from contextlib import contextmanager

import torch

from thinwire.collectives import ALGORITHMS, SPARSE_ALGORITHMS
from thinwire.collectives.traffic import Traffic
from thinwire.compress import TopK, wire_dtype
from thinwire.feedback import ErrorFeedback

DEFAULT_DENSE_BELOW_BYTES = 64 * 1024  # below this a bucket is latency-bound: all-reduce it


class SyncState:
    def __init__(self, topology, algorithm: str = "hitopk", density: float = 0.01,
                 selector: str = "mstopk", selector_options: dict | None = None,
                 wire: str | None = None, error_feedback: bool = True,
                 dense_below_bytes: int = DEFAULT_DENSE_BELOW_BYTES,
                 momentum_correction: float = 0.0):
        if algorithm not in ALGORITHMS:
            raise ValueError(
                f"algorithm must be one of {', '.join(ALGORITHMS)}, got {algorithm!r}")
        if not isinstance(dense_below_bytes, int) or dense_below_bytes < 0:
            raise ValueError(f"dense_below_bytes must be an int >= 0, got {dense_below_bytes!r}")
        self.algorithm = algorithm
        self.compressor = TopK(density, selector, dict(selector_options or {}))
        self.wire = wire
        self.wire_dtype = wire_dtype(wire)
        self.dense_below_bytes = dense_below_bytes
        if momentum_correction and (algorithm not in SPARSE_ALGORITHMS or not error_feedback):
            raise ValueError(f"momentum_correction needs a sparse algorithm with error feedback "
                             f"({', '.join(SPARSE_ALGORITHMS)}), got algorithm={algorithm!r}, "
                             f"error_feedback={error_feedback!r}")
        self.feedback = ErrorFeedback(error_feedback and algorithm in SPARSE_ALGORITHMS,
                                      momentum_correction)
        self.topology = topology
        self.steps = 0
        self.last_step: dict = {}
        self.totals = _empty_step()
        self._current = _empty_step()

    # ------------------------------------------------------------------ the algorithm

    def reduce(self, bucket_index: int, flat: torch.Tensor) -> torch.Tensor:
        """The average of ``flat`` (one bucket) over all ranks, by the configured algorithm."""
        if self.topology is None:
            raise RuntimeError("this SyncState has no topology: call state.attach(Topology"
                               ".build(...)) after loading it from a checkpoint")
        if not flat.is_floating_point():
            raise TypeError(f"gradients must have a floating dtype, got {flat.dtype}")
        return ALGORITHMS[self.algorithm](self, bucket_index, flat)

    def end_step(self) -> None:
        self._current["comm_s"] = self._current["intra_s"] + self._current["inter_s"]
        self.last_step = dict(self._current)
        for key, value in self._current.items():
            self.totals[key] += value
        self.steps += 1
        self._current = _empty_step()

    # ------------------------------------------------------------------ accounting

    def record(self, traffic: Traffic) -> None:
        self._current["bytes_intra"] += traffic.intra
        self._current["bytes_inter"] += traffic.inter

    @contextmanager
    def timer(self, what: str):
        """Adds the wall time of the block to ``what`` ("select", "intra" or "inter")."""
        device_sync = torch.cuda.synchronize if torch.cuda.is_initialized() else None
        if device_sync:
            device_sync()
        start = time.perf_counter()
        try:
            yield
        finally:
            if device_sync:
                device_sync()
            self._current[f"{what}_s"] += time.perf_counter() - start

    # ------------------------------------------------------------------ checkpoints

    def attach(self, topology) -> None:
        self.topology = topology

    def __getstate__(self):
        state = self.__dict__.copy()
        state["topology"] = None  # process groups do not pickle
        state.pop("_jobs", None)  # nor does the DDP hook's worker queue
        state.pop("param_index", None)  # object ids, rebuilt when registered again
        state["feedback"] = self.feedback.state_dict()
        state["wire_dtype"] = None
        return state

    def __setstate__(self, state):
        feedback = ErrorFeedback()
        feedback.load_state_dict(state["feedback"])
        state["feedback"] = feedback
        self.__dict__.update(state)
        self.wire_dtype = wire_dtype(self.wire)

    def state_dict(self) -> dict:
        """Plain tensors and numbers (loads with ``torch.load(weights_only=True)``)."""
        return {"algorithm": self.algorithm, "density": self.compressor.density,
                "selector": self.compressor.selector, "steps": self.steps,
                "feedback": self.feedback.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        mine = (self.algorithm, self.compressor.density, self.compressor.selector)
        theirs = (state["algorithm"], state["density"], state["selector"])
        if mine != theirs:
            raise ValueError(f"checkpoint is for (algorithm, density, selector) = {theirs}, "
                             f"this state is {mine}")
        theirs_m = state["feedback"].get("momentum", 0.0)
        if self.feedback.momentum != theirs_m:
            raise ValueError(f"checkpoint has momentum_correction={theirs_m}, this state has "
                             f"{self.feedback.momentum}")
        self.steps = int(state["steps"])
        self.feedback.load_state_dict(state["feedback"])


def _empty_step() -> dict:
    # intra_s: collectives inside a node; inter_s: collectives that span nodes (the inter-node
    # groups and the world group); comm_s = intra_s + inter_s.
    return {"bytes_intra": 0.0, "bytes_inter": 0.0, "select_s": 0.0, "intra_s": 0.0,
            "inter_s": 0.0, "comm_s": 0.0}
