"""thinwire's algorithms as a PyTorch DDP communication hook.

    state = thinwire.ddp.register(ddp_model, algorithm="hitopk", density=0.01)

follows PyTorch's own hook contract (``hook(state, bucket) -> Future``). What is DDP's lives
here: the bucket order and the worker that runs buckets; every synchronisation setting belongs
to the :class:`~thinwire.state.SyncState` (the same one :func:`thinwire.synchronize` uses).

The hook hands each bucket to one worker thread and returns a future at once, so
communication overlaps the rest of the backward pass; the worker takes buckets in the order DDP
launches them (the same on every rank), which keeps the collectives of all ranks in step. On
CUDA the worker runs the bucket on a side stream of the device that first waits for an event
recorded where backward produced the gradient; the future is CUDA-aware
(``Future(devices=...)``), so whoever waits on it (DDP, when backward ends) has its stream wait
for the bucket's work, not the host. The autograd thread never blocks on a bucket: host reads
of the selection (thresholds, counts) wait on the worker thread, and phase times come from CUDA
events (:meth:`SyncState.timer`), never a device-wide synchronisation.

DDP rebuilds its buckets after the first iteration: the same parameters in another order, for
a model whose gradients arrive in reverse layer order. The sparse algorithms therefore see each
bucket in a canonical order (parameters sorted by their index in the model), so residuals and
shards mean the same coordinates before and after the rebuild, and a run resumed from a
checkpoint (whose fresh DDP starts with unrebuilt buckets) continues bit-identically. A bucket
whose set of parameters changes has its residual re-initialised.
"""

import atexit
import contextlib
import datetime
import gc
import queue
import threading
import weakref
from typing import Optional, Union

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from thinwire import collectives
from thinwire.state import SyncState
from thinwire.topology import Topology


def register(ddp_model: DistributedDataParallel, algorithm: Optional[str] = None, *,
             state: Optional[SyncState] = None, topology: Optional[Topology] = None,
             ranks_per_node: Optional[int] = None,
             timeout: Union[datetime.timedelta, float, None] = None,
             plan: Union[str, dict, None] = None, **settings) -> SyncState:
    """Register a thinwire algorithm on ``ddp_model``; returns its state (checkpoint it).

    ``algorithm`` (default "hitopk") and ``settings`` are :class:`SyncState`'s (density,
    selector, wire, momentum_correction, dense_iterations, weight_decay, nonfinite, ...). Or
    pass ``state`` (a SyncState restored from a checkpoint) to continue with its residuals; it
    holds its own settings, so none may be passed with it. ``timeout`` bounds every thinwire
    collective (default: the one given to ``init_process_group``); a peer that stops answering
    ends the step with an error naming the phase. Collective: every rank calls it.

    ``algorithm="auto"`` with ``plan`` (``thinwire plan --json``'s file, or its dict): the node
    leaders probe the link and the fastest candidate of the plan at the probed rate that a
    thinwire hook runs is registered (:mod:`thinwire.plan_choice`); the state's ``auto`` holds
    the probe, the choice and why. The plan chooses density, selector, sparse_wire and wire;
    any other setting is the caller's. :func:`replan` probes again between steps and switches
    where the link changed.

    A failure in the hook reaches ``loss.backward()`` on this rank with its original message
    (DDP's C++ side re-raises it as a RuntimeError; ``thinwire.synchronize`` keeps the type).
    The worker thread is shared by every registered model and runs for the process's life.
    """
    if not isinstance(ddp_model, DistributedDataParallel):
        raise TypeError(f"ddp_model must be a torch.nn.parallel.DistributedDataParallel, got "
                        f"{type(ddp_model).__name__}")
    if getattr(ddp_model, "_thinwire_context", None) is not None:
        raise RuntimeError("a thinwire hook is already registered on this model; DDP allows one "
                           "communication hook per model")
    if state is not None:
        if not isinstance(state, SyncState):
            raise TypeError(f"state must be a thinwire SyncState, got {type(state).__name__}")
        given = dict(settings, **({"algorithm": algorithm} if algorithm is not None else {}))
        if given:
            raise ValueError(f"state= already holds its settings (algorithm={state.algorithm!r}"
                             f", ...); got {sorted(given)} too: pass settings only for a new "
                             "state")
    if plan is not None and algorithm != "auto":
        raise ValueError(f"plan= is for algorithm='auto', got algorithm={algorithm!r}")
    if topology is not None and not isinstance(topology, Topology):
        raise TypeError(f"topology must be a thinwire Topology, got {type(topology).__name__}")
    auto = None
    if algorithm == "auto":
        from thinwire import ddp_auto

        state, auto, topology = ddp_auto.auto_state(ddp_model, plan, topology, ranks_per_node,
                                                    timeout, settings)
    elif state is None:
        # A bad setting fails here, before any collective call.
        state = SyncState(None, algorithm if algorithm is not None else "hitopk", **settings)
    state.attach(topology or Topology.shared(ranks_per_node, timeout))
    context = _HookContext(state, ddp_model.module, auto)
    ddp_model.register_comm_hook(context, _hook)
    ddp_model._thinwire_context = context  # its state is the one the hook runs now
    _MODELS.add(ddp_model)
    return state


