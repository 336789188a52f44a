"""thinwire's and torchft's dense DiLoCo on the byte-level LM, one process per node on loopback,
timing the inner step that carries the outer step (used by `thinwire bench diloco --torchft`)."""

from __future__ import annotations

import os
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from thinwire.local_sgd.diloco import DiLoCo
from thinwire.train import data as data_sets
from thinwire.train import models

BATCH = 16


def lm_loss(model, node: int, step: int):
    """The byte LM's loss on node ``node``'s batch ``step`` (the same batches for both peers)."""
    dataset = data_sets.stdlib_text()
    order = data_sets.epoch_order(len(dataset), seed=0, epoch=0)
    start = ((step * 64 + node) * BATCH) % (len(dataset) - BATCH)
    index = order[start:start + BATCH]
    loss, _, _ = models.loss_and_correct(model, dataset.train_x[index], dataset.train_y[index])
    return loss


def _train(model, inner, steps, sync_every, node, outer_step):
    sync_seconds = []
    for step in range(steps):
        inner.zero_grad()
        lm_loss(model, node, step).backward()
        start = time.perf_counter()
        inner.step()
        outer_step()
        if (step + 1) % sync_every == 0:
            sync_seconds.append(time.perf_counter() - start)
    return {"sync_s": sync_seconds, "params": [p.detach().clone() for p in model.parameters()]}


def torchft_lm_replica(make_manager, replica_id, steps, sync_every):
    """torchft's DiLoCo on node ``replica_id`` (a module-level function: runs in a process)."""
    from torchft.local_sgd import DiLoCo as TorchftDiLoCo

    torch.set_num_threads(1)
    model = models.build("transformer", seed=0)
    manager = make_manager(lambda s: model.load_state_dict(s["model"]),
                           lambda: {"model": model.state_dict()})
    inner = torch.optim.AdamW(model.parameters(), lr=3e-3)
    outer = torch.optim.SGD(model.parameters(), lr=0.7, momentum=0.9, nesterov=True)
    with TorchftDiLoCo(manager, [model], inner, outer, sync_every=sync_every):
        return _train(model, inner, steps, sync_every, replica_id, lambda: None)


def _thinwire_rank(rank, nodes, store_dir, steps, sync_every):
    from thinwire.topology import Topology

    torch.set_num_threads(1)
    store = dist.FileStore(os.path.join(store_dir, "store"), nodes)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=nodes)
    try:
        model = models.build("transformer", seed=0)
        inner = torch.optim.AdamW(model.parameters(), lr=3e-3)
        diloco = DiLoCo(model, inner, sync_every=sync_every, topology=Topology.build(1))
        result = _train(model, inner, steps, sync_every, rank, diloco.step)
        torch.save(result, os.path.join(store_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


def thinwire_replicas(nodes: int, steps: int, sync_every: int) -> list[dict]:
    with tempfile.TemporaryDirectory(prefix="thinwire-diloco-peer-") as store_dir:
        mp.start_processes(_thinwire_rank, args=(nodes, store_dir, steps, sync_every),
                           nprocs=nodes, join=True, start_method="spawn")
        return [torch.load(os.path.join(store_dir, f"rank{r}.pt"), weights_only=True)
                for r in range(nodes)]
