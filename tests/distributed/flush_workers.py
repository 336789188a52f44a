"""Rank functions of test_flush_residuals (importable by the spawned ranks)."""

import torch
import torch.nn as nn
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import thinwire

SIZES = [(300, 40), (40,), (70, 3), (5,)]  # one bucket above dense_below_bytes, small ones


def _gradients(step: int, rank: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * step + rank)
    return [torch.randn(size, generator=g, dtype=torch.float64).float() for size in SIZES]


def _reference(steps: int, world: int) -> list[torch.Tensor]:
    """The average of every rank's gradients, summed over the steps, in float64."""
    total = [torch.zeros(size, dtype=torch.float64) for size in SIZES]
    for step in range(steps):
        for rank in range(world):
            for t, g in zip(total, _gradients(step, rank)):
                t.add_(g.double() / world)
    return total


def synchronize_then_flush(rank, world, algorithm, ranks_per_node, steps=3):
    """Sparse steps with thinwire.synchronize, then a flush: applied + flushed vs the dense
    reference, and the residuals are empty after."""
    state = thinwire.SyncState(thinwire.Topology.build(ranks_per_node=ranks_per_node),
                               algorithm, density=0.05, selector="exact",
                               dense_below_bytes=1024)
    params = [nn.Parameter(torch.zeros(size)) for size in SIZES]
    applied = [torch.zeros(size, dtype=torch.float64) for size in SIZES]
    for step in range(steps):
        for p, g in zip(params, _gradients(step, rank)):
            p.grad = g.clone()
        thinwire.synchronize(params, state, bucket_bytes=40_000)
        for a, p in zip(applied, params):
            a.add_(p.grad.double())
    held = state.feedback.mass()["l1"]
    flushed, mass = thinwire.sync.flush_residuals(params, state)
    error = max(float((a + f.double() - r).abs().max())
                for a, f, r in zip(applied, flushed, _reference(steps, world)))
    return {"error": error, "held_l1": held, "flushed_l1": mass["l1"],
            "after": state.feedback.mass()["elements"], "buckets": mass["buckets"]}


def every_space_then_ddp(rank, world, algorithms, ranks_per_node):
    """synchronize_then_flush for each algorithm, then ddp_then_flush with hitopk and the
    PowerSGD flush, in one world (one spawn of the ranks for the lot)."""
    out = {a: synchronize_then_flush(rank, world, a, ranks_per_node) for a in algorithms}
    out["ddp"] = ddp_then_flush(rank, world, "hitopk", ranks_per_node)
    out["powersgd"] = powersgd_then_flush(rank, world)
    out["powersgd_from_0"] = powersgd_from_step_0_then_flush(rank, world)
    return out


def ddp_then_flush(rank, world, algorithm, ranks_per_node, steps=3):
    """The same through the DDP hook (its layouts index module.parameters())."""
    def hook(model):
        thinwire.ddp.register(model, algorithm=algorithm, density=0.05, selector="exact",
                              ranks_per_node=ranks_per_node, dense_below_bytes=1024)
        return lambda: thinwire.ddp.flush_residuals(model)
    return _ddp_conservation(rank, world, hook, steps)


def powersgd_then_flush(rank, world, steps=5):
    """PyTorch's PowerSGD hook as compare registers it: its error memory flushed the same way
    (the switch away from PowerSGD)."""
    from thinwire.train import grad_sync

    def hook(model):
        sync = grad_sync.register(model, "powersgd", powersgd_rank=1, powersgd_start_iter=2)
        return sync.flush
    return _ddp_conservation(rank, world, hook, steps)


def powersgd_from_step_0_then_flush(rank, world, steps=5):
    """PowerSGD compressing from the first step (--powersgd-start-iter 0: its error memory
    carried through DDP's bucket rebuild after that step), flushed the same way."""
    from thinwire.train import grad_sync

    seen = {}

    def hook(model):
        seen["sync"] = grad_sync.register(model, "powersgd", powersgd_rank=1,
                                          powersgd_start_iter=0)
        return seen["sync"].flush
    out = _ddp_conservation(rank, world, hook, steps,
                            after_first=lambda: seen.update(
                                compressed_first=bool(seen["sync"].state.error_dict)))
    return dict(out, compressed_first=seen["compressed_first"])


