"""Gradient synchronisation of a training run: algorithm name -> the DDP hook that does it.

thinwire's own (every algorithm in :mod:`thinwire.collectives`' registry) go through
`thinwire.ddp.register`; PyTorch's own are the peers they are compared with:

* `ddp`: no hook at all, DDP's built-in bucketed all-reduce;
* `ddp-fp16`: `default_hooks.fp16_compress_hook` (halves the bytes);
* `powersgd`: `powerSGD_hook` with rank `--powersgd-rank`, error feedback and warm start, and
  compression from step `--powersgd-start-iter` on (default 2: the third step, the least
  PyTorch allows with error feedback; its dense steps before are PyTorch's own warm-up; 0 or
  1 run too, the error memory carried through DDP's rebuild by :func:`carry_error`).

Each returns a :class:`Sync`: what the checkpoint stores (the residuals) and the counters.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch.nn.parallel import DistributedDataParallel

import thinwire.ddp
from thinwire import collectives, topk
from thinwire.train.checkpoint_checks import rng_from_plain, rng_to_plain

TORCH_ALGORITHMS = ("ddp", "ddp-fp16", "powersgd")
SELECTORS = topk.METHODS
POWERSGD_START_ITER = 2


def algorithm_names() -> tuple[str, ...]:
    """Every name ``--algorithm`` takes: the registry's algorithms, then PyTorch's peers."""
    return collectives.names() + TORCH_ALGORITHMS


def is_thinwire(name: str) -> bool:
    return name in collectives.names()


def is_sparse(name: str) -> bool:
    return is_thinwire(name) and collectives.get(name).sparse


def takes_powersgd_settings(name: str) -> bool:
    """--powersgd-rank and --powersgd-start-iter are the PowerSGD peer's alone."""
    return name == "powersgd"


def check_algorithm(name: str) -> str:
    if name not in algorithm_names():
        raise ValueError(f"--algorithm must be one of {', '.join(algorithm_names())}, "
                         f"got {name!r}")
    return name


def check_density(density: float) -> float:
    try:
        return topk.validate_density(density)
    except (ValueError, TypeError) as exc:
        raise ValueError(f"--density must be a number in (0, 1], got {density!r} ({exc})") from None


def check_selector(name: str) -> str:
    if name not in SELECTORS:
        raise ValueError(f"--selector must be one of {', '.join(SELECTORS)}, got {name!r}")
    return name


def check_powersgd_rank(rank: int) -> int:
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise ValueError(f"--powersgd-rank must be an integer >= 1, got {rank!r}")
    return rank


@dataclass
class Sync:
    """A per-step run's synchronisation as the training loop drives it (the same methods as
    DiLoCo's syncs, thinwire.train.modes): the hook's state, checkpoint and counters."""
    algorithm: str
    state: Any = None  # thinwire SyncState, PowerSGDState, or None (ddp, ddp-fp16)
    layouts: dict | None = None  # PowerSGD: bucket index -> its parameters (model order)
    model: Any = None  # the DDP model the hook is registered on
    # PowerSGD: parameter index -> its piece of the error memory, between a rebuild of DDP's
    # buckets and the step's bucket that holds the parameter now (empty between steps)
    loose: dict | None = None
    # re-planning's switch to this synchronisation: the old one's residuals still owed to the
    # next steps' gradients (thinwire.train.replan.HandOver), or None
    handover: Any = None

    def owes(self) -> bool:
        """Whether a switch's residuals are still owed to coming steps (a checkpoint then
        keeps them beside the hook's state: ``HandOver.state_dict``)."""
        return self.handover is not None and self.handover.left > 0

    def attach(self, optimizer) -> None:
        """Nothing: the hook runs inside backward, not after the optimizer's step."""

    def finish(self, stopped: bool) -> None:
        """Nothing in flight after the last step."""

    def close(self) -> None:
        """Nothing to stop."""

    def state_dict(self) -> Any:
        """What a checkpoint keeps of the hook: residuals and step counts."""
        if is_thinwire(self.algorithm):
            return self.state.state_dict()
        if self.algorithm == "powersgd":
            out = {slot: getattr(self.state, slot) for slot in _POWERSGD_SLOTS}
            out["rng"] = rng_to_plain(out["rng"])  # plain data: loads with weights_only=True
            out["layouts"] = dict(self.layouts)
            return out
        return None

    def load_state_dict(self, saved: Any) -> None:
        if is_thinwire(self.algorithm):
            self.state.load_state_dict(saved)
        elif self.algorithm == "powersgd":
            for slot in _POWERSGD_SLOTS:
                setattr(self.state, slot, saved[slot])
            self.state.rng = rng_from_plain(saved["rng"])
            self.layouts.clear()
            self.layouts.update(saved["layouts"])

    def flush(self, average: bool = True):
        """Every rank's residuals, averaged, per parameter of the model (``None`` where the
        hook keeps none), and this rank's flushed mass; the residuals are emptied (collective).
        ``average`` False: this rank's own residuals, in its gradient's units, not exchanged
        (no collective): what a switch hands over to the next algorithm's first step
        (thinwire.train.replan)."""
        if is_thinwire(self.algorithm):
            flushed, mass = thinwire.ddp.flush_residuals(self.model, average)
        elif self.algorithm == "powersgd":
            flushed, mass = _flush_powersgd(self.state, self.layouts,
                                            list(self.model.module.parameters()), average,
                                            self.loose)
        else:
            flushed, mass = None, {}
        return self._with_handover(flushed, mass, average)

    def _with_handover(self, flushed: list | None, mass: dict, average: bool):
        """``flushed`` with what a switch still owes the coming steps added (taken over: no
        step takes it after this), averaged over the ranks where ``average``."""
        from thinwire.sync import average_over_ranks

        pending = self.handover.pending() if self.handover is not None else None
        if pending is None:
            return flushed, mass
        self.handover.cancel()
        params = list(self.model.module.parameters())
        pending = [torch.zeros_like(p) if o is None else o.to(p.dtype)
                   for o, p in zip(pending, params)]
        if average:
            pending = average_over_ranks(pending)
        flushed = flushed or [None] * len(params)
        flushed = [o if f is None else f + o for f, o in zip(flushed, pending)]
        return flushed, dict(mass, owed_from_a_switch_l1=sum(float(o.double().abs().sum())
                                                             for o in pending))

    def totals(self) -> dict | None:
        """thinwire's own counters (bytes by link class, seconds selecting and communicating)."""
        if is_thinwire(self.algorithm):
            return dict(self.state.totals)
        return None


