"""DiLoCo on every rank (imported by name in spawned processes): DDP inside the node, thinwire's
DiLoCo across nodes, the data of diloco_reference."""

from __future__ import annotations

import io

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from thinwire.collectives.hier_allreduce import padded
from thinwire.local_sgd import DiLoCo, node_group
from thinwire.topology import Topology

from diloco_reference import inner_optimizer, loss_of, make_model


def _setup(topo, group, config):
    model = DDP(make_model(), process_group=group)
    opt = inner_optimizer(model.parameters())
    config = dict(config)
    options = config.pop("sync_options", None)
    if options is None:  # the sparse ones compress every bucket, however small
        options = {} if config.get("algorithm") == "sparseloco" else {"dense_below_bytes": 0}
    diloco = DiLoCo(model, opt, topology=topo, sync_options=options, **config)
    return model, opt, diloco


def _inner_step(model, opt, diloco, step):
    opt.zero_grad()
    loss_of(model, dist.get_rank(), step).backward()
    opt.step()
    diloco.step()


def _params(model):
    return [p.detach().clone() for p in model.module.parameters()]


def run_configs(rank, world, ranks_per_node, configs, steps):
    """For every (name, DiLoCo keyword arguments): the parameters after ``steps`` inner steps
    and the SyncState's byte totals."""
    topo = Topology.build(ranks_per_node)
    group = node_group(topo)
    out = {}
    for name, config in configs:
        model, opt, diloco = _setup(topo, group, config)
        for step in range(steps):
            _inner_step(model, opt, diloco, step)
        diloco.flush()
        out[name] = {"params": _params(model), "totals": dict(diloco.state.totals),
                     "outer_steps": list(diloco.outer_steps)}
    return out


def resume(rank, world, ranks_per_node, config, steps, stop_at):
    """An uninterrupted run against one stopped after ``stop_at`` steps, checkpointed through
    torch.save / torch.load(weights_only=True) into a fresh model, optimizer and DiLoCo."""
    topo = Topology.build(ranks_per_node)
    group = node_group(topo)
    model, opt, diloco = _setup(topo, group, config)
    for step in range(steps):
        _inner_step(model, opt, diloco, step)
    diloco.flush()
    straight = _params(model)

    model, opt, diloco = _setup(topo, group, config)
    for step in range(stop_at):
        _inner_step(model, opt, diloco, step)
    buffer = io.BytesIO()
    torch.save({"model": model.module.state_dict(), "opt": opt.state_dict(),
                "diloco": diloco.state_dict()}, buffer)
    in_flight = len(diloco._pending)
    del model, opt, diloco
    buffer.seek(0)
    saved = torch.load(buffer, weights_only=True)
    model, opt, diloco = _setup(topo, group, config)
    model.module.load_state_dict(saved["model"])
    opt.load_state_dict(saved["opt"])
    diloco.load_state_dict(saved["diloco"])
    for step in range(stop_at, steps):
        _inner_step(model, opt, diloco, step)
    diloco.flush()
    return {"straight": straight, "resumed": _params(model), "in_flight_at_save": in_flight,
            "residuals": len(saved["diloco"]["sync"]["feedback"]["residuals"])}


def mass(rank, world, ranks_per_node, config, steps):
    """Over every outer step of a compressed local-SGD run (outer_lr 1, momentum 0, so the
    average is anchor before - anchor after): W * average + the change of every rank's residual
    (each on its shard) equals the sum over ranks of the pseudo-gradient. Returns the largest
    deviation and how much was kept back."""
    topo = Topology.build(ranks_per_node)
    group = node_group(topo)
    model, opt, diloco = _setup(topo, group, config)
    n, worst, kept, checked = topo.ranks_per_node, 0.0, 0.0, 0
    for step in range(steps):
        if (step + 1) % diloco.sync_every:
            _inner_step(model, opt, diloco, step)
            continue
        opt.zero_grad()
        loss_of(model, rank, step).backward()
        opt.step()
        params = list(model.module.parameters())
        anchor_before = torch.cat([a.reshape(-1) for a in diloco.anchor])
        pseudo = anchor_before - torch.cat([p.detach().reshape(-1) for p in params])
        before = _residual_on_shard(diloco, n, topo.local_rank, pseudo.numel())
        diloco.step()
        after = _residual_on_shard(diloco, n, topo.local_rank, pseudo.numel())
        average = anchor_before - torch.cat([a.reshape(-1) for a in diloco.anchor])
        total_pseudo, change = pseudo.clone(), after - before
        dist.all_reduce(total_pseudo)
        dist.all_reduce(change)
        lhs = world * average + change[:pseudo.numel()]
        worst = max(worst, float((lhs - total_pseudo).abs().max()))
        kept = max(kept, float(after.abs().max()))
        checked += 1
    return {"worst": worst, "kept": kept, "checked": checked}


def _residual_on_shard(diloco, n, local_rank, numel):
    """This rank's residual (of the single bucket: reversed parameter order, as buckets() lays
    it out) placed at its shard of the padded flat, in model.parameters() order."""
    (bucket, members), = diloco.buckets[0]
    full = torch.zeros(padded(torch.zeros(numel), n).numel(), dtype=torch.float64)
    residual = diloco.state.feedback.residuals.get(bucket)
    if residual is not None:
        shard = full.numel() // n
        full[local_rank * shard:(local_rank + 1) * shard] = residual
    # bucket order -> parameter order
    sizes = [diloco.params[i].numel() for i in members]
    pieces = dict(zip(members, full[:numel].split(sizes)))
    ordered = torch.cat([pieces[i] for i in range(len(diloco.params))])
    return torch.cat([ordered, full[numel:]])


def diverged(rank, world, ranks_per_node, bad_rank, bad_step, steps):
    """Rank ``bad_rank``'s parameters turn NaN at inner step ``bad_step``: what each rank's
    DiLoCo raises, and at which inner step."""
    topo = Topology.build(ranks_per_node)
    model, opt, diloco = _setup(topo, node_group(topo), dict(sync_every=4,
                                                             algorithm="hier_allreduce"))
    for step in range(steps):
        if step == bad_step and rank == bad_rank:
            with torch.no_grad():
                next(model.module.parameters()).fill_(float("nan"))
        try:  # the node's DDP spreads the NaN to its other rank's gradients
            _inner_step(model, opt, diloco, step)
        except FloatingPointError as exc:
            return {"step": step + 1, "error": str(exc)}
    return {"step": None, "error": None}
