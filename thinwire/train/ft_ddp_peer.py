"""torchft's own fault-tolerant DDP with fp16 gradients: the peer that issue #32 races
thinwire's fault-tolerant per-step training against
(`python -m thinwire.train.ft_job --peer torchft-ddp-fp16`).

It is torchft 0.2.0 as its README and its ``train_ddp.py`` example use it:

- every process is its own replica group: torchft's ``DistributedDataParallel`` averages
  gradients across replica groups only (inside one it has a dummy group), so two processes
  of one group would train apart;
- torchft's ``Manager`` with its defaults (asynchronous quorum, ``init_sync``), healing
  through torchft's process-group transport: its default, the HTTP one, names its server by
  the machine's hostname, which the emulated nodes' namespaces cannot reach;
- ``OptimizerWrapper``'s protocol: zero_grad starts the quorum, the step commits where
  ``should_commit`` agrees.

What thinwire sets:

- the gradients cross as fp16: the comm hook casts each bucket and all-reduces it through
  the Manager, as PyTorch's ``fp16_compress_hook`` does through a process group;
- the Lighthouse and the address the Manager serves on (the node's address on the cluster, not
  the machine's hostname, which the nodes' namespaces cannot reach);
- the same timeout as thinwire's runs.
"""

from __future__ import annotations

from datetime import timedelta

import torch
import torch.distributed as dist

PEERS = ("torchft-ddp-fp16",)


def _fp16_ddp_class():
    from torchft.ddp import DistributedDataParallel

    class FP16DistributedDataParallel(DistributedDataParallel):
        """torchft's DDP whose buckets cross as fp16 (its hook sends them as they are)."""

        @staticmethod
        def _comm_hook(state, bucket):
            buffer = bucket.buffer()
            half = buffer.to(torch.float16)
            state.allreduce(half).wait()  # the average over the quorum; a failure is tracked
            buffer.copy_(half)
            done = torch.futures.Future()
            done.set_result(buffer)
            return done

    return FP16DistributedDataParallel


class TorchftDDPStep:
    """The peer's training step with :class:`thinwire.ft.per_step.FaultTolerantStep`'s face
    (begin, commit, nodes, quorums, rolled_back, departures) for ``ft_job``'s loop.

    ``nodes`` counts replica groups (processes) over ``ranks_per_node``: whole nodes."""

    def __init__(self, *, lighthouse: str, place: int, address: str, timeout: timedelta,
                 model: torch.nn.Module, optimizer, scheduler, ranks_per_node: int):
        from torchft import Manager, ProcessGroupGloo
        from torchft.checkpointing.pg_transport import PGTransport

        self.store = dist.TCPStore(address, 0, is_master=True, wait_for_workers=False)
        self.model, self.optimizer, self.scheduler = model, optimizer, scheduler
        self.ranks_per_node = ranks_per_node
        pg = ProcessGroupGloo(timeout=timeout)
        self.manager = Manager(
            pg=pg, checkpoint_transport=PGTransport(pg, timeout, torch.device("cpu")),
            load_state_dict=self._load,
            state_dict=self._state, min_replica_size=1, replica_id=f"replica{place}",
            store_addr=address, store_port=self.store.port, rank=0, world_size=1,
            lighthouse_addr=lighthouse, hostname=address, timeout=timeout,
            quorum_timeout=timeout, connect_timeout=timeout)
        self.ddp = _fp16_ddp_class()(self.manager, model)
        self.quorums: list[tuple[int, int]] = []
        self.rolled_back = 0
        self.departures: list[dict] = []  # DDP keeps no residual: nothing leaves with a node
        self._replicas = 0

    def _state(self) -> dict:
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                "scheduler": self.scheduler.state_dict()}

    def _load(self, state: dict) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])

    @property
    def nodes(self) -> int:
        return self._replicas // self.ranks_per_node

    def begin(self) -> None:
        self.manager.start_quorum()  # asynchronous: it runs while the forward pass does
        if not self._replicas:  # the first: awaited, so a node's join is timed as thinwire's
            self.manager.wait_quorum()
            self._replicas = self.manager.num_participants()
            self.quorums.append((self.manager.current_step(), self.nodes))
        self.optimizer.zero_grad(set_to_none=True)

    def commit(self) -> bool:
        replicas = self.manager.num_participants()
        if replicas != self._replicas:
            self._replicas = replicas
            self.quorums.append((self.manager.current_step(), self.nodes))
        if self.manager.should_commit():
            self.optimizer.step()
            self.scheduler.step()
            return True
        self.rolled_back += 1
        return False