def _flush_powersgd(state, layouts: dict, params: list, average: bool = True,
                    loose: dict | None = None):
    """PowerSGD's error feedback (``error_dict``: per bucket, this rank's error over DDP's
    bucket buffer, its parameters in ``layouts[index]`` order, and ``loose``: pieces of it by
    parameter that a rebuild of the buckets left unclaimed), averaged over the ranks
    (``average`` False: this rank's own)."""
    from thinwire.sync import average_over_ranks

    if not state.error_dict and not loose:  # still dense (alike on every rank)
        return None, {}
    summed = [torch.zeros_like(p) for p in params]
    l1 = 0.0
    for i, piece in (loose or {}).items():  # a rebuild's pieces no bucket has claimed yet
        summed[i].add_(piece.view_as(summed[i]))
        l1 += float(piece.double().abs().sum())
    if loose:
        loose.clear()
    for index, error in sorted(state.error_dict.items()):
        offset = 0
        for i in layouts[index]:
            size = params[i].numel()
            summed[i].add_(error[offset:offset + size].view_as(summed[i]))
            offset += size
        l1 += float(error.double().abs().sum())
    buckets = len(state.error_dict)
    state.error_dict.clear()
    summed = average_over_ranks(summed, state.process_group) if average else summed
    return summed, {"l1": l1, "buckets": buckets}


# What of a PowerSGDState changes while training (the rest is configuration).
_POWERSGD_SLOTS = ("iter", "error_dict", "p_memory_dict", "q_memory_dict", "rng",
                   "total_numel_before_compression", "total_numel_after_compression")