def replan(ddp_model: DistributedDataParallel, *, share: float = 0.3,
           min_gain: Optional[float] = None,
           every_s: Optional[float] = None, pilot: int = 2) -> Optional[dict]:
    """For a model registered with ``algorithm="auto"``: probe the link again and, where its
    goodput moved by more than ``share`` since the current choice was planned and the plan's
    best at the new rate promises at least ``min_gain`` (default
    ``thinwire.plan_choice.SWITCH_MIN_GAIN``) over the current choice, switch the
    hook to it (:mod:`thinwire.ddp_auto`). Collective: every rank calls it between the same
    two steps (after ``optimizer.step()``, before the next forward). A switch hands each
    rank's residuals to its next ``plan_choice.HANDOVER_STEPS`` steps' buckets in equal shares
    (with momentum correction it flushes them densely into the next step's gradient). Returns
    the check's record; the state to checkpoint afterwards is :func:`state_of`
    ``(ddp_model)`` (a new one after a switch).

    ``every_s``: call it after every step; it checks only every ``every_s`` seconds (rank 0's
    clock; the interval doubles after each check that found the link steady, up to 8 x
    ``every_s``, and is ``every_s`` again once one finds it moved), or at once where one step
    took twice the pace or the pace of the last few steps moved by more than ``share`` (a
    link that slowed shows so before any clock), and returns None otherwise. Each call costs
    a two-number broadcast.

    ``pilot`` (with ``every_s``, else unused; 0 turns it off): the plan's step times come from
    the model it was calibrated on, not from yours. After each choice the plan makes (at
    registration, and after a check that planned again at a new rate), once your
    ``dense_iterations`` and ``density_warmup_steps`` are over, up to ``pilot`` runners-up
    that it predicts within ``thinwire.plan_choice.PILOT_WITHIN`` (1.5x) of its choice are
    measured on your script: each candidate runs ``ddp_auto.PACE_CALLS + 1`` steps (a switch
    each, handing the residuals over as above), and the one whose plan steps to target at its measured seconds
    a step come soonest is kept (switching back to an earlier one only where it promises
    more than ``plan_choice.PILOT_MARGIN``, 5%). The clock and pace checks wait while a pilot
    runs; a jump gives it up for a check. Measured paces stand for the plan's near the rate
    they were measured at. The events say ``pilot``; the state's ``auto["pilot"]`` holds the
    paces and the decision."""
    from thinwire import ddp_auto

    if min_gain is None:
        min_gain = ddp_auto.plan_choice.SWITCH_MIN_GAIN
    return ddp_auto.replan(ddp_model, _context_of(ddp_model), share, min_gain, every_s, pilot)


