"""DiLoCo and local SGD across nodes, with any thinwire algorithm on the outer exchange.

    topology = thinwire.Topology.build()
    model = DDP(net, process_group=thinwire.local_sgd.node_group(topology))  # inside a node
    inner = torch.optim.AdamW(model.parameters(), lr=1e-3)
    diloco = thinwire.local_sgd.DiLoCo(model, inner, sync_every=100, topology=topology)
    for batch in data:
        loss(model, batch).backward(); inner.step(); inner.zero_grad(); diloco.step()

Every node is one DiLoCo worker: its ranks stay identical through ordinary DDP on the fast
links, every step. After every ``sync_every`` inner steps (per fragment, staggered when
``fragments > 1``) the pseudo-gradient ``anchor - parameters`` is averaged through
``SyncState.reduce`` over all ranks -- which, the replicas of a node being identical, is the
average over nodes -- and the outer optimizer (SGD, Nesterov momentum) moves the anchor by it;
the parameters restart from the new anchor. ``outer_lr=1, outer_momentum=0`` is plain local SGD
(parameter averaging). With ``algorithm="hitopk"`` each local rank sends the top-k of its 1/n
shard of the node's pseudo-gradient, its error feedback kept per rank (HiTopKComm's structure).

With ``overlap=True`` a fragment's exchange runs on a background thread during the next
``delay`` inner steps; when it lands the anchor takes the outer step and the fragment's
parameters become ``local_weight * local + (1 - local_weight) * new anchor`` (Streaming DiLoCo's
mixing of the stale global fragment with what the node learnt meanwhile).
"""

from __future__ import annotations

import logging
import math

import torch
import torch.distributed as dist

from thinwire import collectives
from thinwire.local_sgd import sparse_outer
from thinwire.local_sgd.exchange import Exchange
from thinwire.local_sgd.fragments import check_schedule, phase, split
from thinwire.state import SyncState
from thinwire.sync import DEFAULT_BUCKET_BYTES, buckets

log = logging.getLogger(__name__)

FORMAT = "thinwire.diloco/1"


def node_group(topology):
    """A process group of this rank's node for the user's DDP (collective: every rank calls it).

    Separate from ``topology.intra`` on purpose: with ``overlap=True`` the outer exchange uses
    thinwire's groups from a background thread, and two threads issuing collectives on one group
    could interleave differently on different ranks."""
    n = topology.ranks_per_node
    # the topology's timeout: without one, new_subgroups takes PyTorch's 30 minutes, not the
    # user's (a frozen peer held a DiLoCo rank with 2 ranks a node for >120 s at 10 s)
    group, _ = dist.new_subgroups_by_enumeration(
        [list(range(node * n, (node + 1) * n)) for node in range(topology.nodes)],
        timeout=topology.timeout)
    return group


class _Landed:
    """An exchange restored from a checkpoint: its result is already known."""

    def __init__(self, result: list[torch.Tensor]):
        self._result = result

    def wait(self) -> list[torch.Tensor]:
        return self._result