def _ddp_conservation(rank, world, register, steps, after_first=None):
    """Train ``steps`` with the hook ``register`` puts on a DDP model, flush, and compare
    what was applied plus the flush with every rank's gradients averaged densely."""
    torch.manual_seed(0)
    module = nn.Sequential(nn.Linear(64, 300), nn.Linear(300, 10))
    model = DDP(module, bucket_cap_mb=0.05)
    flush = register(model)
    applied = [torch.zeros_like(p, dtype=torch.float64) for p in module.parameters()]
    reference = [torch.zeros_like(p, dtype=torch.float64) for p in module.parameters()]
    for step in range(steps):
        g = torch.Generator().manual_seed(step)
        inputs = [torch.randn(8, 64, generator=g) for _ in range(world)]
        model.zero_grad()
        model(inputs[rank]).square().sum().backward()
        for a, p in zip(applied, module.parameters()):
            a.add_(p.grad.double())
        if step == 0 and after_first is not None:
            after_first()
        for other in range(world):  # every rank's own gradient, without communication
            copy = nn.Sequential(nn.Linear(64, 300), nn.Linear(300, 10))
            copy.load_state_dict(module.state_dict())
            copy(inputs[other]).square().sum().backward()
            for r, p in zip(reference, copy.parameters()):
                r.add_(p.grad.double() / world)
    flushed, mass = flush()
    error = max(float((a + f.double() - r).abs().max() / r.abs().max())
                for a, f, r in zip(applied, flushed, reference))
    dist.barrier()
    return {"relative_error": error, "flushed": mass}


def switch_conservation(rank, world, ranks_per_node, pairs, before=3, after=3):
    """For each (first, second, handover_steps) in ``pairs``: ``before`` steps with the first
    synchronisation as compare builds it, re-planning's switch to the second (the residuals
    handed over in ``handover_steps`` shares, not flushed), ``after`` steps with it, then its
    residuals flushed (with the shares not delivered yet): what the steps applied plus that
    flush against every rank's gradients averaged densely over all the steps."""
    from thinwire.train import grad_sync, replan
    from thinwire.train.config import TrainConfig

    out = {}
    for first, second, handover_steps in pairs:
        original = TrainConfig(algorithm="auto", plan_from="unused.json",
                               ranks_per_node=ranks_per_node, seed=0)
        torch.manual_seed(0)
        module = nn.Sequential(nn.Linear(64, 300), nn.Linear(300, 10))
        opt = torch.optim.SGD(module.parameters(), lr=0.0)  # the gradients alone are compared
        sync = grad_sync.register_sync(replan.resolved(original, first),
                                       DDP(module, bucket_cap_mb=0.05), ranks_per_node)
        applied = [torch.zeros_like(p, dtype=torch.float64) for p in module.parameters()]
        reference = [torch.zeros_like(p, dtype=torch.float64) for p in module.parameters()]
        record = {}
        for step in range(before + after):
            if step == before:
                _, sync, record["handed_over"] = replan.switch(original, second, sync, module,
                                                               opt, None, None, handover_steps)
            g = torch.Generator().manual_seed(step)
            inputs = [torch.randn(8, 64, generator=g) for _ in range(world)]
            opt.zero_grad()
            sync.model(inputs[rank]).square().sum().backward()
            opt.step()
            for a, p in zip(applied, module.parameters()):
                a.add_(p.grad.double())
            for other in range(world):
                copy = nn.Sequential(nn.Linear(64, 300), nn.Linear(300, 10))
                copy.load_state_dict(module.state_dict())
                copy(inputs[other]).square().sum().backward()
                for r, p in zip(reference, copy.parameters()):
                    r.add_(p.grad.double() / world)
            if step == before and second["algorithm"] == "powersgd":
                record["compressed_at_once"] = bool(sync.state.error_dict)
        record["owed_after"] = sync.owes()
        flushed, record["held_after"] = sync.flush()
        record["owed_after_flush"] = sync.owes()
        flushed = flushed or [None] * len(applied)
        record["relative_error"] = max(
            float((a + (0 if f is None else f.double()) - r).abs().max() / r.abs().max())
            for a, f, r in zip(applied, flushed, reference))
        out[f"{first['algorithm']}->{second['algorithm']} in {handover_steps}"] = record
        dist.barrier()
    return out


def switch_with_momentum_correction(rank, world, ranks_per_node):
    """hitopk with DGC's momentum correction switched to hitopk at another density: the
    residuals (accumulated velocity) are flushed densely, not handed over."""
    from thinwire.train import grad_sync, replan
    from thinwire.train.config import TrainConfig

    original = TrainConfig(algorithm="auto", plan_from="unused.json",
                           ranks_per_node=ranks_per_node, seed=0, momentum_correction=True)
    torch.manual_seed(0)
    module = nn.Sequential(nn.Linear(64, 300), nn.Linear(300, 10))
    opt = torch.optim.SGD(module.parameters(), lr=0.0)
    first = {"algorithm": "hitopk", "density": 0.05, "selector": "exact"}
    sync = grad_sync.register_sync(replan.resolved(original, first),
                                   DDP(module, bucket_cap_mb=0.05), ranks_per_node)
    for step in range(2):
        opt.zero_grad()
        sync.model(torch.randn(8, 64)).square().sum().backward()
        opt.step()
    _, sync, record = replan.switch(original, dict(first, density=0.1), sync, module, opt, None)
    opt.zero_grad()
    sync.model(torch.randn(8, 64)).square().sum().backward()
    opt.step()
    dist.barrier()
    return record
