"""LR, FM, Wide&Deep and DeepFM, each split the DES way: a *partial* computed from rows alone and
a *combine* computed locally from the summed partials.

Every model reads one table whose row for feature i is ``[w_i, v_i]`` (``w_i`` the linear weight,
``v_i`` a K-dim embedding; LR has K = 0). The partial of a *segment* (a set of entries, each a
row and a value x) is additive over any split of the segment's entries, so the sum of partials
computed by the owners of disjoint pieces equals the partial of the whole:

=========  ======  ===========================================  =====================
model      level   partial per segment                          width
=========  ======  ===========================================  =====================
LR         sample  sum x w                                      1
FM         sample  sum x w, sum x v, sum x^2 |v|^2               K + 2
W&D        bag     sum x w, sum x v  (bag = one sample's field)  K + 1
DeepFM     bag     sum x w, sum x v, sum x^2 |v|^2               K + 2
=========  ======  ===========================================  =====================

``combine`` gets ``[B, width]`` (sample level) or ``[B, F, width]`` (bag level). The dense part
(bias and MLP) is an ordinary module, trained data-parallel.
"""

from __future__ import annotations

import numbers

import torch
from torch import nn

from thinwire.recsys.data import Batch


class Dense(nn.Module):
    """The bias w0 and, for deep models, an MLP over the F pooled K-dim field embeddings."""

    def __init__(self, fields: int, k: int, hidden: tuple[int, ...], seed: int,
                 dtype: torch.dtype):
        super().__init__()
        gen = torch.Generator().manual_seed(seed)
        self.bias = nn.Parameter(torch.zeros(1, dtype=dtype))
        layers: list[nn.Module] = []
        width = fields * k
        for size in hidden:
            layer = nn.Linear(width, size, dtype=dtype)
            with torch.no_grad():
                bound = (6.0 / (width + size)) ** 0.5
                layer.weight.uniform_(-bound, bound, generator=gen)
                layer.bias.zero_()
            layers += [layer, nn.ReLU()]
            width = size
        if hidden:
            out = nn.Linear(width, 1, dtype=dtype)
            with torch.no_grad():
                out.weight.uniform_(-(1 / width) ** 0.5, (1 / width) ** 0.5, generator=gen)
                out.bias.zero_()
            layers.append(out)
        self.mlp = nn.Sequential(*layers) if layers else None


class RecModel:
    """One of MODELS; `partial` runs wherever the rows are, `combine` where the sample is."""

    name = ""
    level = "sample"
    deep = False
    fm = False

    def __init__(self, fields: int, k: int = 8, hidden: tuple[int, ...] = (64, 32),
                 seed: int = 0, dtype: torch.dtype = torch.float32):
        if fields < 1:
            raise ValueError(f"fields must be >= 1, got {fields}")
        if self.name != "lr" and k < 1:
            raise ValueError(f"k (embedding size) must be >= 1 for {self.name}, got {k}")
        self.fields, self.k, self.dtype = fields, (0 if self.name == "lr" else k), dtype
        self.dense = Dense(fields, self.k, tuple(hidden) if self.deep else (), seed, dtype)

    @property
    def row_dim(self) -> int:
        return 1 + self.k

    @property
    def partial_dim(self) -> int:
        return 1 + self.k + (1 if self.fm else 0)

    def partial(self, rows: torch.Tensor, values: torch.Tensor | None, segment: torch.Tensor,
                num_segments: int) -> torch.Tensor:
        """[num_segments, partial_dim]: the sums over each segment's entries."""
        x = torch.ones(len(rows), 1, dtype=rows.dtype) if values is None else \
            values.to(rows.dtype)[:, None]
        pieces = [rows * x]
        if self.fm:
            v = rows[:, 1:]
            pieces.append((v * v).sum(1, keepdim=True) * x * x)
        terms = torch.cat(pieces, 1) if len(pieces) > 1 else pieces[0]
        out = torch.zeros(num_segments, self.partial_dim, dtype=rows.dtype)
        return out.index_add(0, segment, terms)

    def combine(self, p: torch.Tensor) -> torch.Tensor:
        """Logits [B] from the summed partials ([B, P] or [B, F, P])."""
        k = self.k
        if self.level == "sample":
            logit = p[:, 0]
            if self.fm:
                u = p[:, 1:1 + k]
                logit = logit + 0.5 * ((u * u).sum(1) - p[:, 1 + k])
            return logit + self.dense.bias
        logit = p[:, :, 0].sum(1)
        e = p[:, :, 1:1 + k]
        if self.fm:
            u = e.sum(1)
            logit = logit + 0.5 * ((u * u).sum(1) - p[:, :, 1 + k].sum(1))
        logit = logit + self.dense.mlp(e.reshape(len(p), -1))[:, 0]
        return logit + self.dense.bias

    def to_level(self, bag_partials: torch.Tensor, batch_size: int) -> torch.Tensor:
        """Bag-level partials [B*F, P] in the shape `combine` takes."""
        p = bag_partials.view(batch_size, self.fields, -1)
        return p.sum(1) if self.level == "sample" else p


