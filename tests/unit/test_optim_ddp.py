"""LARS under DDP (2 gloo ranks).

DDP averages gradients; the optimizer only sees `.grad`, so two ranks on half batches must end
where one process on the whole batch ends, and in step with each other.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from thinwire.optim import LARS, param_groups
from thinwire.ports import free_port

STEPS = 3


def make_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 12), nn.LayerNorm(12), nn.ReLU(), nn.Linear(12, 1))


def data():
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(16, 6, generator=gen)
    return x, x.sum(dim=1, keepdim=True)


def train(model, x, y, opt):
    for _ in range(STEPS):
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()


def _rank(rank: int, world: int, port: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        torch.set_num_threads(1)
        model = nn.parallel.DistributedDataParallel(make_model())
        opt = LARS(param_groups(model, weight_decay=1e-4), lr=0.1, trust_coefficient=0.02)
        x, y = data()
        half = len(x) // world
        train(model, x[rank * half:(rank + 1) * half], y[rank * half:(rank + 1) * half], opt)
        torch.save([p.detach() for p in model.module.parameters()], f"{out}.{rank}")
    finally:
        dist.destroy_process_group()




def test_ddp_two_ranks_match_one_process(tmp_path):
    out = str(tmp_path / "params")
    mp.spawn(_rank, args=(2, free_port(), out), nprocs=2, join=True)
    rank0, rank1 = (torch.load(f"{out}.{r}") for r in range(2))
    model = make_model()
    x, y = data()
    train(model, x, y, LARS(param_groups(model, weight_decay=1e-4), lr=0.1,
                            trust_coefficient=0.02))
    for a, b, ref, init in zip(rank0, rank1, model.parameters(), make_model().parameters()):
        assert torch.equal(a, b)  # ranks in step
        torch.testing.assert_close(a, ref.detach(), rtol=1e-5, atol=1e-6)
        assert not torch.equal(a, init.detach())