def state_of(ddp_model: DistributedDataParallel) -> SyncState:
    """The SyncState the thinwire hook on ``ddp_model`` runs now."""
    return _context_of(ddp_model).state


def _context_of(ddp_model) -> "_HookContext":
    context = getattr(ddp_model, "_thinwire_context", None)
    if context is None:
        raise ValueError("this model has no thinwire hook (thinwire.ddp.register)")
    return context


def flush_residuals(ddp_model: DistributedDataParallel, average: bool = True):
    """:func:`thinwire.sync.flush_residuals` for a model with a thinwire hook: every rank's
    residuals, averaged, per parameter of ``ddp_model.module.parameters()`` (collective;
    between steps), with what a switch handed over and no step has taken yet. Returns
    ``(flushed, mass)``. ``average`` False: this rank's own, not exchanged (no collective;
    :func:`thinwire.sync.flush_indexed`)."""
    from thinwire.sync import average_over_ranks, flush_indexed

    context = _context_of(ddp_model)
    # a switch's residuals no step has taken yet (alike on every rank): this rank's own, or
    # with momentum correction the ranks' average already (see _reduce_bucket)
    averaged = bool(context.state.feedback.momentum)
    if context.pending and averaged and not average:
        raise RuntimeError("a switch's averaged flush is still owed to the next step: take "
                           "this rank's residuals after that step")
    owed, context.pending, context.pending_steps = context.pending, {}, 0
    # the hook's layouts index module.parameters(), every one (see _HookContext)
    flushed, mass = flush_indexed(context.params, context.state, average=average and averaged)
    if owed:
        if average and not averaged:
            flushed = flushed or [torch.zeros_like(p) for p in context.params]
        else:
            flushed = flushed or [None] * len(context.params)
        for i, tensor in owed.items():
            flushed[i] = tensor if flushed[i] is None else flushed[i] + tensor
        mass = dict(mass, owed_from_a_switch=len(owed))
    if average and not averaged and flushed is not None:
        flushed = average_over_ranks(flushed, context.state.topology.world)
    return flushed, mass


# A registered DDP model's C++ reducer holds the Python hook and its state. Destroyed during
# the interpreter's final teardown, it takes the GIL to drop them and aborts the process
# ("terminate called without an active exception"). Two ways a model lives that long: it is
# garbage in a reference cycle (DDP's own hooks hold the module, so a model local to a function
# that returned is freed only by the cycle collector), or a traceback keeps it (its backward
# raised: a peer died, a NaN). At exit, while the interpreter is intact, the collector frees the
# first kind; while the process group still exists, the reducers of live models are released
# too (after destroy_process_group(), a live model's reducer is left to PyTorch's own order).
_MODELS: "weakref.WeakSet[DistributedDataParallel]" = weakref.WeakSet()


@atexit.register
def _release_reducers() -> None:
    gc.collect()
    if not dist.is_initialized():
        return
    for model in list(_MODELS):
        model.__dict__.pop("reducer", None)
    gc.collect()


