"""Tick-tock workers for test_wavelet.py (imported by name in the spawned ranks).

A float64 MLP trained with DDP and a thinwire gradient-sync algorithm; ``waves=2`` runs the
tick-tock handshake around every forward (consecutive ranks are the tick and tock of a slot),
``waves=1`` the same job without it. Each rank takes its own ``batch`` rows of the step's
combined batch, in rank order.
"""

from __future__ import annotations

import time

import torch
from torch.nn.parallel import DistributedDataParallel

import thinwire.ddp
from thinwire.wavelet import TickTock, Wave


def model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(),
                               torch.nn.Linear(16, 3)).double()


def combined_batch(step: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(size, 6, generator=gen, dtype=torch.float64)
    y = torch.randint(0, 3, (size,), generator=gen)
    return x, y


def train(rank: int, world: int, processes_per_node: int, waves: int, algorithm: str,
          steps: int, batch: int, lr: float, sync_options: dict, turn: str = "forward"):
    module = model()
    ddp = DistributedDataParallel(module)
    thinwire.ddp.register(ddp, algorithm=algorithm, ranks_per_node=processes_per_node,
                          **sync_options)
    opt = torch.optim.SGD(module.parameters(), lr=lr, momentum=0.9)
    wave = Wave(rank, world, rank % processes_per_node, processes_per_node, waves)
    ticktock = TickTock(wave, turn=turn)
    ticktock.attach(module)
    for step in range(steps):
        x, y = combined_batch(step, batch * world)
        x, y = x[rank * batch:(rank + 1) * batch], y[rank * batch:(rank + 1) * batch]
        with ticktock.forward(step):
            loss = torch.nn.functional.cross_entropy(ddp(x), y)
            if wave.index == 0 and waves == 2:
                time.sleep(0.01)  # a forward long enough that an overlap would show
        started = time.time()
        loss.backward()
        ticktock.record(step, "backward", started, ticktock.backward_done_at)
        opt.step()
        opt.zero_grad()
    ticktock.close()
    return {"params": [p.detach().clone() for p in module.parameters()],
            "events": ticktock.events, "wave": wave.index}


def run_configs(rank: int, world: int, processes_per_node: int, configs: list, steps: int,
                batch: int, lr: float) -> dict:
    """Every (name, waves, algorithm, options) of ``configs`` in one spawn of the ranks."""
    return {name: train(rank, world, processes_per_node, waves, algorithm, steps, batch, lr,
                        options, turn) for name, waves, algorithm, options, turn in configs}


def reference(steps: int, combined: int, lr: float) -> list[torch.Tensor]:
    """One process, the combined batch of every step, momentum SGD: float64."""
    module = model()
    opt = torch.optim.SGD(module.parameters(), lr=lr, momentum=0.9)
    for step in range(steps):
        x, y = combined_batch(step, combined)
        torch.nn.functional.cross_entropy(module(x), y).backward()
        opt.step()
        opt.zero_grad()
    return [p.detach().clone() for p in module.parameters()]
