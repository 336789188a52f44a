"""The baselines DES is measured against, on the same model, data and byte counters.

* `ParameterServer`: synchronous PS with the servers co-located on the ranks (server k holds
  the rows with ``owner_of(id) == k``). Per step a worker pulls the rows of its batch's unique
  ids (ids out, rows back), computes everything locally, and pushes one gradient row per pulled
  row (the server remembers the order of the pull, so no ids travel with the push); the server
  sums the pushes of all workers and applies the sparse optimizer.
* TorchRec-style sharding, built on the DES machinery (`OwnerComputeHead`) with other routes:
  ``table`` (table-wise: field f on rank ``f mod N``; ids all-to-all, pooled embeddings of every
  (sample, field) of the owner's fields back, their gradients the same way) and ``row``
  (row-wise: rows by hash; every owner returns a dense ``[B*F, P]`` block per rank, i.e. a
  reduce-scatter of pooled embeddings, and receives the dense gradient block of every rank).
"""

from __future__ import annotations

import torch

from thinwire.recsys.comm import ByteCounter, Comm, id_dtype
from thinwire.recsys.data import Batch
from thinwire.recsys.models import RecModel, bce_loss, check_fields, segments
from thinwire.recsys.sharded import EmbeddingShard, SparseOptimizer, check_ids, owner_of


class ParameterServer:
    def __init__(self, model: RecModel, shard: EmbeddingShard, sparse_opt: SparseOptimizer,
                 dense_opt: torch.optim.Optimizer, comm: Comm, num_rows: int | None):
        if model.row_dim != shard.dim:
            raise ValueError(f"shard dim {shard.dim} does not match the model's row dim "
                             f"{model.row_dim}")
        self.model, self.shard, self.comm = model, shard, comm
        self.sparse_opt, self.dense_opt, self.num_rows = sparse_opt, dense_opt, num_rows
        self.id_dtype = id_dtype(num_rows)
        self.last_row_grad: tuple[torch.Tensor, torch.Tensor] | None = None

    @property
    def counter(self) -> ByteCounter:
        return self.comm.counter

    def _pull(self, batch: Batch):
        check_fields(batch, self.model)
        check_ids(batch.ids, self.num_rows, "batch.ids")
        unique, inverse = torch.unique(batch.ids, return_inverse=True)
        dest = owner_of(unique, self.comm.world)
        order = torch.argsort(dest, stable=True)
        position = torch.empty_like(order)
        position[order] = torch.arange(len(order))
        n = torch.bincount(dest, minlength=self.comm.world)
        recv = self.comm.counts(n, "ids")
        asked = self.comm.alltoallv(unique[order].to(self.id_dtype), n.tolist(), recv.tolist(),
                                    "ids").long()
        index = self.shard.lookup(asked)  # server side
        pulled = self.comm.alltoallv(self.shard.rows[index], recv.tolist(), n.tolist(), "rows")
        return pulled, position[inverse], index, asked, n, recv

    def forward(self, batch: Batch, train: bool = True):
        pulled, entry_row, index, asked, n, recv = self._pull(batch)
        pulled.requires_grad_(train)
        with torch.set_grad_enabled(train):
            seg, count = segments(batch, self.model)
            p = self.model.partial(pulled[entry_row], batch.values, seg, count)
            if self.model.level == "bag":
                p = p.view(batch.batch_size, batch.num_fields, -1)
            logits = self.model.combine(p)
        return logits, (pulled, index, asked, n, recv)

    def train_step(self, batch: Batch, global_batch: int) -> tuple[torch.Tensor, float]:
        self.dense_opt.zero_grad()
        logits, (pulled, index, asked, n, recv) = self.forward(batch, train=True)
        loss = bce_loss(logits, batch.labels, global_batch)
        loss.backward()
        grad = pulled.grad if pulled.grad is not None else torch.zeros_like(pulled)
        pushed = self.comm.alltoallv(grad, n.tolist(), recv.tolist(), "row_grads")
        self.last_row_grad = (asked, pushed)
        self.sparse_opt.step_shard(self.shard, index, pushed)  # server side
        self.comm.allreduce_grads(self.model.dense, "dense")
        self.dense_opt.step()
        return logits.detach(), float(loss.detach())

    @torch.no_grad()
    def predict(self, batch: Batch) -> torch.Tensor:
        return self.forward(batch, train=False)[0]


METHODS = ("des", "ps", "torchrec_tw", "torchrec_rw")


def make_method(method: str, model: RecModel, comm: Comm, num_rows: int | None,
                optimizer: str = "adagrad", lr: float = 0.05, dense_lr: float | None = None,
                seed: int = 0, init_scale: float = 0.01, dynamic: bool = False):
    """A ready-to-train method for this rank: DES or one of the baselines, own shard included.

    ``dynamic`` stores rows created on first use (ids still checked against num_rows when it
    is given); the table-wise baseline always does (its rows are grouped by field)."""
    from thinwire.recsys.des import OwnerComputeHead
    from thinwire.recsys.models import dense_optimizer

    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    table_wise = method == "torchrec_tw"
    shard = EmbeddingShard(model.row_dim, comm.rank, comm.world,
                           None if (dynamic or table_wise) else num_rows, seed, init_scale,
                           model.dtype, check_owner=not table_wise)
    sparse = SparseOptimizer(optimizer, lr)
    dense = dense_optimizer(model, optimizer, dense_lr or lr)
    if method == "ps":
        return ParameterServer(model, shard, sparse, dense, comm, num_rows)
    route = {"des": "des", "torchrec_tw": "table", "torchrec_rw": "row"}[method]
    return OwnerComputeHead(model, shard, sparse, dense, comm, num_rows, route)