class DiLoCo:
    def __init__(self, model: torch.nn.Module, inner_optimizer: torch.optim.Optimizer, *,
                 sync_every: int, outer_lr: float = 0.7, outer_momentum: float = 0.9,
                 nesterov: bool = True, algorithm: str = "allreduce",
                 density: float | None = None, selector: str | None = None,
                 wire: str | None = None,
                 fragments: int = 1, overlap: bool = False, delay: int | None = None,
                 local_weight: float | None = None, topology=None,
                 bucket_bytes: int = DEFAULT_BUCKET_BYTES, sync_options: dict | None = None):
        self.params = [p for p in model.parameters() if p.requires_grad]
        if not self.params:
            raise ValueError("model has no parameters that require grad: nothing to synchronise")
        _check_owner(self.params, inner_optimizer)
        local_weight = _local_weight(local_weight, overlap)
        _check_outer(outer_lr, outer_momentum, local_weight)
        delay = (1 if overlap else 0) if delay is None else delay
        if not overlap and delay != 0:
            raise ValueError(f"delay must be 0 without overlap (the exchange is applied at once), "
                             f"got {delay}")
        self.fragments = split(self.params, fragments)  # checks fragments first
        check_schedule(sync_every, fragments, overlap, delay)
        if (algorithm in collectives.sparse_names() or algorithm == sparse_outer.NAME) \
                and density is None:
            raise ValueError(f"density is required with the sparse algorithm {algorithm!r} "
                             "(a number in (0, 1], e.g. 0.01)")
        if selector is not None and algorithm not in collectives.sparse_names():
            raise ValueError(f"selector applies to the top-k of a sparse algorithm "
                             f"({', '.join(collectives.sparse_names())}), got selector="
                             f"{selector!r} with algorithm {algorithm!r}")
        options = dict(sync_options or {})
        if wire is not None:
            options["wire"] = wire
        if density is not None and algorithm != sparse_outer.NAME:
            options.update(density=density, selector=selector or "auto")
        self._owns_topology = topology is None  # close() releases only what it built
        if topology is None:
            from thinwire.topology import Topology
            topology = Topology.build()
        if algorithm == sparse_outer.NAME:  # chunk, bits, decay come in sync_options
            self.state = sparse_outer.SparseOuterState(topology, density, **options)
        else:
            self.state = SyncState(topology, algorithm, **options)
        self.sync_every, self.overlap, self.delay = sync_every, bool(overlap), delay
        self.outer_lr, self.outer_momentum = float(outer_lr), float(outer_momentum)
        self.nesterov, self.local_weight = bool(nesterov), float(local_weight)
        self.bucket_bytes = bucket_bytes
        with torch.no_grad():
            self.anchor = [p.detach().clone() for p in self.params]
        self.momentum = [torch.zeros_like(p) for p in self.params]
        self.buckets = self._layout()
        self.inner_steps = 0
        self.outer_steps = [0] * len(self.fragments)  # outer steps taken, per fragment
        self._pending: dict[int, tuple[int, object]] = {}  # fragment -> (apply step, exchange)

    def _layout(self) -> list[list[tuple[int, list[int]]]]:
        """Per fragment: (bucket index, parameter indices), bucket indices unique overall."""
        index_of = {id(p): i for i, p in enumerate(self.params)}
        layout, next_index = [], 0
        for run in self.fragments:
            groups = buckets([self.params[i] for i in run], self.bucket_bytes)
            frag = []
            for group in groups:
                frag.append((next_index, [index_of[id(p)] for p in group]))
                next_index += 1
            layout.append(frag)
        return layout

    # ------------------------------------------------------------------ the schedule

    def step(self) -> None:
        """Call once after every ``inner_optimizer.step()``."""
        self.inner_steps += 1
        for f in [f for f, (due, _) in self._pending.items() if due <= self.inner_steps]:
            self._apply(f)
        residue = self.inner_steps % self.sync_every
        for f in range(len(self.fragments)):
            if residue == phase(f, len(self.fragments), self.sync_every):
                self._launch(f)

    def close(self) -> None:
        """Wait for an exchange in flight (not applied: call flush() first to apply it) and
        release the process groups this DiLoCo built (none when the caller gave a topology)."""
        for f in sorted(self._pending):
            _, exchange = self._pending.pop(f)
            try:
                exchange.wait()
            except BaseException as exc:  # its rank is closing; the error was logged there
                log.debug("exchange of fragment %d ended with %s while closing", f, exc)
        if self._owns_topology and self.state.topology is not None:
            self.state.topology.close()
            self._owns_topology = False

    def __enter__(self) -> "DiLoCo":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def flush(self) -> None:
        """Wait for every exchange in flight and apply it now (at the end of training)."""
        for f in sorted(self._pending):
            self._apply(f)

    def _launch(self, f: int) -> None:
        if f in self._pending:  # cannot happen with a checked schedule; guards the invariant
            raise RuntimeError(f"fragment {f} launched while its previous exchange is in flight")
        with torch.no_grad():
            flats = [torch.cat([(self.anchor[i] - self.params[i]).reshape(-1) for i in members])
                     for _, members in self.buckets[f]]
        indices = [b for b, _ in self.buckets[f]]
        exchange = Exchange(self.state, indices, flats, background=self.overlap)
        self._pending[f] = (self.inner_steps + self.delay, exchange)
        if self.delay == 0:
            self._apply(f)

    @torch.no_grad()
    def _apply(self, f: int) -> None:
        due, exchange = self._pending.pop(f)
        try:
            averaged = exchange.wait()
        except BaseException:
            self.state.abandon_step()  # what the failed exchange noted is not the next one's
            raise
        try:
            self.state.end_step()
        except FloatingPointError as exc:
            # the state counts its exchanges; the user's loop counts inner steps (the
            # pseudo-gradient was taken at the launch, ``delay`` inner steps before it is due)
            raise FloatingPointError(
                f"DiLoCo: non-finite pseudo-gradient (anchor - parameters) in the outer "
                f"exchange of fragment {f} after inner step {due - self.delay} (outer step "
                f"{self.outer_steps[f] + 1}; first in {getattr(exc, 'where', '?')}): the "
                f"inner steps since the last exchange diverged (a lower inner or outer "
                f"learning rate may hold them); every rank stops here") from exc
        m, lr = self.outer_momentum, self.outer_lr
        for (_, members), flat in zip(self.buckets[f], averaged):
            offset = 0
            for i in members:
                p, anchor, velocity = self.params[i], self.anchor[i], self.momentum[i]
                grad = flat[offset:offset + p.numel()].view_as(p).to(p.dtype)
                offset += p.numel()
                velocity.mul_(m).add_(grad)
                anchor.sub_(grad.add(velocity, alpha=m) if self.nesterov else velocity, alpha=lr)
                if self.overlap:  # the node kept learning during the exchange: mix it in
                    p.lerp_(anchor, 1.0 - self.local_weight)
                else:
                    p.copy_(anchor)
        self.outer_steps[f] += 1

    # ------------------------------------------------------------------ checkpoints

    def _config(self) -> dict:
        return {"sync_every": self.sync_every, "fragments": len(self.fragments),
                "overlap": self.overlap, "delay": self.delay,
                "shapes": [list(p.shape) for p in self.params]}

    def state_dict(self) -> dict:
        """Anchor, outer momentum, the algorithm's residuals, counters and any exchange in
        flight (waited for: its result is stored and applied at its step after a resume).
        Plain tensors and numbers: loads with ``torch.load(weights_only=True)``."""
        pending = {}
        for f, (due, exchange) in self._pending.items():
            result = exchange.wait()
            self._pending[f] = (due, _Landed(result))
            pending[f] = {"apply_step": due, "buckets": [t.detach().cpu().clone() for t in result]}
        return {"format": FORMAT, "config": self._config(), "inner_steps": self.inner_steps,
                "outer_steps": list(self.outer_steps),
                "anchor": [a.detach().cpu().clone() for a in self.anchor],
                "momentum": [v.detach().cpu().clone() for v in self.momentum],
                "sync": self.state.state_dict(), "pending": pending}

    def load_state_dict(self, state: dict) -> None:
        if state.get("format") != FORMAT:
            raise ValueError(f"not a DiLoCo checkpoint of format {FORMAT!r} "
                             f"(format {state.get('format')!r})")
        if state["config"] != self._config():
            raise ValueError(f"checkpoint is for DiLoCo {state['config']}, this one is "
                             f"{self._config()}")
        for f, pending in state["pending"].items():
            if len(pending["buckets"]) != len(self.buckets[int(f)]):
                raise ValueError(f"checkpoint's exchange of fragment {f} has "
                                 f"{len(pending['buckets'])} buckets, this layout "
                                 f"{len(self.buckets[int(f)])}")
        self.state.load_state_dict(state["sync"])
        with torch.no_grad():
            for mine, theirs in zip(self.anchor + self.momentum,
                                    state["anchor"] + state["momentum"]):
                mine.copy_(theirs)
        self.inner_steps = int(state["inner_steps"])
        self.outer_steps = [int(n) for n in state["outer_steps"]]
        device = self.params[0].device
        self._pending = {int(f): (int(p["apply_step"]),
                                  _Landed([t.to(device) for t in p["buckets"]]))
                         for f, p in state["pending"].items()}