def register(model: DistributedDataParallel, algorithm: str, density: float = 0.01,
             selector: str = "auto", powersgd_rank: int = 4, seed: int = 0,
             ranks_per_node: int | None = None, momentum_correction: float = 0.0,
             dense_warmup_steps: int = 0, weight_decay_in_hook: float = 0.0,
             wire: str | None = None, density_warmup_steps: int = 0,
             density_warmup_from: float = 0.25,
             powersgd_start_iter: int = POWERSGD_START_ITER, sparse_wire: str = "fp32",
             algorithm_options: dict | None = None, switched: bool = False) -> Sync:
    """Register ``algorithm`` on ``model`` (collective: every rank calls it). ``switched``:
    a run switching to it mid-way (thinwire.train.replan): PowerSGD compresses from the first
    step, its dense warm-up not run again (the rebuild of the new wrapper's buckets after that
    step carries its error memory over by parameter: :func:`_powersgd_resumable`)."""
    check_algorithm(algorithm)
    if is_thinwire(algorithm):  # settings were checked where they entered (TrainConfig)
        state = thinwire.ddp.register(model, algorithm=algorithm, density=density,
                                      selector=selector,
                                      ranks_per_node=ranks_per_node,
                                      momentum_correction=float(momentum_correction),
                                      dense_iterations=dense_warmup_steps,
                                      weight_decay=weight_decay_in_hook, wire=wire,
                                      density_warmup_steps=density_warmup_steps,
                                      density_warmup_from=density_warmup_from,
                                      sparse_wire=sparse_wire,
                                      algorithm_options=algorithm_options)
        return Sync(algorithm, state, model=model)
    if algorithm == "ddp":
        return Sync(algorithm, model=model)
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

    if algorithm == "ddp-fp16":
        model.register_comm_hook(None, default_hooks.fp16_compress_hook)
        return Sync(algorithm, model=model)
    # PyTorch refuses a start before step 2 with error feedback (its memory is keyed by bucket
    # index, which DDP's rebuild after the first step reshuffles); carry_error follows the
    # rebuild by parameter, so an earlier start is the counter set ahead by what is skipped
    state = powerSGD_hook.PowerSGDState(
        process_group=None, matrix_approximation_rank=check_powersgd_rank(powersgd_rank),
        start_powerSGD_iter=max(powersgd_start_iter, POWERSGD_START_ITER),
        use_error_feedback=True, warm_start=True, random_seed=seed)
    if switched:
        state.iter = state.start_powerSGD_iter
    elif powersgd_start_iter < POWERSGD_START_ITER:
        state.iter = POWERSGD_START_ITER - powersgd_start_iter
    if next(model.module.parameters()).device.type == "cpu":
        check_gloo_threads_for_powersgd(model.process_group)
    layouts: dict = {}
    loose: dict = {}
    params = list(model.module.parameters())
    param_index = {id(p): i for i, p in enumerate(params)}
    sizes = [p.numel() for p in params]

    def powersgd(state, bucket):  # no annotation: DDP checks it as an object
        return _powersgd_resumable(layouts, param_index, sizes, loose, state, bucket)

    model.register_comm_hook(state, powersgd)
    return Sync(algorithm, state, layouts, model=model, loose=loose)


def _powersgd_resumable(layouts: dict, param_index: dict, sizes: list, loose: dict, state,
                        bucket):
    """powerSGD_hook, one bucket at a time on gloo, with its error memory carried by
    parameter where DDP's buckets changed.

    DDP rebuilds its buckets after a wrapper's first step; a resumed run, or a run that
    switched to PowerSGD mid-way (``register(switched=True)``), compresses before that, so its
    error memory may belong to other coordinates than those its bucket index holds now.
    PyTorch keys the memory by bucket index only (and fails on a size mismatch). Where a
    bucket's parameters changed, the errors that held them are cut into pieces by parameter
    (``loose``), and each bucket of the step takes its parameters' pieces back in its own
    order (:func:`carry_error`): the error's mass is kept (sent + kept = corrected through a
    rebuild). The P/Q memories of a changed bucket (warm start only: a starting point, not
    mass) begin afresh. A parameter outside ``module.parameters()`` (index -1) cannot be
    carried: its bucket's memory is dropped.
    """
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook

    layout = tuple(param_index.get(id(p), -1) for p in bucket.parameters())
    carry_error(layouts, sizes, loose, state, bucket.index(), layout, bucket.buffer())
    future = powerSGD_hook.powerSGD_hook(state, bucket)
    if not bucket.buffer().is_cuda:
        # On gloo, finish each bucket before DDP hands over the next one. Two reasons:
        # * Deadlock. PyTorch's hook chains its all-reduces with `.then()` callbacks, and each
        #   callback launches the next all-reduce (P, then Q) and `.wait()`s on it. Gloo runs
        #   callbacks on the run-loop thread that completed the previous all-reduce, so every
        #   bucket in flight blocks one of the group's run-loop threads (2 by default) until
        #   its inner all-reduce runs on another. With as many buckets in flight as threads,
        #   all of them wait on work that only they could run: the process hangs in backward
        #   (seen in `make test`, world size 1, two buckets). With one bucket in flight, one
        #   thread is blocked and the other runs the inner all-reduce
        #   (`check_gloo_threads_for_powersgd` makes sure there is another).
        # * Order. A callback launches Q on gloo's thread while the autograd thread launches
        #   the next bucket's first all-reduce: ranks then issue collectives in different
        #   orders and gloo fails ("Received data size doesn't match expected size").
        # PowerSGD's algorithm and settings are untouched; the cost is the overlap of a
        # bucket's communication with the rest of backward, which gloo's blocking callbacks
        # would serialise anyway.
        future.wait()
    return future


