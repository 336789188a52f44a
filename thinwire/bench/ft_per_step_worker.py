"""One rank of a fault-tolerant per-step run (thinwire.ft.per_step), as a process of its own:
each node is its own torchrun-like world (a gloo group of its ranks on its own port), the
nodes meet only through torchft's Lighthouse. Started by thinwire.bench.ft_per_step (the
benchmark and tests/distributed/test_ft_per_step.py). It trains a small float64 MLP on
batches fixed by (step, rank), so a retried step sees the same data, and writes its final
weights, momentum, quorums and the wall-clock time of each event as JSON.

``--die-at STEP``: every rank of this node exits (status 17) when its first cross-node
collective of that step starts: a node lost in the inter-node phase, mid-step.
``--die-healing``: every rank of this node exits when it starts to receive a live peer's
state: a node lost while it heals (its donor is sending).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

import thinwire
from thinwire.ft import per_step
from thinwire.ft.groups import ReplicaGroup
from thinwire.output import write_json_atomic
from thinwire.train.ft_job import process_started_at

STARTED_AT = process_started_at()  # "its processes starting", in issue #32's terms

DIE_STATUS = 17


def _batch(step: int, rank: int, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A batch fixed by (step, rank): a retried step sees the same data."""
    g = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randn(16, width, generator=g, dtype=torch.float64)
    return x, (x.sum(dim=1, keepdim=True) > 0).to(torch.float64)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--node", type=int, required=True)
    p.add_argument("--local-rank", type=int, required=True)
    p.add_argument("--ranks-per-node", type=int, required=True)
    p.add_argument("--nodes", type=int, required=True)
    p.add_argument("--node-port", type=int, required=True)
    p.add_argument("--lighthouse", required=True)
    p.add_argument("--job-store-port", type=int, required=True)
    p.add_argument("--algorithm", required=True)
    p.add_argument("--steps", type=int, required=True, help="stop at this committed step "
                   "once every node is back in the quorum")
    p.add_argument("--max-steps", type=int, default=5000)
    p.add_argument("--die-at", type=int, default=-1)
    p.add_argument("--die-healing", action="store_true")
    p.add_argument("--seed", type=int, default=0, help="the model's seed (every node's the "
                   "same, as a run's: another one on a node is refused at the first step)")
    p.add_argument("--count-departed-mass", action="store_true",
                   help="log what a lost node's residual held (and write this rank's residual "
                        "L1 after each committed step to OUT.mass.PID, the test's reference)")
    p.add_argument("--device", default="cpu", help="cpu or cuda: where the model and its "
                   "gradients live (the groups stay gloo: a CUDA tensor crosses them as it is)")
    p.add_argument("--out", required=True)
    args = p.parse_args()
    device = torch.device(args.device)
    n, local = args.ranks_per_node, args.local_rank
    timeout = timedelta(seconds=20)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{args.node_port}",
                            rank=local, world_size=n, timeout=timeout)
    node_group = dist.new_group(list(range(n)), timeout=timeout)
    store, port = per_step.node_store(node_group, "127.0.0.1", local)  # noqa: F841 - alive

    # every node from the same seed, as `thinwire train` starts them: torchft heals local rank
    # j from local rank j of a live node, and the source node may differ from one j to another
    torch.manual_seed(args.seed)
    width = 12
    model = torch.nn.Sequential(torch.nn.Linear(width, 16), torch.nn.Tanh(),
                                torch.nn.Linear(16, 1)).double().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    holder = {}
    if args.die_healing:
        from thinwire.ft.state_transfer import DataOnlyTransport

        def dying_recv(self, src_rank, metadata, step, timeout):
            os._exit(DIE_STATUS)
        DataOnlyTransport.recv_checkpoint = dying_recv
    manager, pg, transport = per_step.build_manager(
        lighthouse=args.lighthouse, node=args.node, local_rank=local, ranks_per_node=n,
        store_addr="127.0.0.1", store_port=port, hostname="127.0.0.1", timeout=timeout,
        user_state=lambda: holder["ft"].user_state(),
        load_user_state=lambda s: holder["ft"].load_user_state(s),
        node_group=node_group)
    topo = per_step.topology(manager, pg, node_group, n, local, timeout)
    if local == 0:
        job = dist.TCPStore("127.0.0.1", args.job_store_port, is_master=False, timeout=timeout)
        per_step.wait_for_nodes(job, args.nodes, timeout)
    dist.barrier(group=node_group)
    if args.die_at >= 0:  # vanish at this step's first cross-node collective
        inter = topo.inter
        for name in ("all_gather_into", "all_reduce_sum"):
            def dying(*tensors, original=getattr(ReplicaGroup, name)):
                if manager.current_step() == args.die_at:
                    os._exit(DIE_STATUS)
                original(inter, *tensors)
            setattr(inter, name, dying)
    state = thinwire.SyncState(topo, args.algorithm, density=0.25, dense_below_bytes=0)
    ft = holder["ft"] = per_step.FaultTolerantStep(
        manager, topo, state, model, optimizer, count_departed_mass=args.count_departed_mass,
        node=args.node, transport=transport)
    params = list(model.parameters())
    committed = attempts = 0
    events = []  # (wall time, manager step, nodes, committed)
    in_quorum_at = None
    try:
        while attempts < args.max_steps:
            attempts += 1
            ft.begin()
            if in_quorum_at is None:
                in_quorum_at = time.time()
            step = manager.current_step()
            x, y = (t.to(device) for t in _batch(step, topo.rank, width))
            torch.nn.functional.mse_loss(model(x), y).backward()
            thinwire.synchronize(params, state)
            done = ft.commit()
            committed += done
            if done and args.count_departed_mass:
                # per process (a node that comes back is another process, same --out)
                write_json_atomic(f"{args.out}.mass.{os.getpid()}",
                                  {"step": manager.current_step(),
                                   "l1": state.residual_mass()["l1"]})
            events.append((time.time(), step, ft.nodes, done))
            # a committed step with every node in the quorum, past the goal: every node of
            # that quorum sees the same and stops after the same step
            if done and manager.current_step() >= args.steps and ft.nodes == args.nodes:
                break
        result = {
            "node": args.node, "local_rank": local, "step": manager.current_step(),
            "committed": committed, "attempts": attempts, "rolled_back": ft.rolled_back,
            "quorums": ft.quorums, "started_at": STARTED_AT, "in_quorum_at": in_quorum_at,
            "events": events,
            "params": [p.detach().cpu().flatten().tolist() for p in params],
            "momentum": [optimizer.state[p]["momentum_buffer"].cpu().flatten().tolist()
                         for p in params if "momentum_buffer" in optimizer.state[p]],
            "sync_steps": state.steps, "departures": ft.departures,
            "residual_mass": float(sum(r.abs().sum() for r in
                                       state.feedback.residuals.values()))
            if state.feedback.residuals else 0.0}
        write_json_atomic(args.out, result)
    finally:
        manager.shutdown(wait=False)
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
