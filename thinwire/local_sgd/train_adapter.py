"""`thinwire train --algorithm diloco`: DiLoCo seen by the training loop as a ``Sync`` (counters,
checkpoint), with DDP inside each node and the outer step driven by a post-step hook on the
loop's own optimizer (so the loop's step code stays as it is)."""

from __future__ import annotations

import logging

import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from thinwire import collectives
from thinwire.local_sgd import chunked, sparse_outer
from thinwire.local_sgd.diloco import DiLoCo, node_group

log = logging.getLogger(__name__)


def check_config(cfg) -> None:
    """The DiLoCo rules of a TrainConfig (the CLI's names); each setting's own type and range
    were checked against its declaration (thinwire.train.settings) before."""
    if cfg.sync_every < 1:
        raise ValueError(f"--sync-every must be an integer >= 1 with --algorithm diloco, got "
                         f"{cfg.sync_every!r}")
    if cfg.outer_algorithm == sparse_outer.NAME:
        if cfg.outer_momentum:
            log.warning("--outer-algorithm %s with --outer-momentum %g: its decayed residual "
                        "already plays outer momentum's part; SparseLoCo uses --outer-momentum "
                        "0 (measured better, docs/benchmarks.md)", sparse_outer.NAME,
                        cfg.outer_momentum)
        try:
            chunked.check(cfg.density, cfg.outer_chunk, cfg.outer_bits or None)
            sparse_outer.check_decay(cfg.outer_decay)
        except ValueError as exc:  # the CLI's names for the settings
            raise ValueError(f"--outer-algorithm {sparse_outer.NAME}: {exc} (--density, "
                             f"--outer-chunk, --outer-bits, --outer-decay)") from None


class DiLoCoSync:
    """Builds the node-local DDP model now and the DiLoCo once the optimizer exists."""

    def __init__(self, cfg, module, topology, device_ids=None):
        self.cfg = cfg
        self.topology = topology
        self.model = DistributedDataParallel(module, device_ids=device_ids,
                                             process_group=node_group(topology))
        self.diloco: DiLoCo | None = None

    def attach(self, optimizer) -> None:
        cfg = self.cfg
        sparse = cfg.outer_algorithm in collectives.sparse_names() + (sparse_outer.NAME,)
        options = {"chunk": cfg.outer_chunk, "bits": cfg.outer_bits or None,
                   "decay": cfg.outer_decay} if cfg.outer_algorithm == sparse_outer.NAME else None
        if cfg.algorithm_options.get(cfg.outer_algorithm):  # checked by TrainConfig
            options = {"algorithm_options": cfg.algorithm_options[cfg.outer_algorithm]}
        self.diloco = DiLoCo(
            self.model, optimizer, sync_every=cfg.sync_every, outer_lr=cfg.outer_lr,
            outer_momentum=cfg.outer_momentum, algorithm=cfg.outer_algorithm,
            density=cfg.density if sparse else None,
            selector=cfg.selector if cfg.outer_algorithm in collectives.sparse_names() else None,
            fragments=cfg.fragments, overlap=cfg.overlap, topology=self.topology,
            sync_options=options)
        optimizer.register_step_post_hook(lambda *_: self.diloco.step())

    def owes(self) -> bool:
        """Nothing owed by a switch: DiLoCo is never switched to."""
        return False

    def finish(self, stopped: bool) -> None:
        """After the last step: an exchange in flight lands (before the final evaluation),
        unless the run stopped to resume later (its checkpoint keeps the exchange, applied at
        its step after the resume)."""
        if not stopped:
            self.diloco.flush()

    def close(self) -> None:
        """Release the groups this run built: the topology's and DDP's node group."""
        if self.diloco is not None:
            self.diloco.close()
        self.topology.close()
        group = self.model.process_group
        if dist.is_initialized() and group in dist.distributed_c10d._world.pg_map:
            dist.destroy_process_group(group)

    def state_dict(self) -> dict:
        return self.diloco.state_dict()

    def load_state_dict(self, saved: dict) -> None:
        self.diloco.load_state_dict(saved)

    def totals(self) -> dict:
        return dict(self.diloco.state.totals)
