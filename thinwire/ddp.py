"""thinwire's algorithms as a PyTorch DDP communication hook.

    state = thinwire.ddp.register(ddp_model, algorithm="hitopk", density=0.01)

follows PyTorch's own hook contract (``hook(state, bucket) -> Future``). On the CPU the hook hands
each bucket to one worker thread and returns at once, so communication overlaps the rest of the
backward pass; the worker takes buckets in the order DDP launches them (the same on every rank),
which keeps the collectives of all ranks in step. On CUDA the hook runs inline (NCCL calls are
asynchronous already, and selection needs the current stream).

DDP rebuilds its buckets after the first iteration: the same parameters in another order, for
a model whose gradients arrive in reverse layer order. The sparse algorithms therefore see each
bucket in a canonical order (parameters sorted by their index in the model), so residuals and
shards mean the same coordinates before and after the rebuild, and a run resumed from a
checkpoint (whose fresh DDP starts with unrebuilt buckets) continues bit-identically. A bucket
whose set of parameters changes has its residual re-initialised. ``dense_iterations`` optionally
all-reduces the first steps densely (as PowerSGD's ``start_powerSGD_iter`` does).
"""

import queue
import threading
from typing import Optional

import torch
from torch.nn.parallel import DistributedDataParallel

from thinwire.collectives import allreduce
from thinwire.state import SyncState
from thinwire.topology import Topology


def register(ddp_model: DistributedDataParallel, algorithm: str = "hitopk",
             density: float = 0.01, selector: str = "mstopk", ranks_per_node: Optional[int] = None,
             wire: Optional[str] = None, error_feedback: bool = True,
             dense_below_bytes: Optional[int] = None, dense_iterations: int = 0,
             state: Optional[SyncState] = None, topology: Optional[Topology] = None,
             selector_options: Optional[dict] = None,
             momentum_correction: float = 0.0, weight_decay: float = 0.0) -> SyncState:
    """Register a thinwire algorithm on ``ddp_model``; returns its state (checkpoint it).

    Pass ``state`` (a SyncState restored from a checkpoint) to continue with its residuals.
    ``momentum_correction=m`` (sparse algorithms): DGC's momentum correction in the hook; the
    optimizer must then run *without* momentum (see thinwire.feedback). ``weight_decay=wd`` adds
    ``wd * p`` to every gradient in the hook, before any momentum, as momentum SGD's weight decay
    does; the optimizer's own weight decay must then be 0. Collective: every rank calls it.
    """
    if not isinstance(ddp_model, DistributedDataParallel):
        raise TypeError(f"ddp_model must be a torch.nn.parallel.DistributedDataParallel, got "
                        f"{type(ddp_model).__name__}")
    if getattr(ddp_model, "_thinwire_state", None) is not None:
        raise RuntimeError("a thinwire hook is already registered on this model; DDP allows one "
                           "communication hook per model")
    if not (isinstance(weight_decay, (int, float)) and weight_decay >= 0):
        raise ValueError(f"weight_decay must be a number >= 0, got {weight_decay!r}")
    if not isinstance(dense_iterations, int) or dense_iterations < 0:
        raise ValueError(f"dense_iterations must be an int >= 0, got {dense_iterations!r}")
    topology = topology or Topology.build(ranks_per_node)
    if state is None:
        options = {} if dense_below_bytes is None else {"dense_below_bytes": dense_below_bytes}
        state = SyncState(topology, algorithm, density, selector, selector_options, wire,
                          error_feedback, momentum_correction=momentum_correction, **options)
    else:
        state.attach(topology)
    state.dense_iterations = dense_iterations
    state.weight_decay = float(weight_decay)
    state.param_index = {id(p): i for i, p in enumerate(ddp_model.module.parameters())}
    ddp_model.register_comm_hook(state, _hook)
    ddp_model._thinwire_state = state
    return state


class _Layout:
    """Where each parameter of a bucket sits, in DDP's order and in canonical (model) order."""

    def __init__(self, state: SyncState, bucket):
        params = bucket.parameters()
        self.model_index = [state.param_index.get(id(p), -1) for p in params]
        self.sizes = [p.numel() for p in params]
        starts = [0]
        for size in self.sizes[:-1]:
            starts.append(starts[-1] + size)
        self.starts = starts
        self.order = sorted(range(len(params)), key=lambda i: self.model_index[i])
        self.signature = tuple(sorted(self.model_index))
        self.needed = (self.order != list(range(len(params)))
                       and sum(self.sizes) == bucket.buffer().numel())

    def to_canonical(self, buffer: torch.Tensor) -> torch.Tensor:
        if not self.needed:
            return buffer
        return torch.cat([buffer[self.starts[i]:self.starts[i] + self.sizes[i]]
                          for i in self.order])

    def from_canonical(self, canonical: torch.Tensor) -> torch.Tensor:
        if not self.needed:
            return canonical
        out = torch.empty_like(canonical)
        offset = 0
        for i in self.order:
            out[self.starts[i]:self.starts[i] + self.sizes[i]] = \
                canonical[offset:offset + self.sizes[i]]
            offset += self.sizes[i]
        return out


def _reduce_bucket(state: SyncState, index: int, buffer: torch.Tensor, layout: _Layout,
                   is_last: bool) -> torch.Tensor:
    if state.steps < getattr(state, "dense_iterations", 0):
        state.feedback.layout = layout.signature  # velocities live in canonical order
        average = layout.to_canonical(allreduce.reduce(state, index, buffer))
        result = layout.from_canonical(state.feedback.dense_momentum(index, average))
    elif state.feedback.enabled:
        state.feedback.layout = layout.signature
        result = layout.from_canonical(state.reduce(index, layout.to_canonical(buffer)))
    else:
        result = state.reduce(index, buffer)
    if is_last:
        state.end_step()
    return result


# No postponed annotations in this file: DDP checks the hook's return annotation as an object.
def _hook(state: SyncState, bucket) -> torch.futures.Future[torch.Tensor]:
    buffer, index, is_last = bucket.buffer(), bucket.index(), bucket.is_last()
    layout = _Layout(state, bucket)
    if getattr(state, "weight_decay", 0.0):
        _add_weight_decay(buffer, bucket.parameters(), state.weight_decay)
    future: torch.futures.Future = torch.futures.Future()
    if buffer.is_cuda:
        future.set_result(_reduce_bucket(state, index, buffer, layout, is_last))
        return future
    _worker(state).put((index, buffer, layout, is_last, future))
    return future


def _add_weight_decay(buffer: torch.Tensor, params, weight_decay: float) -> None:
    """buffer += wd * params (the bucket's flat gradient, parameters in the bucket's order)."""
    flat = torch.cat([p.detach().reshape(-1) for p in params])
    if flat.numel() != buffer.numel():
        raise RuntimeError(f"bucket of {buffer.numel()} gradient elements holds parameters of "
                           f"{flat.numel()}: cannot add weight decay in the hook")
    buffer.add_(flat.to(buffer.dtype), alpha=weight_decay)


def _worker(state: SyncState) -> queue.Queue:
    jobs = getattr(state, "_jobs", None)
    if jobs is None:
        jobs = queue.Queue()
        thread = threading.Thread(target=_work, args=(state, jobs), daemon=True,
                                  name="thinwire-sync")
        thread.start()
        state._jobs = jobs
    return jobs


def _work(state: SyncState, jobs: queue.Queue) -> None:
    while True:
        index, buffer, layout, is_last, future = jobs.get()
        try:
            future.set_result(_reduce_bucket(state, index, buffer, layout, is_last))
        except BaseException as exc:  # hand every failure to the training thread
            future.set_exception(exc)
