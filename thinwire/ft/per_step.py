"""Fault-tolerant per-step training: thinwire's algorithms go on through a node vanishing and
coming back, without a restart, on torchft's quorum.

A node is a torchft replica group (``replica_id`` ``nodeK``; its ranks are the group's ranks).
Every step:

1. :meth:`FaultTolerantStep.begin`: ``Manager.start_quorum()`` (synchronous) agrees with the
   Lighthouse which nodes take part and re-forms the cross-node groups among them; a node
   behind the others (one that came back) first heals from a live peer: model, optimizer and
   thinwire's ``SyncState`` (:meth:`SyncState.healing_state_dict`: its residuals stay empty,
   a returning node has sent nothing it kept back), as JSON and raw tensors
   (``thinwire.ft.state_transfer.DataOnlyTransport``: nothing is unpickled). The topology
   then counts the nodes of this quorum, so averages divide by the ranks that contributed.
   The ``SyncState`` is snapshotted.
2. forward, backward and the gradient synchronisation, as in any run: the algorithms' cross-node
   collectives run on :class:`thinwire.ft.groups.ReplicaGroup` (a failure is reported to the
   Manager and the step's remaining cross-node traffic is skipped).
3. :meth:`FaultTolerantStep.commit`: ``Manager.should_commit()``; where every rank of the node
   finished without a failure the optimizer steps; else the ``SyncState`` rolls back to the
   snapshot (the mass that step selected is neither lost nor sent twice) and the step is
   retried by the next quorum.

What a node that vanishes held in its error-feedback residual leaves with it: its mass was
never applied by anyone. The effective batch follows the node count (each step averages over
the ranks present; the learning rate is not rescaled). With ``job_nodes`` (the nodes of the
full job) the run counts samples, not steps: a step of k of the N nodes advances
:attr:`FaultTolerantStep.progress` and the learning-rate schedule by k/N of a full step, and
:meth:`FaultTolerantStep.sample_start` hands its ranks the next k/N of a full step's samples
from the run's one sample stream, so a node that is away leaves no sample untrained and a run
that ends at the same progress has trained the same samples with the same schedule. Both
follow torchft's ``batches_committed`` (nodes summed over committed steps), which heals with
the Manager. Supported: the algorithms whose
collectives are the node's group, the cross-node group and the world composed from both
(:data:`ALGORITHMS`); the ones built on a world all-to-all are refused.
"""

from __future__ import annotations

import logging
import socket
import time
from datetime import timedelta

import torch

from thinwire.ft.groups import HierarchicalWorld, ReplicaGroup
from thinwire.topology import Topology

log = logging.getLogger(__name__)

ALGORITHMS = ("allreduce", "hier_allreduce", "topk_allgather", "hitopk")
# a node whose healing the state transfer refused this many quorums in a row (its state cannot
# take a live peer's form: retrying cannot change that) leaves the job with the refusal, so
# the others go on without it: without a bound every quorum rolled back for good, silently
HEAL_REFUSALS_MAX = 3


def check_algorithm(algorithm: str) -> None:
    if algorithm not in ALGORITHMS:
        raise ValueError(f"fault-tolerant training runs {', '.join(ALGORITHMS)} (their "
                         f"collectives re-form with the quorum), got algorithm {algorithm!r}")


def materialize_optimizer_state(optimizer) -> None:
    """Give every parameter the optimizer state its first step would create, with the values
    that step would start from, so that a fresh replica's state has the form of a live peer's
    (the data-only transport heals only into the form a replica already has). Exactly the
    lazy initialisation of SGD (momentum buffers: zeros, with no dampening the first step
    then gives the gradient, as the lazy clone does), Adam / AdamW (step 0, zero moments)
    and thinwire's LARS / LAMB. Another optimizer whose state is still empty is refused by
    name (one that builds its state in its constructor, as Adagrad, has its form already)."""
    from thinwire.optim import LAMB, LARS

    for group in optimizer.param_groups:
        for p in group["params"]:
            if optimizer.state.get(p):  # .get: the state is a defaultdict
                continue
            state = {}
            zeros = lambda: torch.zeros_like(p, memory_format=torch.preserve_format)  # noqa: E731
            if isinstance(optimizer, (torch.optim.SGD, LARS)):
                if not group["momentum"] and not isinstance(optimizer, LARS):
                    continue  # no state at all (LARS keeps its buffer whatever its momentum)
                if group.get("dampening", 0):
                    raise ValueError("fault-tolerant training: SGD with dampening has no "
                                     "zero-state equivalent of its first step; use "
                                     f"dampening=0, got {group['dampening']}")
                state["momentum_buffer"] = zeros()
            elif isinstance(optimizer, (torch.optim.Adam, torch.optim.AdamW)):
                on_device = group.get("capturable") or group.get("fused")
                state["step"] = torch.zeros((), dtype=torch.float32,
                                            device=p.device if on_device else "cpu")
                state["exp_avg"], state["exp_avg_sq"] = zeros(), zeros()
                if group.get("amsgrad"):
                    state["max_exp_avg_sq"] = zeros()
            elif isinstance(optimizer, LAMB):
                state["step"], state["exp_avg"], state["exp_avg_sq"] = 0, zeros(), zeros()
            else:
                raise ValueError(f"fault-tolerant training heals SGD, Adam, AdamW, LARS and "
                                 f"LAMB state, got {type(optimizer).__name__}")
            optimizer.state[p] = state


