"""`thinwire train --algorithm torchft-diloco`: torchft's DiLoCo as a training run, the peer that
`thinwire compare` races thinwire's DiLoCo against.

The same node structure as `--algorithm diloco`: DDP inside each node on thinwire's node group,
every step; across nodes torchft's own machinery, set up the way torchft's docs deploy it:

* one Lighthouse for the job, run by global rank 0 on the master address;
* per node a replica group: a TCPStore hosted by the node's local rank 0 on the node's own
  address (torchft configures its cross-node process groups through it), and on every rank a
  ``Manager`` (synchronous quorum, ``init_sync=False``: the nodes start from the same seeded
  model) with a ``ProcessGroupGloo``;
* ``torchft.local_sgd.DiLoCo`` with an SGD Nesterov outer optimizer, driven by its post-step
  hook on the loop's optimizer. Local rank i of every node all-reduces the whole
  pseudo-gradient with local rank i of the others (torchft's design: no hierarchy).

Addresses travel through the run's default store. torchft has no byte counters (the run's
inter-node bytes come from the interface counters on the shaped cluster) and no resumable
state here: checkpointing is refused by TrainConfig.validate.
"""

from __future__ import annotations

import logging
import os
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from thinwire.ft.per_step import own_address
from thinwire.local_sgd.diloco import node_group
from thinwire.local_sgd.torchft_peer import MISSING, available

log = logging.getLogger(__name__)

KEY = "thinwire/torchft"


def check_config(cfg) -> None:
    """What torchft's DiLoCo here cannot do, named (the rest as --algorithm diloco)."""
    from thinwire.local_sgd.train_adapter import check_config as check_diloco

    check_diloco(cfg)
    if not available():
        raise ValueError(f"--algorithm torchft-diloco: {MISSING}")
    if cfg.fragments != 1 or cfg.overlap:
        raise ValueError(f"--algorithm torchft-diloco runs torchft's plain DiLoCo: --fragments "
                         f"must be 1 and --overlap off, got --fragments {cfg.fragments}"
                         f"{' --overlap' if cfg.overlap else ''}")
    if cfg.outer_algorithm not in ("allreduce", "hier_allreduce"):
        raise ValueError(f"--algorithm torchft-diloco all-reduces the pseudo-gradient densely "
                         f"(torchft's own): --outer-algorithm must be allreduce or "
                         f"hier_allreduce, got {cfg.outer_algorithm!r}")
    if cfg.checkpoint or cfg.resume:
        raise ValueError("--algorithm torchft-diloco does not checkpoint (torchft keeps its "
                         "own state): drop --checkpoint / --resume")


