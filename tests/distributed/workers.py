"""Functions that run on every rank (imported by name in the rank processes)."""

from __future__ import annotations

import io
import pickle

import torch
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

import thinwire
from thinwire.state import SyncState
from thinwire.topology import Topology

from reference import gradient


def sync_steps(rank, world, ranks_per_node, algorithm, density, lengths, steps, wire=None,
               momentum=0.0, options=None):
    """synchronize() on float64 parameters, one bucket per parameter, for several steps."""
    topo = Topology.build(ranks_per_node)
    state = SyncState(topo, algorithm, density, selector="exact", wire=wire, dense_below_bytes=0,
                      momentum_correction=momentum, algorithm_options=options)
    params = [nn.Parameter(torch.zeros(n, dtype=torch.float64)) for n in lengths]
    out = []
    for step in range(steps):
        g = gradient(rank, step, sum(lengths))
        for p, piece in zip(params, g.split(lengths)):
            p.grad = piece.clone()
        thinwire.synchronize(params, state, bucket_bytes=1)
        out.append([p.grad.clone() for p in params])
    return {"grads": out, "last_step": state.last_step, "feedback": state.feedback.state_dict(),
            "topology": (topo.nodes, topo.node, topo.local_rank),
            "algorithm_state": state.state_dict()["algorithm_state"]}


def sync_many(rank, world, ranks_per_node, configs, lengths, steps):
    """sync_steps for several (name, algorithm, density, wire[, momentum[, options]])
    configurations in one launch."""
    return {name: sync_steps(rank, world, ranks_per_node, algorithm, density, lengths, steps, wire,
                             *rest)
            for name, algorithm, density, wire, *rest in configs}


def _model(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 5)).double()


def _batch(rank, step):
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(16, 20, generator=g, dtype=torch.float64), \
        torch.randint(0, 5, (16,), generator=g)


def _train(ddp, steps, start=0, opt=None):
    opt = opt or torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
    grads = []
    for step in range(start, start + steps):
        x, y = _batch(torch.distributed.get_rank(), step)
        opt.zero_grad()
        nn.functional.cross_entropy(ddp(x), y).backward()
        grads.append([p.grad.clone() for p in ddp.parameters()])
        opt.step()
    return grads, opt


def ddp_equivalence(rank, world, ranks_per_node, variants):
    """Gradients of DDP's default against thinwire's hooks, same model and data."""
    out = {}
    for name, kwargs in [("ddp", None)] + list(variants):
        ddp = DDP(_model(), bucket_cap_mb=0.01)  # several buckets
        if kwargs is not None:
            thinwire.ddp.register(ddp, ranks_per_node=ranks_per_node, selector="exact", **kwargs)
        out[name] = _train(ddp, 3)[0]
    return out


def momentum_in_hook(rank, world, ranks_per_node):
    """Momentum SGD with weight decay (DDP's default hook) against momentum and weight decay
    applied in thinwire's hook (dense warm-up steps) with a plain SGD: final parameters."""
    out = {}
    wd = 0.01
    for name in ("optimizer", "hook"):
        ddp = DDP(_model(), bucket_cap_mb=0.01)
        if name == "hook":
            thinwire.ddp.register(ddp, algorithm="hitopk", density=0.01, selector="exact",
                                  ranks_per_node=ranks_per_node, dense_iterations=100,
                                  momentum_correction=0.9, weight_decay=wd)
            opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
        else:
            opt = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9, weight_decay=wd)
        _train(ddp, 4, opt=opt)
        out[name] = [p.detach().clone() for p in ddp.parameters()]
    return out


def warmup_velocity_handoff(rank, world, ranks_per_node):
    """hitopk with momentum correction after 2 dense warm-up steps, on a model whose gradient
    is the same constant c on every rank and step (loss = sum of a linear map of a fixed x):
    the velocity after the first sparse step is n (1 + m + m^2) c on the unsent entries."""
    torch.manual_seed(0)
    model = nn.Linear(50, 40).double()
    ddp = DDP(model)
    state = thinwire.ddp.register(ddp, algorithm="hitopk", density=0.01, selector="exact",
                                  ranks_per_node=ranks_per_node, dense_iterations=2,
                                  momentum_correction=0.5, dense_below_bytes=0)
    opt = torch.optim.SGD(ddp.parameters(), lr=1e-3)
    x = torch.linspace(-1, 1, 50, dtype=torch.float64)[None, :]
    for _ in range(3):
        opt.zero_grad()
        ddp(x).sum().backward()
        opt.step()
    # the gradient in canonical (model) order: the weight's rows are x, the bias's entries 1
    c = torch.cat([x.expand(40, 50).reshape(-1), torch.ones(40, dtype=torch.float64)])
    return {"velocities": {i: v.clone() for i, v in state.feedback.velocities.items()},
            "residuals": {i: r.clone() for i, r in state.feedback.residuals.items()},
            "c": c, "local_rank": rank % ranks_per_node}


