"""Bytes each method sends per step, from the batches alone (the formulas the counters obey).

For rank r of N with batch b_r: ``n_rk`` entries of b_r owned by k, ``s_rk`` segments of b_r
sent to k, ``u_rk`` unique ids of b_r owned by k; I, V, F bytes per id, value and float; P the
partial width, D the row width; only k != r counts (nothing else leaves the rank).

* DES:             ids  = 40 (N-1) + sum_k (min(u_rk I + n_rk w(u_rk - 1), n_rk I) + s_rk w(l_rk))
                          [+ n_rk V with values]
  with l_rk the most entries in one segment sent to k and w(x) = 1, 2 or 4 bytes for x < 2^8,
  < 2^15, else (thinwire.recsys.routing: distinct ids once with entries as narrow indices, or
  every id where that is smaller);
* TorchRec:        ids  = 40 (N-1) + sum_k (n_rk I + 4 s_rk) [+ n_rk V with values]
* DES / TorchRec:  partials = sum_j s_jr P F;  partial_grads = sum_k s_rk P F
  with s_rk = touched segments (DES), bags of k's fields (table-wise), all B F bags (row-wise);
* PS:              ids  = 8 (N-1) + sum_k u_rk I;  rows = sum_j u_jr D F;  row_grads = sum_k u_rk D F
* all:             dense = 2 (N-1)/N * (dense parameters) F  (ring allreduce of dense gradients)
"""

from __future__ import annotations

import torch

from thinwire.recsys.comm import id_dtype
from thinwire.recsys.data import Batch
from thinwire.recsys.models import RecModel, segments
from thinwire.recsys.sharded import owner_of


def _width(max_value: int) -> int:
    """Bytes of an index or length field holding max_value."""
    return 1 if max_value < 2**8 else 2 if max_value < 2**15 else 4


def _counts(method: str, model: RecModel, batch: Batch, world: int):
    """Per owner k: entries n_k, segments s_k, unique ids u_k, longest segment l_k (DES) for
    one rank's batch."""
    fields = batch.num_fields
    bag = batch.bag_of_entry()
    dest = owner_of(batch.ids, world)
    n = torch.bincount(dest, minlength=world)
    unique = torch.unique(batch.ids)
    u = torch.bincount(owner_of(unique, world), minlength=world)
    longest = torch.zeros(world, dtype=torch.int64)
    if method == "des":
        seg, count = segments(batch, model)
        per_key = torch.bincount(dest * count + seg, minlength=world * count)
        s = (per_key.view(world, count) > 0).sum(1)
        longest = per_key.view(world, count).max(1).values
    elif method == "torchrec_tw":
        dest = (bag % fields) % world
        n = torch.bincount(dest, minlength=world)
        field_owner = torch.arange(fields) % world
        s = torch.bincount(field_owner, minlength=world) * batch.batch_size
    else:
        s = torch.full((world,), batch.batch_size * fields)
    return n, s, u, longest


def expected_bytes(method: str, model: RecModel, batches: list[Batch],
                   num_rows: int | None) -> list[dict[str, float]]:
    """Per rank, per tag: the bytes one training step sends off the rank."""
    world = len(batches)
    fb = torch.finfo(model.dtype).bits // 8
    ib = 4 if id_dtype(num_rows) == torch.int32 else 8
    dense = sum(p.numel() for p in model.dense.parameters()) * fb * 2 * (world - 1) / world
    counts = [_counts(method, model, b, world) for b in batches]
    out = []
    for r, batch in enumerate(batches):
        n, s, u, longest = counts[r]
        remote = torch.ones(world, dtype=torch.bool)
        remote[r] = False
        if world == 1:
            out.append({})
            continue
        row = {"dense": dense}
        if method == "ps":
            row["ids"] = 8 * (world - 1) + int(u[remote].sum()) * ib
            row["rows"] = sum(int(counts[j][2][r]) for j in range(world) if j != r) * \
                model.row_dim * fb
            row["row_grads"] = int(u[remote].sum()) * model.row_dim * fb
        else:
            vb = 0 if batch.values is None else batch.values.element_size()
            if method == "des":
                routed = sum(min(int(u[k]) * ib + int(n[k]) * _width(int(u[k]) - 1),
                                 int(n[k]) * ib) + int(s[k]) * _width(int(longest[k]))
                             for k in range(world) if k != r)
            else:
                routed = int(n[remote].sum()) * ib + int(s[remote].sum()) * 4
            row["ids"] = 40 * (world - 1) + routed + int(n[remote].sum()) * vb
            row["partials"] = sum(int(counts[j][1][r]) for j in range(world) if j != r) * \
                model.partial_dim * fb
            row["partial_grads"] = int(s[remote].sum()) * model.partial_dim * fb
        out.append(row)
    return out