def carry_error(layouts: dict, sizes: list, loose: dict, state, index: int, layout: tuple,
                buffer: torch.Tensor) -> None:
    """Before PowerSGD reduces bucket ``index`` (its parameters ``layout``, model indices;
    ``buffer`` its gradient): where the bucket holds other parameters than its memory was
    kept for, the memories that hold any of them (its own index's too) are cut into pieces by
    parameter; then the bucket takes its parameters' pieces (zeros for those without one) as
    its error memory. A bucket whose parameters did not change is never cut, so one reduced
    earlier in the step (whose new error a CUDA callback may still be writing) is left alone:
    it holds none of a later bucket's parameters."""
    if layouts.get(index, layout) != layout:
        wanted = set(layout)
        for other, held in list(layouts.items()):
            if other == index or wanted.intersection(held):
                _cut(state, other, held, sizes, loose)
                del layouts[other]
    if -1 in layout:
        for memory in (state.error_dict, state.p_memory_dict, state.q_memory_dict):
            memory.pop(index, None)
    elif index not in state.error_dict and any(i in loose for i in layout):
        state.error_dict[index] = torch.cat([
            loose.pop(i) if i in loose else
            torch.zeros(sizes[i], dtype=buffer.dtype, device=buffer.device) for i in layout])
    layouts[index] = layout


def _cut(state, index: int, layout: tuple, sizes: list, loose: dict) -> None:
    """Bucket ``index``'s error memory into ``loose`` (parameter index -> its piece); its
    memories emptied (P/Q: a warm start's starting point, not mass, begins afresh)."""
    error = state.error_dict.pop(index, None)
    state.p_memory_dict.pop(index, None)
    state.q_memory_dict.pop(index, None)
    if error is None or -1 in layout or sum(sizes[i] for i in layout) != error.numel():
        return  # nothing kept, or not carried: a parameter without an index
    offset = 0
    for i in layout:
        piece = error[offset:offset + sizes[i]].clone()
        loose[i] = piece if i not in loose else loose[i] + piece
        offset += sizes[i]


def check_gloo_threads_for_powersgd(group=None) -> None:
    """Refuse a gloo group with fewer than 2 run-loop threads for the PowerSGD peer: one
    bucket's callbacks block one thread while its inner all-reduce needs another."""
    import torch.distributed as dist

    group = group if group is not None else dist.group.WORLD
    try:
        backend = group._get_backend(torch.device("cpu"))
        threads = backend.options._threads  # private in PyTorch 2.13: checked where it exists
    except (AttributeError, RuntimeError):
        return
    if isinstance(threads, int) and threads < 2:
        raise ValueError(f"powersgd on gloo needs a process group with >= 2 run-loop threads "
                         f"(PyTorch's hook blocks one in a callback), got {threads}")


def hook_settings(cfg, switched: bool = False) -> dict:
    """A run's (a TrainConfig's) settings of its synchronisation, as SyncState's keywords:
    with momentum correction the optimizer leaves momentum and weight decay to the hook
    (loop._optimizer), so they are the hook's here. ``switched``: mid-run (a re-planning
    switch): the warm-ups of the start of training are not run again. The one mapping for
    the DDP hook (:func:`register_sync`) and the fault-tolerant step (ft_job)."""
    return dict(density=cfg.density, selector=cfg.selector, wire=cfg.wire,
                sparse_wire=cfg.sparse_wire,
                momentum_correction=cfg.momentum if cfg.momentum_correction else 0.0,
                weight_decay=cfg.weight_decay if cfg.momentum_correction else 0.0,
                dense_iterations=0 if switched else cfg.dense_warmup_steps,
                density_warmup_steps=0 if switched else cfg.density_warmup_steps,
                density_warmup_from=cfg.density_warmup_from,
                algorithm_options=sync_options(cfg))


def register_sync(cfg, model: DistributedDataParallel, ranks_per_node: int | None,
                  switched: bool = False) -> Sync:
    """A run's (a TrainConfig's) per-step synchronisation on a DDP model, with every setting
    of the run (:func:`hook_settings`). ``switched``: mid-run (a re-planning switch): the
    warm-ups of the start of training (dense steps, PowerSGD's too, and a density ramp) are
    not run again."""
    s = hook_settings(cfg, switched)
    return register(model, cfg.algorithm, s["density"], s["selector"],
                    cfg.powersgd_rank, cfg.seed, ranks_per_node, s["momentum_correction"],
                    s["dense_iterations"], s["weight_decay"], wire=s["wire"],
                    sparse_wire=s["sparse_wire"],
                    density_warmup_steps=s["density_warmup_steps"],
                    density_warmup_from=s["density_warmup_from"],
                    powersgd_start_iter=cfg.powersgd_start_iter,
                    algorithm_options=s["algorithm_options"], switched=switched)


def sync_options(cfg) -> dict | None:
    """The chosen algorithm's own options from the run's configuration (checked there)."""
    return cfg.algorithm_options.get(cfg.algorithm)