def weights_digest(parameters) -> bytes:
    """SHA-256 of the parameters' bytes, in order: what identical replicas share."""
    import hashlib

    return hashlib.sha256(b"".join(p.detach().cpu().contiguous().numpy().tobytes()
                                   for p in parameters)).digest()


def wait_for_nodes(store, nodes: int, timeout: timedelta, key: str = "thinwire/ft/started"
                   ) -> None:
    """Called once by local rank 0 of every node after its Manager exists: the first quorum
    waits until every node of the job heartbeats (else the first node to ask trains alone
    and the others join it by healing). A node that comes back later passes at once."""
    count = store.add(key, 1)
    limit = time.monotonic() + timeout.total_seconds()
    while count < nodes:
        if time.monotonic() > limit:
            raise TimeoutError(f"only {count} of {nodes} nodes started within "
                               f"{timeout.total_seconds():g} s")
        time.sleep(0.05)
        count = store.add(key, 0)


def own_address(peer: str) -> str:
    """This node's address on the route to ``peer`` (its interface on the cluster)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect((peer, 9))  # UDP: no packet is sent, only the route is chosen
        return probe.getsockname()[0]


def node_store(node_group, address: str, local_rank: int):
    """(the store, its port): the node's store for torchft (its quorums' cross-node groups
    meet through it), hosted by local rank 0 on ``address``, its port told to the node's other
    ranks (their store is None). Keep the store alive as long as the Manager."""
    import torch.distributed as dist

    store = dist.TCPStore(address, 0, is_master=True, wait_for_workers=False) \
        if local_rank == 0 else None
    port = torch.tensor([store.port if store is not None else 0])
    dist.broadcast(port, 0, group=node_group)
    return store, int(port)


NODE_SHARED = ("model", "optimizer", "scheduler")  # FaultTolerantStep.user_state's parts that
# every rank of a node holds alike (the SyncState differs by rank)


def node_shared(path: tuple) -> bool:
    """Whether a path of the Manager's state (``user/default/...``: torchft keeps the user
    state under the key ``default``) is one every rank of a node holds alike."""
    return len(path) >= 3 and path[0] == ("d", "user") and path[1] == ("d", "default") \
        and path[2] in {("d", part) for part in NODE_SHARED}


def build_manager(*, lighthouse: str, node: int, local_rank: int, ranks_per_node: int,
                  store_addr: str, store_port: int, hostname: str, timeout: timedelta,
                  user_state, load_user_state, min_nodes: int = 1, node_group=None):
    """The torchft Manager of one rank of node ``node``, with its cross-node process group and
    its checkpoint transport: ``(manager, pg, transport)``; hand the transport to
    :class:`FaultTolerantStep`, which opens its rounds. A synchronous quorum, healing through
    the data-only transport, no ``init_sync``: every node builds the same start from the same
    seed (:class:`FaultTolerantStep` checks it at the first step), so the first quorum moves
    nothing over the links (torchft's init_sync sent every node but the first the whole state:
    6.6 s of a 4 x 1 start at 100 Mbit/s, counted in the time to target where DDP's own
    start-up broadcast comes before training). With ``node_group`` (the node's ranks' group) a
    joining node fetches its model, optimizer and schedule once, split across its ranks
    (thinwire.ft.state_transfer); its ranks agree on that healing through the node's store."""
    import torch.distributed as dist
    from torchft import Manager, ProcessGroupGloo

    from thinwire.ft.state_transfer import DataOnlyTransport

    pg = ProcessGroupGloo(timeout=timeout)
    built = {}
    heal_store = None
    if node_group is not None and node_group.size() > 1:
        heal_store = dist.TCPStore(store_addr, store_port, is_master=False, timeout=timeout)
    # the transport measures a peer's header against this replica's own state (the Manager's
    # full state dict: torchft's private _manager_state_dict is the one call that returns it)
    transport = DataOnlyTransport(pg, timeout,
                                  own_state=lambda: built["manager"]._manager_state_dict(),
                                  node_group=node_group,
                                  node_shared=node_shared if node_group is not None else None,
                                  node_store=heal_store)
    manager = built["manager"] = Manager(
        pg=pg, checkpoint_transport=transport, load_state_dict=load_user_state,
        state_dict=user_state, min_replica_size=min_nodes, use_async_quorum=False,
        replica_id=f"node{node}", store_addr=store_addr, store_port=store_port,
        rank=local_rank, world_size=ranks_per_node, lighthouse_addr=lighthouse,
        hostname=hostname, timeout=timeout, quorum_timeout=timeout, init_sync=False)
    return manager, pg, transport


