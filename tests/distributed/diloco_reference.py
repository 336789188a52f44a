"""DiLoCo in one process, float64: what the distributed DiLoCo must equal.

Every node is one model; its gradient is the mean over its ranks' batches (what DDP inside the
node gives), its inner optimizer a torch AdamW. Every ``sync_every`` steps (per fragment, at the
documented phase) the pseudo-gradients ``anchor - parameters`` are averaged over nodes, the
anchor takes an outer SGD step with (Nesterov) momentum, and the parameters restart from it;
with ``delay > 0`` the average computed at launch is applied ``delay`` steps later and the
parameters become ``local_weight * local + (1 - local_weight) * anchor``. Written with plain
loops over parameters, independent of thinwire's implementation except the fragment split and
phase rule (tested on their own).
"""

from __future__ import annotations

import torch
import torch.nn as nn

from thinwire.local_sgd.fragments import phase, split

IN, HIDDEN, OUT, BATCH = 6, 8, 3, 5


def make_model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(IN, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, OUT)).double()


def batch(rank: int, step: int):
    g = torch.Generator().manual_seed(7919 * step + rank)
    return (torch.randn(BATCH, IN, generator=g, dtype=torch.float64),
            torch.randn(BATCH, OUT, generator=g, dtype=torch.float64))


def loss_of(model, rank, step):
    x, y = batch(rank, step)
    return ((model(x) - y) ** 2).mean()


def inner_optimizer(params):
    return torch.optim.AdamW(params, lr=0.01, weight_decay=0.01)


def reference(nodes: int, ranks_per_node: int, steps: int, sync_every: int, outer_lr: float,
              outer_momentum: float, nesterov: bool = True, fragments: int = 1, delay: int = 0,
              local_weight: float = 0.5) -> list[torch.Tensor]:
    """The parameters of node 0 after ``steps`` inner steps (every node's are returned as a
    list of per-node lists by :func:`reference_all`)."""
    return reference_all(nodes, ranks_per_node, steps, sync_every, outer_lr, outer_momentum,
                         nesterov, fragments, delay, local_weight)[0]


def reference_all(nodes, n, steps, sync_every, outer_lr, outer_momentum, nesterov=True,
                  fragments=1, delay=0, local_weight=0.5, sparse=None):
    """``sparse``: dict(density, chunk, bits, decay): the SparseLoCo-style exchange (see
    :func:`_sparse_average`) instead of the exact average."""
    models = [make_model() for _ in range(nodes)]
    opts = [inner_optimizer(list(m.parameters())) for m in models]
    params = [list(m.parameters()) for m in models]
    anchor = [p.detach().clone() for p in params[0]]
    velocity = [torch.zeros_like(a) for a in anchor]
    runs = split(params[0], fragments)
    in_flight = {}  # fragment -> (apply step, averaged pseudo-gradient per parameter index)
    residuals = {}  # sparse: (fragment, node, local rank) -> that shard's kept-back part
    for step in range(steps):
        for node in range(nodes):
            model, opt = models[node], opts[node]
            grads = [torch.zeros_like(p) for p in params[node]]
            for local in range(n):
                model.zero_grad()
                loss_of(model, node * n + local, step).backward()
                for g, p in zip(grads, params[node]):
                    g += p.grad / n
            for g, p in zip(grads, params[node]):
                p.grad = g
            opt.step()
        done = step + 1
        for f in sorted(in_flight):
            due, average = in_flight[f]
            if due == done:
                del in_flight[f]
                _outer(f, average, runs, anchor, velocity, params, outer_lr, outer_momentum,
                       nesterov, mix=delay > 0, local_weight=local_weight)
        for f in range(len(runs)):
            if done % sync_every == phase(f, len(runs), sync_every):
                if sparse is None:
                    average = {i: sum(anchor[i] - params[node][i].detach()
                                      for node in range(nodes)) / nodes for i in runs[f]}
                else:
                    average = _sparse_average(f, runs[f], anchor, params, n, residuals,
                                              **sparse)
                if delay == 0:
                    _outer(f, average, runs, anchor, velocity, params, outer_lr,
                           outer_momentum, nesterov, mix=False, local_weight=local_weight)
                else:
                    in_flight[f] = (done + delay, average)
    for f in sorted(in_flight):  # DiLoCo.flush() at the end of training: apply what is in flight
        _outer(f, in_flight[f][1], runs, anchor, velocity, params, outer_lr, outer_momentum,
               nesterov, mix=True, local_weight=local_weight)
    return [[p.detach().clone() for p in node_params] for node_params in params]


def _outer(f, average, runs, anchor, velocity, params, lr, m, nesterov, mix, local_weight):
    with torch.no_grad():
        for i in runs[f]:
            velocity[i] = m * velocity[i] + average[i]
            update = average[i] + m * velocity[i] if nesterov else velocity[i]
            anchor[i] = anchor[i] - lr * update
            for node_params in params:
                p = node_params[i]
                p.copy_(local_weight * p + (1 - local_weight) * anchor[i] if mix else anchor[i])


def _chunk_topk(e, density, chunk, bits):
    """What one rank sends of ``e``: per chunk of ``chunk`` elements the k = round(density *
    chunk) (at least 1) largest magnitudes; their values rounded to float32, or quantised to a
    sign and magnitude level j * scale / L (j = 1..L, L = 2**(bits-1), nearest, scale = the
    chunk's largest selected magnitude in float32)."""
    k = max(1, min(chunk, round(density * chunk)))
    sent = torch.zeros_like(e)
    for start in range(0, e.numel(), chunk):
        part = e[start:start + chunk]
        order = sorted(range(part.numel()), key=lambda i: -abs(float(part[i])))[:k]
        if bits is None:
            for i in order:
                sent[start + i] = float(torch.tensor(float(part[i]), dtype=torch.float32))
            continue
        levels = 2 ** (bits - 1)
        scale = float(torch.tensor(max(abs(float(part[i])) for i in order),
                                   dtype=torch.float32))
        for i in order:
            level = 1.0
            if scale > 0:
                level = min(max(float(torch.tensor(abs(float(part[i])) / scale * levels)
                                      .round()), 1.0), float(levels))
            sent[start + i] = (1 if float(part[i]) >= 0 else -1) * level * scale / levels
    return sent


def _sparse_average(f, members, anchor, params, n, residuals, density, chunk, bits, decay):
    """Every node's pseudo-gradient of fragment ``f`` as one flat vector (in bucket order, the
    reverse of the model's, as DDP orders buckets), zero-padded to n equal shards; local rank j
    of every node compresses shard j with its own decayed residual; the average over nodes of
    what was sent."""
    nodes = len(params)
    members = list(reversed(members))
    total = None
    for node in range(nodes):
        flat = torch.cat([(anchor[i] - params[node][i].detach()).reshape(-1) for i in members])
        size = -(-flat.numel() // n)
        full = torch.zeros(size * n, dtype=flat.dtype)
        full[:flat.numel()] = flat
        sent = torch.zeros_like(full)
        for local in range(n):
            key = (f, node, local)
            e = full[local * size:(local + 1) * size].clone()
            if key in residuals:
                e = decay * residuals[key] + e
            part = _chunk_topk(e, density, chunk, bits)
            residuals[key] = e - part
            sent[local * size:(local + 1) * size] = part
        total = sent if total is None else total + sent
    average, offset = {}, 0
    for i in members:
        numel = anchor[i].numel()
        average[i] = (total[offset:offset + numel] / nodes).view_as(anchor[i])
        offset += numel
    return average
