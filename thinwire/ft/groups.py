"""The groups of a fault-tolerant per-step run, where nodes come and go between steps.

Each node is one torchft replica group: its ranks form the node's own process group (its
torchrun world), which lives as long as the node. Across nodes there is no fixed world: at
every step torchft's ``Manager`` forms a quorum of the nodes alive and re-forms one process
group per local rank j among the nodes in it (local rank j of every node), the group thinwire's
hierarchical algorithms already use between nodes (``Topology.inter``). torchft's Manager
makes only its all-reduce fault-tolerant; thinwire's sparse algorithms all-gather their
selections, so :class:`ReplicaGroup` adds the all-gather on the same group with torchft's
rule for failures: the first failure of a step is reported to the Manager (the step will not
commit, on any rank of the node), and it and every later cross-node collective of the step
return at once, so no rank waits on a peer that is gone. Their output only has to be
readable (it is thrown away with the step): an all-reduce returns zeros, an all-gather this
rank's own block in every member's place (a packed sparse block of zeros would not decode).

:class:`HierarchicalWorld` stands in for the world group (the ``"raise"`` NaN/Inf decision,
the small-bucket dense path, the flat algorithms' all-reduce and all-gather): the node's group
first, then the cross-node group; the same result as one collective over every rank, rank
``node * ranks_per_node + local`` in the usual order.

The collectives take these objects where they take a process group
(``thinwire.collectives.primitives.all_reduce_sum`` / ``all_gather_into``). The node's own
collectives never skip: a node's ranks stay in step with each other even after a failure
(one rank's cross-node collective may fail where a node-mate's did not).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from thinwire.collectives.primitives import all_gather_single


class ReplicaGroup:
    """Local rank j of every node in the current quorum: torchft's re-formed group."""

    def __init__(self, manager, pg):
        self.manager, self.pg = manager, pg

    def failed(self) -> bool:
        return self.manager.errored() is not None

    def abort(self) -> None:
        """Close this rank's connections of the step's group, so that a live peer waiting on
        this rank (it lost another, or its quorum failed) fails now rather than at its
        timeout: with 3 nodes left of 4, only the lost node's neighbours see its death; the
        others waited 30 s for them. The next quorum configures a fresh group (torchft
        reconfigures after an error)."""
        try:
            self.pg.abort()
        except Exception:  # noqa: BLE001 - best effort: the quorum replaces the group anyway
            pass

    def all_reduce_sum(self, tensor: torch.Tensor) -> None:
        from torch.distributed import ReduceOp

        if not self.failed():
            self.manager.allreduce(tensor, reduce_op=ReduceOp.SUM).wait()  # reports a failure
            if self.failed():
                self.abort()
        if self.failed():
            tensor.zero_()

    def all_gather_into(self, out: torch.Tensor, tensor: torch.Tensor) -> None:
        from torch.distributed.distributed_c10d import AllgatherOptions

        if not self.failed():
            # torchft's group is gloo (per_step.build_manager); its all-gather takes host
            # memory only (a GPU tensor crashed the process on an H200): staged through it
            host = tensor.device.type != "cpu"
            into, send = (torch.empty(out.shape, dtype=out.dtype), tensor.cpu()) if host \
                else (out, tensor)
            try:
                self.pg.allgather_into_tensor_coalesced([into], [send],
                                                        AllgatherOptions()).wait()
                if host:
                    out.copy_(into)
            except Exception as error:  # noqa: BLE001 - a peer gone: the Manager decides
                self.manager.report_error(error)
                self.abort()
        if self.failed():
            out.view(-1, tensor.numel()).copy_(tensor.reshape(1, -1))


class HierarchicalWorld:
    """Every rank of the nodes in the quorum: the node's group, then the cross-node group."""

    def __init__(self, intra, inter: ReplicaGroup, ranks_per_node: int):
        self.intra, self.inter, self.ranks_per_node = intra, inter, ranks_per_node

    def all_reduce_sum(self, tensor: torch.Tensor) -> None:
        if self.ranks_per_node > 1:
            dist.all_reduce(tensor, group=self.intra)
        self.inter.all_reduce_sum(tensor)

    def all_gather_into(self, out: torch.Tensor, tensor: torch.Tensor) -> None:
        node = tensor
        if self.ranks_per_node > 1:
            node = torch.empty(self.ranks_per_node * tensor.numel(), dtype=tensor.dtype,
                               device=tensor.device)
            all_gather_single(node, tensor, group=self.intra)
        self.inter.all_gather_into(out, node)