class _HookContext:
    """What the hook needs besides the SyncState: the model order of DDP's parameters, and
    for ``algorithm="auto"`` what re-planning keeps (a switch replaces ``state`` between
    steps; the residuals it hands over wait in ``pending`` for the next step's buckets:
    this rank's own, added before they are reduced, or with momentum correction the ranks'
    average, added after)."""

    def __init__(self, state: SyncState, module: torch.nn.Module, auto=None):
        self.state = state
        self.params = list(module.parameters())
        self.param_index = {id(p): i for i, p in enumerate(self.params)}
        self.auto = auto  # thinwire.ddp_auto.AutoContext, or None
        self.pending: dict[int, torch.Tensor] = {}  # model index -> what is still owed
        self.pending_steps = 0  # the steps ``pending`` is taken in, an equal share each

    def switch_to(self, state: SyncState, owed: list | None, steps: int = 1) -> None:
        """``state`` runs from the next step; ``owed`` (per model parameter, this rank's
        residuals), with anything still owed from an earlier switch, is added to the next
        ``steps`` steps' gradients in equal shares before they are reduced."""
        self.state = state
        for i, tensor in enumerate(owed or []):
            if tensor is not None:
                owed = self.pending.get(i)
                self.pending[i] = tensor if owed is None else owed + tensor
        self.pending_steps = steps if self.pending else 0

    def take_pending(self, layout: "_Layout", is_last: bool) -> list | None:
        """This step's share of the handed-over residuals of this bucket's parameters (DDP's
        order): what is left over the steps left; the last step takes the rest."""
        if not self.pending:
            return None
        extras = []
        for i in layout.model_index:
            rest = self.pending.get(i)
            if rest is None or self.pending_steps <= 1:
                extras.append(self.pending.pop(i, None))
            else:
                share = rest / self.pending_steps
                self.pending[i] = rest - share
                extras.append(share)
        if is_last:
            self.pending_steps -= 1
            if self.pending_steps <= 0:  # a parameter in no bucket (frozen) gets none later
                self.pending = {}
        return extras


# One worker thread per process, shared by every registered model, started on first use and
# never ended: a thread per model would grow with every register(), and a thread that ends
# (its thread-local state of torch and gloo torn down) while the process groups are destroyed
# aborts the process ("terminate called without an active exception", seen on 4 ranks).
_JOBS: Optional[queue.Queue] = None
_JOBS_LOCK = threading.Lock()


def _worker() -> queue.Queue:
    global _JOBS
    with _JOBS_LOCK:
        if _JOBS is None:
            _JOBS = queue.Queue()
            threading.Thread(target=_work, args=(_JOBS,), daemon=True,
                             name="thinwire-sync").start()
        return _JOBS


class _Layout:
    """Where each parameter of a bucket sits, in DDP's order and in canonical (model) order."""

    def __init__(self, context: _HookContext, bucket):
        params = bucket.parameters()
        self.params = params
        self.model_index = [context.param_index.get(id(p), -1) for p in params]
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

    def from_canonical(self, canonical: torch.Tensor, out: torch.Tensor | None = None
                       ) -> torch.Tensor:
        """``canonical`` back in DDP's order, written into ``out`` where given (the bucket's
        own buffer, free once to_canonical has copied it: no new bucket-sized tensor)."""
        if not self.needed:
            return canonical
        out = torch.empty_like(canonical) if out is None else out
        offset = 0
        for i in self.order:
            out[self.starts[i]:self.starts[i] + self.sizes[i]] = \
                canonical[offset:offset + self.sizes[i]]
            offset += self.sizes[i]
        return out


def _add_extras(result: torch.Tensor, layout: _Layout, extras: list) -> None:
    """A switch's handed-over residuals added to this rank's bucket (DDP's order)."""
    if sum(layout.sizes) != result.numel():
        raise RuntimeError(f"thinwire: a bucket of {result.numel()} entries does not hold its "
                           f"{len(layout.sizes)} parameters contiguously; a switch's residuals "
                           "cannot be added")
    for i, extra in enumerate(extras):
        if extra is not None:
            if extra.is_cuda:  # read on this (side) stream: not reused before it has passed
                extra.record_stream(torch.cuda.current_stream(extra.device))
            start = layout.starts[i]
            result[start:start + layout.sizes[i]].add_(extra.reshape(-1).to(result.dtype))


