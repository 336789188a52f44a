"""Rank functions of test_auto_resolve (importable by the spawned ranks)."""

import itertools

from thinwire.train import auto
from thinwire.train.compare import CompareSettings


def resolve(rank, world, results_path, ranks_per_node, batch_size=32, compute_ms=None,
            launcher_ranks_per_node=None):
    """``launcher_ranks_per_node``: the run's ranks_per_node left unset, the launcher's
    LOCAL_WORLD_SIZE set to this (torchrun's), as `thinwire train` under torchrun runs."""
    import dataclasses
    import os

    cfg = CompareSettings(workload="mnist", algorithms=["auto"], nodes=world // ranks_per_node,
                          ranks_per_node=ranks_per_node,
                          train={"plan_from": results_path, "batch_size": batch_size}
                          ).run_config("auto")
    if launcher_ranks_per_node is not None:
        os.environ["LOCAL_WORLD_SIZE"] = str(launcher_ranks_per_node)
        cfg = dataclasses.replace(cfg, ranks_per_node=None)
    try:
        measure = None
        if compute_ms is not None:  # this rank's step, or its steps in turn (one a probe)
            mine = compute_ms[rank]
            steps = iter(mine) if isinstance(mine, list) else itertools.repeat(mine)
            measure = lambda: next(steps)  # noqa: E731
        chosen, info = auto.resolve(cfg, measure)
    except ValueError as exc:
        return {"error": str(exc)}
    return {"algorithm": chosen.algorithm, "plan_from": chosen.plan_from,
            "ranks_per_node": chosen.ranks_per_node,
            "choice": info["choice"], "goodput": info["probe"]["goodput_Bps"],
            "planned_at_bps": info["planned_at_bps"], "compute": info["compute"],
            "probe": info["probe"]}


def register_auto(rank, world, plans):
    """thinwire.ddp.register(..., "auto", plan=plans[rank]) and one step of a linear model."""
    import copy

    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    import thinwire.ddp

    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(8, 4))
    try:
        state = thinwire.ddp.register(model, "auto", plan=plans[rank], ranks_per_node=1)
    except ValueError as exc:
        return {"error": str(exc)}
    torch.manual_seed(1 + rank)
    x = torch.randn(16, 8)
    alone = copy.deepcopy(model.module)  # this rank's own gradient, for the reference
    alone(x).square().sum().backward()
    model(x).square().sum().backward()
    return {"algorithm": state.algorithm, "wire": state.wire,
            "choice": state.auto["choice"], "probe": state.auto["probe"],
            "grad": model.module.weight.grad.clone(), "own_grad": alone.weight.grad.clone()}


def train_auto(rank, world, results_path):
    """thinwire train's loop with --algorithm auto: its compute probe times the run's model."""
    from thinwire.train import loop

    cfg = CompareSettings(workload="mnist", algorithms=["auto"], nodes=world, ranks_per_node=1,
                          train={"plan_from": results_path, "replan_every_s": 0.0,
                                 "max_iters": 2, "compute_probe_iters": 2}).run_config("auto")
    summary = loop.train(cfg)
    return summary.get("auto") if rank == 0 else None


def register_then_replan(rank, world, plan, goodputs_Bps, momentum_correction=0.0):
    """register(..., "auto") and four steps of a linear model, with ``thinwire.ddp.replan``
    after the first and the second; the link's goodput is scripted (``goodputs_Bps``: the
    registration's probe, then each re-check's). ``flush_refs``: before each replan, the
    ranks' averaged residuals per parameter, flushed from a copy of the state (the dense
    flush a switch under momentum correction must add)."""
    import copy

    from thinwire.sync import flush_indexed

    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    import thinwire.ddp
    from thinwire import link_probe

    scripted = iter(goodputs_Bps)

    def probe(*args, **kwargs):
        return {"nodes": world, "goodput_Bps": next(scripted), "trusted": True,
                "bound_by": "link", "why": "scripted"}
    link_probe.probe_inter_node = probe  # this rank's process only

    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(64, 16))
    # dense_below_bytes=0: this small bucket is compressed (by default it would go dense)
    first = thinwire.ddp.register(model, "auto", plan=plan, ranks_per_node=1,
                                  dense_below_bytes=0, momentum_correction=momentum_correction)
    torch.manual_seed(1 + rank)
    own, synced, events, algorithms, flush_refs = [], [], [], [first.algorithm], []
    for step in range(4):
        x = torch.randn(32, 64)
        alone = copy.deepcopy(model.module)  # this rank's own gradient, for the reference
        alone(x).square().sum().backward()
        own.append(torch.cat([alone.weight.grad.reshape(-1), alone.bias.grad]))
        model(x).square().sum().backward()
        synced.append(torch.cat([model.module.weight.grad.reshape(-1),
                                 model.module.bias.grad]))
        model.module.zero_grad(set_to_none=True)
        if step < 2:
            state = thinwire.ddp.state_of(model)
            held = copy.deepcopy(state)  # the topology's groups do not copy: attached again
            held.attach(state.topology)
            flushed, _ = flush_indexed(list(model.module.parameters()), held)
            flush_refs.append(None if flushed is None else
                              torch.cat([flushed[0].reshape(-1), flushed[1]]))
            events.append(thinwire.ddp.replan(model))
            algorithms.append(thinwire.ddp.state_of(model).algorithm)
    now = thinwire.ddp.state_of(model)
    flushed, _ = thinwire.ddp.flush_residuals(model)  # the all-reduce holds none back
    return {"own": torch.stack(own), "synced": torch.stack(synced), "events": events,
            "algorithms": algorithms, "steps": now.steps, "auto": now.auto,
            "flushed_after": flushed, "flush_refs": flush_refs}


