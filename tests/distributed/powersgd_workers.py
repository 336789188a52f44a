"""PyTorch's PowerSGD hook as `thinwire compare` registers it, on every rank of a gloo group."""

from __future__ import annotations

import torch
import torch.nn as nn
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook
from torch.nn.parallel import DistributedDataParallel as DDP

from thinwire.train import grad_sync

LAYERS, WIDTH, STEPS, START_ITER = 6, 64, 5, 2


def _batch(rank: int, step: int) -> torch.Tensor:
    return torch.randn(8, WIDTH, generator=torch.Generator().manual_seed(1000 * step + rank))


def powersgd_buckets_in_flight(rank, world):
    """Train a 6-layer MLP whose layers DDP puts in separate buckets; at every call of PyTorch's
    hook, count the buckets whose futures have not completed yet (0 means one bucket at a time,
    so at most one gloo run-loop thread is ever blocked in the hook's callbacks)."""
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(WIDTH, WIDTH) for _ in range(LAYERS)])
    ddp = DDP(model, bucket_cap_mb=0.01)  # 16 KiB weights: a bucket each
    sync = grad_sync.register(ddp, "powersgd", powersgd_rank=2, powersgd_start_iter=START_ITER)
    pending, in_flight, calls = [], [], 0
    original = powerSGD_hook.powerSGD_hook

    def counting_hook(state, bucket):
        nonlocal calls
        calls += 1
        in_flight.append(sum(not f.done() for f in pending))
        future = original(state, bucket)
        pending.append(future)
        return future

    powerSGD_hook.powerSGD_hook = counting_hook  # grad_sync looks it up at every call
    grads, inputs = [], []
    try:
        for step in range(STEPS):
            ddp.zero_grad()
            x = _batch(rank, step)
            ddp(x).square().sum().backward()
            grads.append([p.grad.clone() for p in model.parameters()])
            inputs.append(x)
    finally:
        powerSGD_hook.powerSGD_hook = original
    done = all(f.done() for f in pending)
    out = {"calls": calls, "max_in_flight": max(in_flight), "all_done": done, "grads": grads,
           "compressed": sync.state.total_numel_after_compression > 0}
    del ddp, sync
    return out


def local_grads(world: int, step: int) -> list[torch.Tensor]:
    """The dense reference for step 0 (before compression starts, and before any update): the
    mean over ranks of each rank's gradient of the same initial model, in one process."""
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(WIDTH, WIDTH) for _ in range(LAYERS)])
    total = [torch.zeros_like(p) for p in model.parameters()]
    for rank in range(world):
        model.zero_grad()
        model(_batch(rank, step)).square().sum().backward()
        for t, p in zip(total, model.parameters()):
            t += p.grad / world
    return total
