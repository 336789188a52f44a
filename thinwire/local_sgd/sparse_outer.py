"""DiLoCo's outer exchange in the SparseLoCo style (``algorithm="sparseloco"``): chunked top-k,
quantised values, error feedback with a decay, hierarchical like HiTopKComm.

The ranks of a node hold the same pseudo-gradient (DDP keeps them identical), so no reduction
inside the node is needed: local rank j takes shard j (1/n) of it. Per shard and per rank, with
decay ``beta``:

    e  = beta * e + shard                       (error feedback; beta plays outer momentum's part)
    s  = Q(chunked top-k of e)                  (what is sent, as the receivers decode it)
    e  = e - s                                  (kept: sent + kept = beta * e_old + shard)

``s`` is all-gathered among the ranks holding the same shard on every node (the only traffic
on the slow links, n NICs' worth in parallel as in HiTopKComm), summed and divided by the node
count; a dense all-gather inside the node reassembles the whole average. With ``decay=0`` and no
quantisation this is plain error-feedback top-k. SparseLoCo pairs it with an outer step without
momentum (the decayed residual already carries the past pseudo-gradients): DiLoCo's
``outer_momentum=0``.

Same interface as :class:`thinwire.state.SyncState` for DiLoCo (reduce, end_step, totals,
state_dict), its counters and timers included (it extends SyncState).
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist

from thinwire.collectives import traffic
from thinwire.collectives.primitives import padded
from thinwire.local_sgd import chunked
from thinwire.state import SyncState

NAME = "sparseloco"
FORMAT = "thinwire.sparseloco/1"
DEFAULTS = {"chunk": 4096, "bits": 2, "decay": 0.95}


def check_decay(decay) -> float:
    if isinstance(decay, bool) or not isinstance(decay, (int, float)) \
            or not math.isfinite(decay) or not 0 <= decay <= 1:
        raise ValueError(f"decay must be a number in [0, 1], got {decay!r}")
    return float(decay)


def step_shard(residual: torch.Tensor | None, shard: torch.Tensor, density: float, chunk: int,
               bits: int | None, decay: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One rank's compression: (payload, sent, new residual). ``residual`` None = zeros."""
    corrected = shard.clone() if residual is None else residual.mul(decay).add_(shard)
    payload, sent = chunked.compress(corrected, density, chunk, bits)
    return payload, sent, corrected.sub_(sent)


class SparseOuterState(SyncState):
    def __init__(self, topology, density: float, chunk: int = DEFAULTS["chunk"],
                 bits: int | None = DEFAULTS["bits"], decay: float = DEFAULTS["decay"]):
        chunked.check(density, chunk, bits)
        super().__init__(topology, "allreduce")  # counters, timers; its own reduce is unused
        self.density, self.chunk, self.bits = float(density), chunk, bits
        self.decay = check_decay(decay)
        self.residuals: dict[int, torch.Tensor] = {}

    @property
    def outer_settings(self) -> dict:
        return {"algorithm": NAME, "density": self.density, "chunk": self.chunk,
                "bits": self.bits, "decay": self.decay}

    def reduce(self, bucket_index: int, flat: torch.Tensor, layout=None) -> torch.Tensor:
        """The average over nodes of the node's pseudo-gradient ``flat`` (identical on the
        ranks of a node), as compressed by every node."""
        topo = self.topology
        self._bucket = bucket_index
        n, m = topo.ranks_per_node, topo.nodes
        full = padded(flat, n)
        size = full.numel() // n
        shard = full[topo.local_rank * size:(topo.local_rank + 1) * size]
        kept = self.residuals.get(bucket_index)
        if kept is not None and kept.shape != shard.shape:
            raise RuntimeError(f"bucket {bucket_index} changed size ({kept.numel()} -> "
                               f"{shard.numel()} elements per shard): residuals are per bucket")
        with self.timer("select"):
            payload, sent, self.residuals[bucket_index] = step_shard(
                kept, shard, self.density, self.chunk, self.bits, self.decay)
        if m > 1:
            gathered = torch.empty(m * payload.numel(), dtype=torch.uint8, device=flat.device)
            with self.timer("inter"):
                dist.all_gather_into_tensor(gathered, payload, group=topo.inter)
            with self.timer("select"):
                total = torch.zeros_like(shard)
                for node, part in enumerate(gathered.chunk(m)):
                    total += sent if node == topo.node else chunked.decompress(
                        part, size, self.density, self.chunk, self.bits, shard.dtype)
            total.div_(m)
        else:
            total = sent.clone()
        self.record(traffic.inter_allgather(topo, payload.numel()))
        if n > 1:
            with self.timer("intra"):
                dist.all_gather_into_tensor(full, total, group=topo.intra)
            self.record(traffic.intra_allgather(topo, full.numel(), full.element_size()))
        else:
            full = total
        return full[:flat.numel()]

    def state_dict(self) -> dict:
        # residuals under "feedback" in SyncState's shape, so checkpoint checks read them alike
        residuals = {i: r.detach().cpu().clone() for i, r in self.residuals.items()}
        return {"format": FORMAT, **self.outer_settings, "steps": self.steps,
                "feedback": {"enabled": True, "residuals": residuals, "velocities": {},
                             "layouts": {}}}

    def load_state_dict(self, state: dict) -> None:
        if not isinstance(state, dict) or state.get("format") != FORMAT:
            raise ValueError(f"not a {NAME} outer-exchange checkpoint (format "
                             f"{state.get('format') if isinstance(state, dict) else None!r})")
        saved = {k: state.get(k) for k in self.outer_settings}
        if saved != self.outer_settings:
            raise ValueError(f"checkpoint's outer exchange is {saved}, this one is "
                             f"{self.outer_settings}")
        self.steps = int(state["steps"])
        self.residuals = {int(i): r.clone()
                          for i, r in state["feedback"]["residuals"].items()}