def timed_replan(rank, world, plan):
    """replan(every_s=...) after each of a few steps: None until due, alike on every rank."""
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    import thinwire.ddp
    from thinwire import link_probe

    def probe(*args, **kwargs):
        return {"nodes": world, "goodput_Bps": 12.5e6 / 8, "trusted": True,
                "bound_by": "link", "why": "scripted"}
    link_probe.probe_inter_node = probe  # this rank's process only
    model = DDP(torch.nn.Linear(8, 4))
    thinwire.ddp.register(model, "auto", plan=plan, ranks_per_node=1)
    answers = []
    for _ in range(3):
        model(torch.randn(4, 8)).sum().backward()
        answers.append(thinwire.ddp.replan(model, every_s=3600.0))
    answers.append(thinwire.ddp.replan(model, every_s=0.0))  # due at once
    return answers


def piloted_replan(rank, world, plan, step_s, other_step_s):
    """register(..., "auto") and 14 steps of a linear model with replan(every_s=3600, pilot=1)
    after each, on a scripted clock: on rank 0 a step of candidate algorithm A takes
    ``step_s[A]`` seconds, on the others ``other_step_s[A]`` (rank 0's clock decides: the
    others follow it). No optimizer step: the gradients are comparable across steps for the
    conservation check."""
    if rank != 0:
        step_s = other_step_s
    import copy
    import types

    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    import thinwire.ddp
    from thinwire import ddp_auto, link_probe

    def probe(*args, **kwargs):
        return {"nodes": world, "goodput_Bps": 12.5e6 / 8, "trusted": True,
                "bound_by": "link", "why": "scripted"}
    link_probe.probe_inter_node = probe  # this rank's process only
    clock = [0.0]
    ddp_auto.time = types.SimpleNamespace(perf_counter=lambda: clock[0])

    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(64, 16))
    thinwire.ddp.register(model, "auto", plan=plan, ranks_per_node=1, dense_below_bytes=0)
    torch.manual_seed(1 + rank)
    own, synced, events, algorithms = [], [], [], []
    for _ in range(14):
        x = torch.randn(32, 64)
        alone = copy.deepcopy(model.module)
        alone(x).square().sum().backward()
        own.append(torch.cat([alone.weight.grad.reshape(-1), alone.bias.grad]))
        algorithms.append(thinwire.ddp.state_of(model).algorithm)
        model(x).square().sum().backward()
        synced.append(torch.cat([model.module.weight.grad.reshape(-1), model.module.bias.grad]))
        model.module.zero_grad(set_to_none=True)
        clock[0] += step_s[algorithms[-1]]
        events.append(thinwire.ddp.replan(model, every_s=3600.0, pilot=1))
    flushed, _ = thinwire.ddp.flush_residuals(model)
    held = torch.zeros_like(synced[0]) if flushed is None else torch.cat(
        [f.reshape(-1) if f is not None else torch.zeros(p.numel())
         for f, p in zip(flushed, model.module.parameters())])
    return {"own": torch.stack(own), "synced": torch.stack(synced), "held": held,
            "events": events, "algorithms": algorithms,
            "auto": thinwire.ddp.state_of(model).auto}


def probe_intra(rank, world, ranks_per_node):
    """thinwire.node_probe on every rank: the numbers each rank got."""
    from thinwire import node_probe

    return node_probe.probe_intra_node(ranks_per_node, timeout_s=60)


def frozen_peer_in_replan(rank, world, store_dir, init_timeout_s, timeout_s, result_path,
                          every_s):
    """register(..., "auto", timeout=timeout_s) under a default group of ``init_timeout_s``;
    after a step rank 1 stops itself (SIGSTOP) and rank 0 calls replan (``every_s``: timed,
    or None: a check at once): rank 0 writes what ended it, and when."""
    import datetime
    import os
    import signal
    import time

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    import thinwire.ddp
    from thinwire import link_probe
    from harness import report_outcome
    from test_plan_choice import plan_of

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    store = dist.FileStore(os.path.join(store_dir, "store"), world)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=init_timeout_s))
    link_probe.probe_inter_node = lambda *a, **k: {
        "nodes": world, "goodput_Bps": 12.5e6 / 8, "trusted": True, "bound_by": "link",
        "why": "scripted"}
    model = DDP(torch.nn.Linear(8, 4))
    thinwire.ddp.register(model, "auto", plan=plan_of(), ranks_per_node=1, timeout=timeout_s)
    model(torch.randn(4, 8)).sum().backward()
    if rank == 1:
        os.kill(os.getpid(), signal.SIGSTOP)
    start = time.monotonic()
    try:
        thinwire.ddp.replan(model, every_s=every_s, pilot=0)
    except Exception as exc:
        report_outcome(result_path, start, exc)
        return
    report_outcome(result_path, start, None)