def _check_owner(params: list[torch.Tensor], optimizer) -> None:
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"inner_optimizer must be a torch.optim.Optimizer, got "
                        f"{type(optimizer).__name__}")
    owned = {id(p) for group in optimizer.param_groups for p in group["params"]}
    missing = [i for i, p in enumerate(params) if id(p) not in owned]
    if missing:
        raise ValueError(f"inner_optimizer must own every trainable parameter of the model; "
                         f"parameters {missing[:5]} (of {len(params)}, in model.parameters() "
                         "order) are not in its param_groups")


def _local_weight(local_weight, overlap) -> float:
    """Streaming DiLoCo's mix of the local parameters with the late anchor: overlap's only
    (0.5 there by default); refused without overlap, where nothing is mixed."""
    if local_weight is None:
        return 0.5
    if not overlap:
        raise ValueError(f"local_weight applies with overlap=True (the local parameters mixed "
                         f"with the anchor that arrives late), got local_weight={local_weight!r} "
                         f"without overlap")
    return local_weight


def _check_outer(outer_lr, outer_momentum, local_weight) -> None:
    if not (isinstance(outer_lr, (int, float)) and math.isfinite(outer_lr) and outer_lr > 0):
        raise ValueError(f"outer_lr must be a finite number > 0, got {outer_lr!r}")
    if not (isinstance(outer_momentum, (int, float)) and 0 <= outer_momentum < 1):
        raise ValueError(f"outer_momentum must be a number in [0, 1), got {outer_momentum!r}")
    if not (isinstance(local_weight, (int, float)) and 0 <= local_weight <= 1):
        raise ValueError(f"local_weight must be a number in [0, 1], got {local_weight!r}")