def checkpoint_resume(rank, world, ranks_per_node):
    """Train 4 steps straight; and 2 steps, checkpoint, restore into fresh objects, 2 more."""
    kwargs = dict(algorithm="hitopk", density=0.1, selector="exact",
                  ranks_per_node=ranks_per_node, dense_below_bytes=0)
    ddp = DDP(_model(), bucket_cap_mb=0.01)
    state = thinwire.ddp.register(ddp, **kwargs)
    _, opt = _train(ddp, 2)
    blob = io.BytesIO()
    torch.save({"model": ddp.module.state_dict(), "opt": opt.state_dict(),
                "hook": state.state_dict()}, blob)
    pickled_state = pickle.dumps(state)
    residuals_before = state.feedback.state_dict()["residuals"]
    straight, _ = _train(ddp, 2, start=2, opt=opt)
    straight_params = [p.detach().clone() for p in ddp.parameters()]

    blob.seek(0)
    saved = torch.load(blob, weights_only=True)
    model = _model(seed=123)
    model.load_state_dict(saved["model"])
    ddp2 = DDP(model, bucket_cap_mb=0.01)
    topo = Topology.build(ranks_per_node)
    restored = pickle.loads(pickled_state)
    thinwire.ddp.register(ddp2, state=restored, topology=topo)
    also = SyncState(None, "hitopk", 0.1, "exact")
    also.load_state_dict(saved["hook"])
    opt2 = torch.optim.SGD(ddp2.parameters(), lr=0.1, momentum=0.9)
    opt2.load_state_dict(saved["opt"])
    resumed, _ = _train(ddp2, 2, start=2, opt=opt2)
    return {"straight": straight, "resumed": resumed,
            "straight_params": straight_params,
            "resumed_params": [p.detach().clone() for p in ddp2.parameters()],
            "residuals_before": residuals_before,
            "residuals_pickled": pickle.loads(pickled_state).feedback.state_dict()["residuals"],
            "residuals_state_dict": also.feedback.state_dict()["residuals"]}


def topology_mismatch(rank, world):
    claimed = 2 if rank == 0 else 4
    try:
        Topology.build(claimed)
    except ValueError as exc:
        return str(exc)
    return None


def second_registration(rank, world):
    ddp = DDP(_model())
    thinwire.ddp.register(ddp, algorithm="allreduce", ranks_per_node=1)
    try:
        thinwire.ddp.register(ddp, algorithm="allreduce", ranks_per_node=1)
    except RuntimeError as exc:
        return str(exc)
    return None


def synchronize_equals_hook(rank, world, ranks_per_node, settings, steps=4):
    """The same SyncState settings through the DDP hook and through synchronize(), one bucket
    each (the model is below DDP's first-bucket size): final parameters of both."""
    out = {}
    for path in ("hook", "synchronize"):
        model = _model()
        topo = Topology.build(ranks_per_node)
        if path == "hook":
            ddp = DDP(model, bucket_cap_mb=25)
            thinwire.ddp.register(ddp, topology=topo, **settings)
            forward = ddp
        else:
            state = SyncState(topo, **settings)
            forward = model
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for step in range(steps):
            x, y = _batch(rank, step)
            opt.zero_grad()
            nn.functional.cross_entropy(forward(x), y).backward()
            if path == "synchronize":
                thinwire.synchronize(model.parameters(), state, bucket_bytes=25 * 2**20)
            opt.step()
        out[path] = [p.detach().clone() for p in model.parameters()]
    return out


def sync_with_settings(rank, world, ranks_per_node, algorithm, lengths, steps, settings):
    """sync_steps with any further SyncState settings (e.g. the density warm-up); also returns
    the density each step selected at."""
    topo = Topology.build(ranks_per_node)
    state = SyncState(topo, algorithm, selector="exact", dense_below_bytes=0, **settings)
    params = [nn.Parameter(torch.zeros(n, dtype=torch.float64)) for n in lengths]
    out, densities = [], []
    for step in range(steps):
        densities.append(state.density_at(state.steps))
        g = gradient(rank, step, sum(lengths))
        for p, piece in zip(params, g.split(lengths)):
            p.grad = piece.clone()
        thinwire.synchronize(params, state, bucket_bytes=1)
        out.append([p.grad.clone() for p in params])
    return {"grads": out, "densities": densities, "feedback": state.feedback.state_dict(),
            "topology": (topo.nodes, topo.node, topo.local_rank), "last_step": state.last_step}


def sync_settings_many(rank, world, ranks_per_node, configs, lengths, steps):
    """sync_with_settings for several (name, algorithm, settings) in one launch."""
    return {name: sync_with_settings(rank, world, ranks_per_node, algorithm, lengths, steps,
                                     settings)
            for name, algorithm, settings in configs}


def reduce_keeps_input(rank, world, ranks_per_node, algorithms, densities, lengths):
    """For each algorithm and density: whether ``state.reduce`` left the tensor it was given
    as it was (callers reuse it: benchmarks, DiLoCo's outer exchange, synchronize's copy)."""
    topo = Topology.build(ranks_per_node)
    out = {}
    for algorithm in algorithms:
        for density in densities:
            state = SyncState(topo, algorithm, density, selector="exact", dense_below_bytes=0)
            kept = []
            for index, n in enumerate(lengths):
                flat = gradient(rank, index, n).to(torch.float32)
                before = flat.clone()
                state.reduce(index, flat)
                kept.append(torch.equal(flat, before))
            state.end_step()
            out[(algorithm, density)] = kept
    return out


def small_bucket_sync(rank, world, ranks_per_node, algorithms, length):
    """One bucket of ``length`` float64 elements (under the default dense_below_bytes) through
    each sparse algorithm at density 0.01: SyncState all-reduces it densely, whichever."""
    topo = Topology.build(ranks_per_node)
    out = {}
    for algorithm in algorithms:
        state = SyncState(topo, algorithm, 0.01, selector="exact")
        p = nn.Parameter(torch.zeros(length, dtype=torch.float64))
        p.grad = gradient(rank, 0, length).clone()
        thinwire.synchronize([p], state)
        out[algorithm] = (p.grad.clone(), dict(state.last_step))
    return out