class _NoTraceback(logging.Filter):
    """torchft's Manager logs every failed collective it recovers from with its traceback
    (a lost replica: one per bucket, 60 lines each); the message stays, the traceback goes,
    unless THINWIRE_TRACEBACK=1. What ends the run is said once, by thinwire, in one line."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.exc_info, record.exc_text = None, None
        message = record.getMessage()  # should_commit's "errored=" embeds the traceback
        if "Traceback (most recent call last)" in message:
            record.msg, record.args = message.split("Traceback (most recent call last)")[0], None
        return True


def _quiet_torchft_tracebacks() -> None:
    if os.environ.get("THINWIRE_TRACEBACK") != "1":
        manager_log = logging.getLogger("torchft.manager")
        if not any(isinstance(f, _NoTraceback) for f in manager_log.filters):
            manager_log.addFilter(_NoTraceback())


class TorchftDiLoCoSync:
    """The loop's ``Sync`` for torchft's DiLoCo: builds DDP now, torchft once the optimizer
    exists (:meth:`attach`), tears torchft down in :meth:`close`."""

    def __init__(self, cfg, module, topology, device_ids=None):
        self.cfg, self.topology, self.module = cfg, topology, module
        self.model = DistributedDataParallel(module, device_ids=device_ids,
                                             process_group=node_group(topology))
        self._lighthouse = self._store = self._manager = self._diloco = None

    def attach(self, optimizer) -> None:
        from torchft import Manager, ProcessGroupGloo
        from torchft.local_sgd import DiLoCo

        from thinwire.ft.state_transfer import DataOnlyTransport

        _quiet_torchft_tracebacks()

        store = dist.distributed_c10d._get_default_store()
        topo, rank = self.topology, dist.get_rank()
        node, local = rank // topo.ranks_per_node, rank % topo.ranks_per_node
        address = own_address(os.environ.get("MASTER_ADDR", "127.0.0.1"))
        if rank == 0:
            from torchft.coordination import LighthouseServer
            # the node's own address, not every interface ("[::]" reached the host's networks
            # when run outside the emulated cluster); torchft's Manager server binds every
            # interface itself (torchft 0.2's Manager takes a port, no address). Its HTTP
            # checkpoint server is not started: healing goes through DataOnlyTransport.
            self._lighthouse = LighthouseServer(bind=f"{address}:0", min_replicas=topo.nodes)
            port = self._lighthouse.address().rsplit(":", 1)[1]
            store.set(f"{KEY}/lighthouse", f"http://{address}:{port}")
        if local == 0:
            self._store = dist.TCPStore(address, 0, is_master=True, wait_for_workers=False)
            store.set(f"{KEY}/store/{node}", f"{address}:{self._store.port}")
        lighthouse = store.get(f"{KEY}/lighthouse").decode()
        store_addr, store_port = store.get(f"{KEY}/store/{node}").decode().rsplit(":", 1)
        module = self.module
        # the run's --collective-timeout: a lost replica ends the survivors' step within it
        timeout = timedelta(seconds=self.cfg.collective_timeout_s)
        pg = ProcessGroupGloo(timeout=timeout)
        # a healing peer's state arrives as JSON + raw tensor bytes over the replica groups'
        # own group, in exactly the form of this replica's Manager state (what torchft sends
        # and loads; its private _manager_state_dict, the one call that returns it whole):
        # torchft's default transport unpickles it from an HTTP server on every interface
        transport = DataOnlyTransport(pg, timeout,
                                      own_state=lambda: self._manager._manager_state_dict())
        self._manager = Manager(
            pg=pg, checkpoint_transport=transport,
            load_state_dict=lambda s: module.load_state_dict(s["model"]),
            state_dict=lambda: {"model": module.state_dict()},
            min_replica_size=topo.nodes, use_async_quorum=False, replica_id=f"node{node}",
            store_addr=store_addr, store_port=int(store_port), rank=local,
            world_size=topo.ranks_per_node, lighthouse_addr=lighthouse, hostname=address,
            timeout=timeout, quorum_timeout=timeout, init_sync=False)
        outer = torch.optim.SGD(module.parameters(), lr=self.cfg.outer_lr,
                                momentum=self.cfg.outer_momentum, nesterov=True)
        # its Nesterov buffers made now, as its first outer step would: a replica whose first
        # outer step did not commit heals into the form of one whose did (the transport is
        # strict about the form)
        from thinwire.ft.per_step import materialize_optimizer_state
        materialize_optimizer_state(outer)
        self._diloco = DiLoCo(self._manager, [module], optimizer, outer,
                              sync_every=self.cfg.sync_every)
        self._diloco.__enter__()  # registers its hooks on the loop's optimizer

    def owes(self) -> bool:
        """Nothing owed by a switch: DiLoCo is never switched to."""
        return False

    def finish(self, stopped: bool) -> None:
        """Nothing in flight: torchft's DiLoCo syncs inside the optimizer step."""

    def state_dict(self):
        raise RuntimeError("torchft-diloco does not checkpoint")  # refused by validate first

    def load_state_dict(self, saved) -> None:
        raise RuntimeError("torchft-diloco does not checkpoint")

    def totals(self) -> None:
        return None  # no thinwire counters: the interface counters measure the bytes

    def close(self) -> None:
        """Collective: every rank's manager stops before rank 0 stops the lighthouse."""
        if self._diloco is not None:
            self._diloco.__exit__(None, None, None)
        if self._manager is not None:
            self._manager.shutdown(wait=False)
        dist.barrier()
        if self._lighthouse is not None:
            self._lighthouse.shutdown()
        self._store = self._manager = self._diloco = self._lighthouse = None