def _reduce_bucket(state: SyncState, index: int, buffer: torch.Tensor, layout: _Layout,
                   is_last: bool, extras: list | None = None) -> torch.Tensor:
    # a switch's residuals: this rank's own, reduced with the gradient; with momentum
    # correction the ranks' average, flushed after (DGC's velocity would count them again)
    before = extras and not state.feedback.momentum
    if before:
        _add_extras(buffer, layout, extras)
    state.add_weight_decay(buffer, layout.params)  # in DDP's order, before any reordering
    # A sparse algorithm's selection, shards and residuals depend on the order of the entries:
    # canonical (model) order, the same before and after DDP's rebuild and in synchronize().
    # A dense average does not: DDP's order, no copy.
    if collectives.get(state.algorithm).sparse:
        result = layout.from_canonical(
            state.reduce(index, layout.to_canonical(buffer), layout.signature), out=buffer)
    else:
        result = state.reduce(index, buffer, layout.signature)
    if extras and not before:
        _add_extras(result, layout, extras)
    if is_last:
        state.end_step()
    return result


# No postponed annotations in this file: DDP checks the hook's return annotation as an object.
def _hook(context: _HookContext, bucket) -> torch.futures.Future[torch.Tensor]:
    buffer, index, is_last = bucket.buffer(), bucket.index(), bucket.is_last()
    layout = _Layout(context, bucket)
    # before the event below: on CUDA the share is made on backward's stream, which the
    # worker's side stream waits for
    extras = context.take_pending(layout, is_last)
    cuda = None
    if buffer.is_cuda:
        consumer = torch.cuda.current_stream(buffer.device)  # where backward (and DDP) run
        ready = torch.cuda.Event()
        ready.record(consumer)  # the bucket's gradient is complete once this is reached
        cuda = (ready, consumer)
        future: torch.futures.Future = torch.futures.Future(devices=[buffer.device])
    else:
        future = torch.futures.Future()
    _worker().put((context.state, index, buffer, layout, is_last, future, cuda, extras))
    # torch.futures.Future.set_exception stores the exception as the *value*, which DDP's C++
    # side then fails to cast ("Unable to cast ... to Tensor"). A callback that re-raises it
    # marks the chained future failed in C++, and backward() re-raises the original exception.
    return future.then(_value)


def _value(future: torch.futures.Future) -> torch.Tensor:
    return future.value()


_SIDE_STREAMS: dict = {}  # device -> the stream the worker runs that device's buckets on


def _on_side_stream(cuda, buffer: torch.Tensor):
    """The stream context a bucket's work runs in: on CUDA a side stream that first waits for
    the gradient (the event the hook recorded on backward's stream); on the CPU none."""
    if cuda is None:
        return contextlib.nullcontext()
    ready, _ = cuda
    stream = _SIDE_STREAMS.get(buffer.device)
    if stream is None:
        stream = _SIDE_STREAMS[buffer.device] = torch.cuda.Stream(buffer.device)
    stream.wait_event(ready)
    buffer.record_stream(stream)  # DDP's buffer is in use here until this stream passes
    return torch.cuda.stream(stream)


def _work(jobs: queue.Queue) -> None:
    failed: dict = {}  # SyncState id -> the exception that failed its current step
    while True:
        state, index, buffer, layout, is_last, future, cuda, extras = jobs.get()
        earlier = failed.get(id(state))
        if earlier is not None:  # the rest of a failed step is not sent: peers may be gone
            future.set_exception(RuntimeError(
                f"thinwire: bucket {index} not synchronised: an earlier bucket of this step "
                f"failed with {type(earlier).__name__}: {earlier}"))
        else:
            try:
                # set_result inside the context: a CUDA-aware future records its completion
                # event on the current stream, the side stream that did the work
                with _on_side_stream(cuda, buffer):
                    result = _reduce_bucket(state, index, buffer, layout, is_last, extras)
                    if cuda is not None:
                        result.record_stream(cuda[1])  # DDP reads it on backward's stream
                    future.set_result(result)
            except Exception as exc:  # hand every failure to the training thread
                failed[id(state)] = exc
                future.set_exception(exc)
        if is_last:  # the next step tries again (and fails at once if the groups are broken)
            if failed.pop(id(state), None) is not None:
                state.abandon_step()
        # hold nothing of a model while waiting for the next bucket
        state = buffer = layout = future = cuda = result = extras = None