class LR(RecModel):
    name = "lr"


class FM(RecModel):
    name, fm = "fm", True


class WideDeep(RecModel):
    name, level, deep = "wide_deep", "bag", True


class DeepFM(RecModel):
    name, level, deep, fm = "deepfm", "bag", True, True


MODELS = {cls.name: cls for cls in (LR, FM, WideDeep, DeepFM)}


def make_model(name: str, fields: int, **kwargs) -> RecModel:
    if name not in MODELS:
        raise ValueError(f"model must be one of {sorted(MODELS)}, got {name!r}")
    return MODELS[name](fields, **kwargs)


def segments(batch: Batch, model: RecModel) -> tuple[torch.Tensor, int]:
    """Segment of every entry at the model's level (sample or bag), and the segment count."""
    bag = batch.bag_of_entry()
    if model.level == "sample":
        return bag // batch.num_fields, batch.batch_size
    return bag, batch.batch_size * batch.num_fields


def check_fields(batch: Batch, model: RecModel) -> None:
    if batch.num_fields != model.fields:
        raise ValueError(f"batch has num_fields={batch.num_fields}, the model was built for "
                         f"fields={model.fields}")


def bce_loss(logits: torch.Tensor, labels: torch.Tensor, global_batch: int) -> torch.Tensor:
    """Sum of per-sample losses over `global_batch`: summed over ranks, the global mean."""
    if (isinstance(global_batch, bool) or not isinstance(global_batch, numbers.Integral)
            or global_batch < max(1, labels.shape[0])):
        raise ValueError(f"global_batch must be an integer >= this rank's batch "
                         f"({labels.shape[0]}) and >= 1, got {global_batch!r}")
    return nn.functional.binary_cross_entropy_with_logits(
        logits, labels.to(logits.dtype), reduction="sum") / global_batch


class ReferenceModel:
    """The unsharded single-process model: the whole table in one tensor."""

    def __init__(self, model: RecModel, num_rows: int, seed: int = 0, init_scale: float = 0.01):
        from thinwire.recsys.sharded import init_rows
        self.model, self.num_rows = model, num_rows
        self.table = init_rows(torch.arange(num_rows), model.row_dim, seed, init_scale,
                               model.dtype)
        self.table_state: dict = {}
        self.table_grad: torch.Tensor | None = None

    def forward(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        """(logits, rows leaf): rows[j] is the row of batch.ids[j]."""
        from thinwire.recsys.sharded import check_ids
        check_fields(batch, self.model)
        check_ids(batch.ids, self.num_rows, "batch.ids")
        rows = self.table[batch.ids].requires_grad_(True)
        seg, count = segments(batch, self.model)
        p = self.model.partial(rows, batch.values, seg, count)
        if self.model.level == "bag":
            p = p.view(batch.batch_size, batch.num_fields, -1)
        return self.model.combine(p), rows

    def train_step(self, batch: Batch, sparse_opt, dense_opt, global_batch: int | None = None):
        logits, rows = self.forward(batch)
        loss = bce_loss(logits, batch.labels, global_batch or batch.batch_size)
        dense_opt.zero_grad()
        loss.backward()
        grad = torch.zeros_like(self.table).index_add_(0, batch.ids, rows.grad)
        self.table_grad = grad
        sparse_opt.step(self.table, self.table_state, batch.ids, rows.grad)
        dense_opt.step()
        return logits.detach(), float(loss.detach())


def roc_auc(labels, scores) -> float:
    """Area under the ROC curve (ties get half credit)."""
    from sklearn.metrics import roc_auc_score
    return float(roc_auc_score(labels, scores))


def dense_optimizer(model: RecModel, kind: str, lr: float) -> torch.optim.Optimizer:
    params = list(model.dense.parameters())
    if kind == "sgd":
        return torch.optim.SGD(params, lr=lr)
    if kind == "adagrad":
        return torch.optim.Adagrad(params, lr=lr, eps=1e-10)
    raise ValueError(f"optimizer must be 'sgd' or 'adagrad', got {kind!r}")
