"""DES execution: owners compute partial results with their own rows; partials travel, rows never.

One training step on rank r (every rank runs the same code, on its own samples):

1. *route* - each entry (id, x) of r's batch goes to ``owner_of(id)``, grouped into the
   segments (samples for LR/FM, (sample, field) bags for W&D/DeepFM) that the owner touches:
   each distinct id once, a narrow index per entry, one length per touched segment
   (thinwire.recsys.routing; the owner never learns sample numbers);
2. *partial* - the owner gathers its rows and computes ``model.partial`` per received segment
   (autograd on), and returns one partial row per segment, in the order received;
3. *aggregate* - r adds each owner's partials into its segments (sparse: only the segments that
   owner touched travel), reshapes to ``[B, P]`` or ``[B, F, P]`` and runs ``model.combine``
   (bias, FM interaction, MLP) locally;
4. *backward* - ``loss.backward()`` stops at the received partials; their gradients go back to
   the owners (same splits, reversed), which finish the backward pass through their partial and
   update the touched rows with the sparse optimizer. Dense gradients are summed over ranks.

The same machinery with other segment lists gives the TorchRec-style baselines
(thinwire.recsys.baselines): table-wise (owner = field, every bag of the owner's fields) and
row-wise (owner = hash, every bag of the batch, i.e. a dense reduce-scatter forward and a dense
all-gather backward).
"""

from __future__ import annotations

import torch

from thinwire.recsys.comm import ByteCounter, Comm, id_dtype
from thinwire.recsys.data import Batch
from thinwire.recsys.models import RecModel, bce_loss, check_fields, segments
from thinwire.recsys.routing import Received, block_bytes, decode, encode
from thinwire.recsys.sharded import EmbeddingShard, SparseOptimizer, check_ids, owner_of

ROUTES = ("des", "table", "row")


class OwnerComputeHead:
    """The sparse part of `model` for one rank, computed where the rows live."""

    def __init__(self, model: RecModel, shard: EmbeddingShard, sparse_opt: SparseOptimizer,
                 dense_opt: torch.optim.Optimizer, comm: Comm, num_rows: int | None,
                 route: str = "des"):
        if route not in ROUTES:
            raise ValueError(f"route must be one of {ROUTES}, got {route!r}")
        if model.row_dim != shard.dim:
            raise ValueError(f"shard dim {shard.dim} does not match the model's row dim "
                             f"{model.row_dim}")
        self.model, self.shard, self.comm, self.route = model, shard, comm, route
        self.sparse_opt, self.dense_opt, self.num_rows = sparse_opt, dense_opt, num_rows
        self.id_dtype = id_dtype(num_rows)
        self._saved: dict = {}
        self.last_row_grad: tuple[torch.Tensor, torch.Tensor] | None = None

    @property
    def counter(self) -> ByteCounter:
        return self.comm.counter

    # -- requester side ------------------------------------------------------------------
    def _plan(self, batch: Batch):
        """Per entry: its segment and owner; the segments sent to each owner, in owner order,
        with their entry counts."""
        world, fields = self.comm.world, batch.num_fields
        if self.route == "des":
            seg, count = segments(batch, self.model)
            dest = owner_of(batch.ids, world)
        else:
            seg, count = batch.bag_of_entry(), batch.batch_size * fields
            dest = (seg % fields) % world if self.route == "table" else \
                owner_of(batch.ids, world)
        key = dest * count + seg
        per_key = torch.bincount(key, minlength=world * count)
        if self.route == "des":  # only the segments an owner touched
            target_keys = per_key.nonzero().squeeze(1)
        elif self.route == "table":  # every bag of the owner's fields
            bags = torch.arange(count)
            target_keys = torch.cat([k * count + bags[(bags % fields) % world == k]
                                     for k in range(world)])
        else:  # every bag of the batch, from every owner: dense
            target_keys = (torch.arange(world)[:, None] * count +
                           torch.arange(count)[None, :]).reshape(-1)
        sent = torch.bincount(target_keys // count, minlength=world)
        return key, count, dest, target_keys % count, per_key[target_keys], sent

    def forward(self, batch: Batch, train: bool = True) -> torch.Tensor:
        """Logits of this rank's samples (collective: every rank calls it)."""
        check_fields(batch, self.model)
        check_ids(batch.ids, self.num_rows, "batch.ids")
        world = self.comm.world
        key, count, dest, targets, lengths, s = self._plan(batch)
        order = torch.argsort(key, stable=True)
        stream, header = encode(batch.ids[order], dest[order], lengths, s, world,
                                self.id_dtype, dedup=self.route == "des", rank=self.comm.rank)
        recv_header = self.comm.counts(header, "ids")
        id_bytes = torch.empty((), dtype=self.id_dtype).element_size()
        ints = self.comm.alltoallv(stream, block_bytes(header, id_bytes).tolist(),
                                   block_bytes(recv_header, id_bytes).tolist(), "ids")
        values = None
        if batch.values is not None:
            values = self.comm.alltoallv(batch.values[order], header[:, 0].tolist(),
                                         recv_header[:, 0].tolist(), "ids")
        partial = self._owner_partial(decode(ints, recv_header, self.id_dtype), values, train)
        received = self.comm.alltoallv(partial.detach(), recv_header[:, 1].tolist(), s.tolist(),
                                       "partials")
        received.requires_grad_(train)
        full = torch.zeros(count, self.model.partial_dim, dtype=received.dtype)
        full = full.index_add(0, targets, received)
        if self.route == "des" and self.model.level == "sample":
            p = full
        else:
            p = self.model.to_level(full, batch.batch_size)
        if train:
            self._saved.update(received=received, send_back=s.tolist(), partial=partial,
                               recv_back=recv_header[:, 1].tolist())
        return self.model.combine(p)

    # -- owner side ----------------------------------------------------------------------
    def _owner_partial(self, got: Received, values: torch.Tensor | None,
                       train: bool) -> torch.Tensor:
        index = self.shard.lookup(got.ids)
        rows = self.shard.rows[index]  # each distinct id once; entries gather from here
        with torch.set_grad_enabled(train):
            rows.requires_grad_(train)
            partial = self.model.partial(rows[got.entry_row], values, got.entry_segment,
                                         got.num_segments)
        if train:
            self._saved.update(rows=rows, index=index, ids=got.ids)
        return partial

    # -- a training step ----------------------------------------------------------------
    def train_step(self, batch: Batch, global_batch: int) -> tuple[torch.Tensor, float]:
        """Forward, backward, sparse update on the owners, dense update everywhere."""
        self.dense_opt.zero_grad()
        logits = self.forward(batch, train=True)
        loss = bce_loss(logits, batch.labels, global_batch)
        loss.backward()
        saved, self._saved = self._saved, {}
        grad = saved["received"].grad
        if grad is None:
            grad = torch.zeros_like(saved["received"])
        back = self.comm.alltoallv(grad, saved["send_back"], saved["recv_back"],
                                   "partial_grads")
        saved["partial"].backward(back)
        row_grad = saved["rows"].grad
        if row_grad is None:
            row_grad = torch.zeros_like(saved["rows"])
        self.last_row_grad = (saved["ids"], row_grad)
        # the owner looked each distinct id up once, so no row repeats
        self.sparse_opt.step_shard(self.shard, saved["index"], row_grad, distinct=True)
        self.comm.allreduce_grads(self.model.dense, "dense")
        self.dense_opt.step()
        return logits.detach(), float(loss.detach())

    @torch.no_grad()
    def predict(self, batch: Batch) -> torch.Tensor:
        return self.forward(batch, train=False)
