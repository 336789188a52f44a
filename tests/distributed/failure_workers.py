"""Rank functions for the failure tests: a hook that raises, NaN on one rank, a frozen peer."""

from __future__ import annotations

import datetime
import gc
import os
import signal
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

import thinwire

from harness import report_outcome


def _model(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 5)).double()


def _loss(model, rank, step, poison=False):
    g = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randn(16, 20, generator=g, dtype=torch.float64)
    if poison:
        x[0, 0] = float("nan")
    return model(x).square().mean()


def nonfinite_on_one_rank(rank, world, ranks_per_node, algorithm, policy, path):
    """Rank 1's gradient holds a NaN at step 1: what every rank sees."""
    model = _model()
    settings = dict(algorithm=algorithm, density=0.1, selector="exact", dense_below_bytes=0,
                    nonfinite=policy)
    topo = thinwire.Topology.build(ranks_per_node)
    if path == "hook":
        forward = DDP(model)
        state = thinwire.ddp.register(forward, topology=topo, **settings)
    else:
        forward, state = model, thinwire.SyncState(topo, **settings)
    out = {"errors": [], "nonfinite": [], "grads": []}
    for step in range(3):
        model.zero_grad()
        try:
            _loss(forward, rank, step, poison=(rank == 1 and step == 1)).backward()
            if path == "synchronize":
                thinwire.synchronize(model.parameters(), state)
        except Exception as exc:  # every rank stops here, as a training script would
            out["errors"].append((step, type(exc).__name__, str(exc)))
            break
        out["nonfinite"].append(state.last_step["nonfinite"])
        out["grads"].append([p.grad.clone() for p in model.parameters()])
    out["residuals"] = {i: r.clone() for i, r in state.feedback.residuals.items()}
    # A DDP model whose backward raised is left in a reference cycle; destroyed only after
    # destroy_process_group (the harness's), its reducer sometimes aborts the process at exit
    # (PyTorch's DDP, with any hook that fails). Collect it while the groups exist.
    del forward, model
    gc.collect()
    return out


def collectives_per_step(rank, world, ranks_per_node, policy):
    """How many all-reduces one step of `synchronize` issues on 3 buckets (allreduce), and the
    message when rank 1's gradient holds a NaN."""
    model = _model()
    state = thinwire.SyncState(thinwire.Topology.build(ranks_per_node), algorithm="allreduce",
                               nonfinite=policy)
    calls = []
    real = dist.all_reduce

    def counting(tensor, *args, **kwargs):
        calls.append(tensor.numel())
        return real(tensor, *args, **kwargs)

    out = {}
    dist.all_reduce = counting
    try:
        for step in range(2):
            model.zero_grad()
            _loss(model, rank, step, poison=(rank == 1 and step == 1)).backward()
            calls.clear()
            try:
                # one bucket per parameter tensor: 4 buckets
                thinwire.synchronize(model.parameters(), state, bucket_bytes=1)
                out[step] = ("ok", list(calls))
            except FloatingPointError as exc:
                out[step] = (str(exc), list(calls))
    finally:
        dist.all_reduce = real
    return out


def frozen_peer(rank, world, timeout_s, result_path, mode="hitopk"):
    """Rank 1 stops itself (SIGSTOP) at step 2; rank 0 reports what ended its step, and when.
    ``mode`` "diloco": 2 ranks a node, DDP on the node's group and DiLoCo across nodes (rank 0
    waits in the node group's all-reduce)."""
    if mode == "diloco":
        from thinwire.local_sgd import DiLoCo, node_group
        topology = thinwire.Topology.build(2)
        model = DDP(_model(), process_group=node_group(topology))
        inner = torch.optim.SGD(model.parameters(), lr=0.01)
        diloco = DiLoCo(model, inner, sync_every=2, algorithm="allreduce", topology=topology)
    else:
        model = DDP(_model())
        thinwire.ddp.register(model, algorithm="hitopk", density=0.1, dense_below_bytes=0,
                              ranks_per_node=1)
    for step in range(4):
        if rank == 1 and step == 2:
            os.kill(os.getpid(), signal.SIGSTOP)
        start = time.monotonic()
        try:
            _loss(model, rank, step).backward()
            if mode == "diloco":
                inner.step()
                diloco.step()
        except Exception as exc:
            report_outcome(result_path, start, exc)
            return
    report_outcome(result_path, start, None)


def torchrun_entry() -> None:
    """`python failure_workers.py MODE` under torchrun: a hook that raises on rank 1, or rank
    1 dying in the middle of a step; the process must end with status 1, never an abort."""
    mode = sys.argv[1]
    algorithm = sys.argv[2] if len(sys.argv) > 2 else "hitopk"
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank = dist.get_rank()
    model = DDP(_model())
    sparse = thinwire.collectives.get(algorithm).sparse
    thinwire.ddp.register(model, algorithm=algorithm,
                          **(dict(density=0.1, dense_below_bytes=0) if sparse else {}))
    if mode == "raise" and rank == 1:
        from thinwire.collectives import costs, registry

        def broken(state, bucket_index, flat):
            raise ValueError("injected failure in the hook")
        registry.register(registry.Algorithm("hitopk", broken, lambda *a: costs.BucketCost(),
                                             sparse=True), replace=True)
    for step in range(4):
        if mode == "die" and rank == 1 and step == 2:
            os._exit(3)
        _loss(model, rank, step).backward()
    print(f"rank {rank} finished", flush=True)


if __name__ == "__main__":
    torchrun_entry()


def register_cycles(rank, world, cycles):
    """Threads and open descriptors after registering (and training one step of) many models
    one after another: they must not grow."""
    def one_model():
        model = DDP(_model())
        thinwire.ddp.register(model, algorithm="hitopk", density=0.1, dense_below_bytes=0)
        _loss(model, rank, 0).backward()

    import threading
    state = thinwire.SyncState(None, "hitopk")
    try:  # a restored state holds its settings: an algorithm passed beside it is refused
        thinwire.ddp.register(DDP(_model()), algorithm="allreduce", state=state)
        refused = None
    except ValueError as exc:
        refused = str(exc)
    for _ in range(3):  # the first registration builds the shared groups and the worker
        one_model()
    gc.collect()
    before = (threading.active_count(), len(os.listdir("/proc/self/fd")))
    for _ in range(cycles):
        one_model()
    gc.collect()
    return {"before": before, "after": (threading.active_count(),
                                        len(os.listdir("/proc/self/fd"))), "refused": refused}


def environ_value(rank, world, name):
    import os

    return os.environ.get(name)


def environ_then_fail(rank, world, name):
    """The harness's own check: the test's environment reaches the rank, and what a rank
    printed reaches the failure's message."""
    import os

    print(f"rank {rank} saw {name}={os.environ.get(name)}", flush=True)
    if rank == 1:
        raise ValueError("rank 1 fails on purpose")
    return os.environ.get(name)