def topology(manager, pg, node_group, ranks_per_node: int, local_rank: int,
             timeout: timedelta | None = None) -> Topology:
    """The topology a fault-tolerant rank's SyncState uses; its node count and rank are set
    by each quorum (:meth:`FaultTolerantStep.begin`)."""
    inter = ReplicaGroup(manager, pg)
    return Topology(world_size=ranks_per_node, rank=local_rank, ranks_per_node=ranks_per_node,
                    world=HierarchicalWorld(node_group, inter, ranks_per_node),
                    intra=node_group, inter=inter, timeout=timeout)


class FaultTolerantStep:
    """The per-step protocol around one rank's training step (see the module's docstring).

    ``quorums``: (manager step, nodes) each time the node count changed, for the run's log."""

    def __init__(self, manager, topology: Topology, state, model, optimizer,
                 scheduler=None, count_departed_mass: bool = False, node: int | None = None,
                 job_nodes: int | None = None, transport=None):
        """``scheduler``: a learning-rate scheduler stepped once per committed step (healed
        with the rest, stepped only where the step commits). ``count_departed_mass``: every
        step, before the commit, all ranks share their residual mass (one small all-reduce
        over every node), so that when a node leaves, the survivors log what it took with it
        (``departures``); off by default, as it costs a cross-node round trip a step. It needs
        ``node``, this rank's node index (the K of its replica id ``nodeK``). ``job_nodes``:
        the job's node count; the schedule then follows :attr:`progress` (samples), else it
        steps once per committed step. ``transport``: the Manager's DataOnlyTransport
        (:func:`build_manager` returns it), told of each quorum and of its failure, so that a
        node's ranks healing together never wait on a rank whose quorum failed."""
        if count_departed_mass and node is None:
            raise ValueError("count_departed_mass needs node, this rank's node index")
        if job_nodes is not None and (isinstance(job_nodes, bool)
                                      or not isinstance(job_nodes, int) or job_nodes < 1):
            raise ValueError(f"job_nodes must be an integer >= 1, got {job_nodes!r}")
        self.job_nodes = job_nodes
        self.transport = transport
        check_algorithm(state.algorithm)
        self.manager, self.topology, self.state = manager, topology, state
        self.model, self.optimizer, self.scheduler = model, optimizer, scheduler
        self.local_rank = topology.local_rank
        materialize_optimizer_state(optimizer)
        self._snapshot = None
        self.quorums: list[tuple[int, int]] = []
        self.rolled_back = 0
        self.refused_heals = 0  # quorums in a row whose healing the transport refused
        self.count_departed_mass = count_departed_mass
        self.node = node
        self._pending_masses: dict[int, float] | None = None
        self._masses: dict[int, float] = {}  # node -> residual L1 at the last committed step
        self.evaluations = 0  # the run's evaluations so far (heals: see evaluation_due)
        self.last_commit_nodes = 0  # nodes of the last committed step (heals with the state)
        self.departures: list[dict] = []  # {"step", "node", "residual_l1"} of each node lost
        self.dropped_at_heals: list[dict] = []  # {"step", "residual_l1"} this node dropped

    # what a joining node takes from a live peer (the Manager's user state)
    def user_state(self) -> dict:
        state = {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                 "sync": self.state.healing_state_dict(),
                 "run": {"evaluations": self.evaluations,
                         "last_commit_nodes": self.last_commit_nodes}}
        if self.scheduler is not None:
            state["scheduler"] = self.scheduler.state_dict()
        return state

    def load_user_state(self, saved: dict) -> None:
        held = self.state.residual_mass()["l1"]  # what this node's own residual held
        self.model.load_state_dict(saved["model"])
        self.optimizer.load_state_dict(saved["optimizer"])
        self.state.load_state_dict(saved["sync"])
        if held:  # a node that heals (it rolled back a step the others committed) drops its
            # residual: part of it was applied by the steps it missed; logged, not kept
            log.warning("healing drops this node's residual (l1 %.4g): a healed node starts "
                        "with none", held)
            self.dropped_at_heals.append({"step": self.manager.current_step(),
                                          "residual_l1": held})
        self.evaluations = saved["run"]["evaluations"]
        self.last_commit_nodes = saved["run"]["last_commit_nodes"]
        if self.scheduler is not None:
            self.scheduler.load_state_dict(saved["scheduler"])

    @property
    def nodes(self) -> int:
        return self.topology.nodes

    @property
    def progress(self) -> float:
        """Full steps trained: the committed steps, each weighted by the share of the job's
        nodes in it (needs ``job_nodes``)."""
        if self.job_nodes is None:
            raise RuntimeError("progress counts samples: build the step with job_nodes")
        return self.manager.batches_committed() / self.job_nodes

    def evaluation_due(self, every: float) -> bool:
        """After :meth:`begin`: whether the run evaluates now, at this quorum's start: the
        full steps trained (:attr:`progress`) have passed a multiple of ``every`` since the
        last evaluation. Both the steps and the count of evaluations heal with the state, so
        every node of the quorum answers alike, and their evaluation's cross-node sum meets.
        (Evaluating after a commit did not: a node that committed a step another rolled back
        evaluated alone and waited on the others until the timeout.) A node whose healing
        failed answers from its own, older state; it has closed its cross-node group
        (:meth:`begin`), so the others' sum fails at once rather than waiting on it."""
        due = int(self.progress // every)
        if due <= self.evaluations:
            return False
        self.evaluations = due
        return True

    def sample_start(self, batch_size: int) -> int:
        """Where this rank's ``batch_size`` samples of the current step start in the run's
        sample stream (after :meth:`begin`): past every sample committed so far, the ranks of
        the quorum in order."""
        n = self.topology.ranks_per_node
        return (self.manager.batches_committed() * n + self.topology.rank) * batch_size

    def begin(self) -> None:
        if self.transport is not None:
            self.transport.next_round()
        try:
            self.manager.start_quorum()
        except BaseException:
            self._quorum_failed()
            raise
        error = self.manager.errored()
        if error is not None:
            self._quorum_failed()
        self._count_refused_heal(error)
        replica, count = self.manager.participating_rank(), self.manager.num_participants()
        if replica is None or count < 1:
            raise RuntimeError(f"node is not in the quorum (rank {replica}, {count} nodes): "
                               "a synchronous quorum always includes the nodes that join it")
        n = self.topology.ranks_per_node
        self.topology.world_size, self.topology.rank = count * n, replica * n + self.local_rank
        if not self.quorums or self.quorums[-1][1] != count:
            self.quorums.append((self.manager.current_step(), count))
            log.info("step %d: %d node(s) in the quorum", self.manager.current_step(), count)
        if self.manager.current_step() == 0:  # the same on every rank of the quorum
            self._check_same_start()
        self._snapshot = self.state.snapshot()

    def _count_refused_heal(self, error) -> None:
        """Count a quorum whose healing the state transfer refused (an UnsafeState among the
        reported error's causes), and end this node with it at HEAL_REFUSALS_MAX in a row."""
        from thinwire.ft.state_transfer import UnsafeState

        cause, refusal = getattr(error, "original_exception", error), None
        for _ in range(8):  # the error torchft reports may wrap the transport's
            if cause is None or isinstance(cause, UnsafeState):
                refusal = cause
                break
            cause = getattr(cause, "__cause__", None) or getattr(cause, "__context__", None)
        if refusal is None:
            self.refused_heals = 0
            return
        self.refused_heals += 1
        log.warning("healing refused (%d of %d in a row): %s", self.refused_heals,
                    HEAL_REFUSALS_MAX, refusal)
        if self.refused_heals >= HEAL_REFUSALS_MAX:
            raise UnsafeState(f"fault-tolerant training: this node's healing was refused at "
                              f"{self.refused_heals} quorums in a row ({refusal}); its state "
                              f"cannot take a live peer's form, so it leaves the job and the "
                              f"others go on without it") from refusal

    def _quorum_failed(self) -> None:
        """torchft reported this rank's quorum failed (it re-forms its groups and heals rank
        by rank; a failure there does not reach the node's other ranks): tell a node-mate that
        waits for this rank's part of a healing, and close this rank's cross-node group, so
        that a peer waiting on it there (a donor sending to it, an evaluation's sum) fails now,
        not at its timeout (the step itself will not commit)."""
        if self.transport is not None:
            self.transport.round_failed()
        self.topology.inter.abort()

    def _check_same_start(self) -> None:
        """Without torchft's init_sync the nodes must start alike: at the first step of the
        run (step 0) every rank's model digest must equal every other's (two 16-bit parts of
        a SHA-256, summed with their squares over the quorum: (sum v)^2 = n sum v^2 only where
        all are equal). A node that healed, or that joined later, took a peer's state."""
        from thinwire.collectives.primitives import all_reduce_sum

        digest = weights_digest(self.model.parameters())
        parts = [float(int.from_bytes(digest[i:i + 2], "little")) for i in (0, 2)]
        table = torch.tensor([1.0] + parts + [v * v for v in parts], dtype=torch.float64)
        all_reduce_sum(table, self.topology.world)
        if self.topology.inter.failed():
            return  # the step will not commit: step 0 comes again, and the check with it
        count = table[0]
        if any(table[1 + i] ** 2 != count * table[3 + i] for i in range(2)):
            raise RuntimeError(f"fault-tolerant training: the {int(count)} ranks of the "
                               f"quorum start from different weights (their model digests "
                               f"differ at step 0); build every node's model from the same "
                               f"seed, as thinwire train does")

    def _share_masses(self, node: int, nodes: int) -> dict[int, float] | None:
        """{node: its ranks' residual L1} over the quorum, or None where the exchange failed
        (the step will not commit). Each rank adds its own at its node's slot."""
        from thinwire.collectives.primitives import all_reduce_sum

        table = torch.zeros(2 * nodes, dtype=torch.float64)
        table[2 * self.topology.node] = self.state.residual_mass()["l1"]
        if self.topology.local_rank == 0:
            table[2 * self.topology.node + 1] = node + 1  # which node holds this slot
        all_reduce_sum(table, self.topology.world)
        if self.topology.inter.failed():
            return None
        return {int(table[2 * i + 1]) - 1: float(table[2 * i]) for i in range(nodes)}

    def _count_departures(self, node: int) -> None:
        masses = self._share_masses(node, self.topology.nodes)
        if masses is None:
            return
        for gone in sorted(set(self._masses) - set(masses)):
            self.departures.append({"step": self.manager.current_step(), "node": gone,
                                    "residual_l1": self._masses[gone]})
            log.warning("node %d left at step %d taking a residual of L1 %.6g with it (never "
                        "applied)", gone, self.manager.current_step(), self._masses[gone])
        self._pending_masses = masses

    def commit(self) -> bool:
        """Step the optimizer where the quorum commits; else undo the step's sync state.
        Returns whether it committed. The gradients are cleared either way."""
        if self._snapshot is None:
            raise RuntimeError("commit() without begin()")
        self._pending_masses = None
        if self.count_departed_mass:
            self._count_departures(self.node)
        committed = self.manager.should_commit()
        if committed:
            self.last_commit_nodes = self.nodes
            self.optimizer.step()
            if self.scheduler is not None:
                if self.job_nodes is not None:  # to the samples trained (torchft counted them)
                    self.scheduler.last_epoch = self.progress - 1
                self.scheduler.step()
            if self._pending_masses is not None:
                self._masses = self._pending_masses
        else:
            self.state.rollback(self._snapshot)
            self.rolled_back += 1
        self._snapshot = None
        self.optimizer.zero_grad(set_to_none=False)
        return committed
