"""Fault-tolerant per-step training (thinwire.ft.per_step) of one run on `thinwire cluster run
--fault-tolerant`, where nodes may vanish and come back (`--fail`) while the others train on:
`thinwire train --fault-tolerant` (:func:`train`, a TrainConfig's run) and
`python -m thinwire.train.ft_job` (:func:`main`, a compare workload's run with compare's
recipe, and the torchft peer of `thinwire bench ft-cluster`).

Each node is its own torchrun world; ranks find torchft's Lighthouse and the job store through
the environment the launcher sets (`thinwire.cluster.coordinator`). The run counts samples, not
steps (thinwire.ft.per_step's ``job_nodes``): each step the ranks present take the next
batches of the run's one sample stream (`data.stream_batch`), so a node that is away leaves no
sample untrained, and each step averages over the ranks present; a step of k of N nodes is k/N
of a full step. The optimizer, its schedule (warm-up, cosine, over full steps) and the model's
start are `thinwire train`'s for the workload (`setup_run`), as compare runs it; the schedule
heals with the model. ``max_steps`` and ``eval_every`` count full steps. The torchft peer
trains as torchft's examples do: every process its own shard, a step per step.

Every ``eval_every`` full steps the nodes evaluate on the test set, split over the quorum's
ranks and summed over the nodes (:func:`_evaluate`), at the start of the next step, after its
quorum: there every node of the quorum holds the same steps (a node that rolled back a step
another committed has healed) and the same count of evaluations (it heals too), so they
evaluate together (``FaultTolerantStep.evaluation_due``).
Committed steps leave every node with the same model, so every node measures the same value at
the same step; with ``stop_at_target`` the nodes stop together at the first evaluation that
reaches the target (else at the last step). Each node keeps `thinwire train`'s accounting
(`thinwire.train.metrics.Metrics`: training time is its steps' time, evaluation excluded;
node 0's local rank 0 writes ``--metrics``). Each node's local rank 0 writes its record:
`thinwire train`'s summary (curve, time to target, stop reason, pace) with the quorums it saw,
its committed and rolled-back steps, when it joined and a digest of its weights (ft_job:
``OUT/node<i>.json`` on every node; train: ``--summary`` on node 0). A node that came back
writes there when it finishes (the file of its earlier life is replaced), its record starting
at its return.
"""

from __future__ import annotations

import argparse  # noqa: E402
import dataclasses  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
from datetime import timedelta  # noqa: E402
from pathlib import Path  # noqa: E402

import time  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import thinwire  # noqa: E402
from thinwire.train import fast_start  # noqa: E402
from thinwire.cluster.coordinator import LIGHTHOUSE_ENV, NODE_ENV, STORE_ENV  # noqa: E402
from thinwire.ft import per_step  # noqa: E402
from thinwire.output import write_json_atomic  # noqa: E402
from thinwire.train import data as data_sets  # noqa: E402
from thinwire.train import ft_ddp_peer, models, quality, race_config, workloads  # noqa: E402
from thinwire.train.grad_sync import hook_settings  # noqa: E402
from thinwire.train.config import TrainConfig  # noqa: E402
from thinwire.train.loop import evaluate, say_training_started, setup_run  # noqa: E402
from thinwire.train.metrics import Metrics  # noqa: E402


DONE_KEY = "thinwire/ft/target_reached"


def process_started_at() -> float:
    """When this process was created (wall clock, ~10 ms): before the interpreter imported
    anything (``python -m`` imports the package, torch with it, before this module runs)."""
    with open("/proc/self/stat") as f:
        ticks = int(f.read().rsplit(")", 1)[1].split()[19])  # field 22, starttime
    with open("/proc/uptime") as f:
        uptime = float(f.read().split()[0])
    return time.time() - (uptime - ticks / os.sysconf("SC_CLK_TCK"))


STARTED_AT = process_started_at()


REJOIN_GLOB = "rejoin_node*.json"


def write_rejoin(out: Path, node: int, timeline: dict) -> Path:
    """A returning node's rejoin, as soon as its first quorum healed it (``out``, next to the
    nodes' summaries): the summary holds only the last process's, and a node killed again
    before the end writes none. Seconds from this process's creation to each stage's end."""
    path = out / f"rejoin_node{node}_{os.getpid()}.json"
    write_json_atomic(path, {"node": node, "started_at": STARTED_AT,
                             "timeline_s": {k: v - STARTED_AT for k, v in timeline.items()}})
    return path


def main(argv: list[str] | None = None) -> int:
    timeline = {"imported": time.time()}  # when each stage of joining ended (wall clock)
    p = argparse.ArgumentParser(prog="python -m thinwire.train.ft_job")
    p.add_argument("--workload", default="mnist", choices=list(workloads.WORKLOADS))
    p.add_argument("--algorithm", default="hitopk", help=", ".join(per_step.ALGORITHMS))
    p.add_argument("--density", type=float, default=None,
                   help="top-k density (default: the workload's sparse setting)")
    p.add_argument("--target", type=float, default=None, help="default: the workload's")
    p.add_argument("--model", default=None, choices=list(models.MODELS),
                   help="another model (and its data) than the workload's, e.g. mlp for a "
                        "quick check")
    p.add_argument("--eval-every", type=int, default=0, help="default: the workload's")
    p.add_argument("--max-steps", type=int, default=2000)
    p.add_argument("--finish-with-every-node", action="store_true",
                   help="past --max-steps, go on until a step commits with every node in the "
                        "quorum (a node away comes back before the end: for tests)")
    p.add_argument("--timeout", type=float, default=30.0,
                   help="seconds a collective or a quorum waits")
    p.add_argument("--peer", choices=ft_ddp_peer.PEERS, default=None,
                   help="train with this peer instead of thinwire's algorithms: "
                        "torchft-ddp-fp16 is torchft's fault-tolerant DDP, fp16 gradients, "
                        "every process its own replica group (--algorithm and --density "
                        "do not apply)")
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    per_step.check_algorithm(args.algorithm)
    if args.peer and args.density is not None:
        raise SystemExit(f"--density applies to thinwire's algorithms, not --peer {args.peer}")
    if args.eval_every < 0 or args.max_steps < 1:
        raise SystemExit(f"--eval-every must be >= 0 and --max-steps >= 1, got "
                         f"{args.eval_every} and {args.max_steps}")
    overrides = {**({"model": args.model} if args.model else {}),
                 **({"density": args.density} if args.density is not None else {}),
                 "collective_timeout_s": args.timeout, "fault_tolerant": True}
    # compare's recipe for the workload (its optimizer, warm-up and cosine schedule, batches)
    cfg = race_config.run_config(args.workload, "allreduce" if args.peer else args.algorithm,
                                 overrides, ranks_per_node=1, target=args.target, budget_s=0.0,
                                 eval_every=args.eval_every).validate()
    return _run(cfg, timeline, out=Path(args.out), peer=args.peer, max_steps=args.max_steps,
                finish_with_every_node=args.finish_with_every_node)


def train(cfg: TrainConfig) -> dict:
    """`thinwire train --fault-tolerant`: ``cfg`` (validated) run with fault-tolerant per-step
    synchronisation; node 0's local rank 0 writes ``cfg.summary``. Returns its record on the
    ranks that write one, else an empty dict."""
    record = {}
    _run(cfg, {"imported": time.time()}, summary=cfg.summary, record=record)
    return record


def _run(cfg: TrainConfig, timeline: dict, *, out: Path | None = None,
         summary: str | None = None, peer: str | None = None, max_steps: int = 0,
         finish_with_every_node: bool = False, record: dict | None = None) -> int:
    lighthouse, store_at = os.environ.get(LIGHTHOUSE_ENV), os.environ.get(STORE_ENV)
    if not lighthouse or not store_at:
        raise SystemExit(f"{LIGHTHOUSE_ENV} / {STORE_ENV} are not set: run this under "
                         "`thinwire cluster run --fault-tolerant`")
    node, nodes = int(os.environ[NODE_ENV]), int(os.environ["THINWIRE_NODES"])
    timeout = timedelta(seconds=cfg.collective_timeout_s)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=timeout)
    timeline["node_group"] = time.time()
    n, local = dist.get_world_size(), dist.get_rank()
    node_group = dist.new_group(list(range(n)), timeout=timeout)
    store_host, store_port = store_at.rsplit(":", 1)
    address = per_step.own_address(store_host)
    place, world = node * n + local, nodes * n  # this rank's shard of the full cluster's data
    if not peer:  # torch's compiler import (1-2 s) while this process waits on the network
        fast_start.skip_compiler_import()
    dataset, model, steps_per_epoch, total_steps, optimizer, scheduler = setup_run(
        cfg, place, world, torch.device("cpu"))
    eval_every = cfg.eval_every or steps_per_epoch
    max_steps = max_steps or cfg.max_iters or total_steps
    timeline["model_and_data"] = time.time()
    # on a thread while this process waits on the network (its main thread imports none of
    # what the compiler imports meanwhile: torchft, the healing's transport)
    compiler_import = None if peer else fast_start.import_compiler_in_background()
    job = dist.TCPStore(store_host, int(store_port), is_master=False, timeout=timeout)
    params = list(model.parameters())
    if peer:
        ft = ft_ddp_peer.TorchftDDPStep(lighthouse=lighthouse, place=place, address=address,
                                        timeout=timeout, model=model, optimizer=optimizer,
                                        scheduler=scheduler, ranks_per_node=n)
        manager, forward, state = ft.manager, ft.ddp, None
        timeline["manager"] = time.time()
        per_step.wait_for_nodes(job, nodes * n, timeout)  # every process is a replica group
    else:
        ft, manager, forward, state = _thinwire_step(cfg, node, nodes, n, local, lighthouse,
                                                     node_group, address, timeout, model,
                                                     optimizer, scheduler, timeline)
        if local == 0:
            per_step.wait_for_nodes(job, nodes, timeout)
    dist.barrier(group=node_group)
    if job.check([DONE_KEY]):  # came back after the others reached the target: nothing to do
        if compiler_import is not None:  # not torn down by the interpreter's exit mid-import
            compiler_import.join(timeout.total_seconds())
        manager.shutdown(wait=False)
        dist.destroy_process_group()
        return 0
    began = timeline["start_barrier"] = time.time()
    if node == 0 and local == 0:
        say_training_started()  # where --fail counts from the start of training
    batches, epoch = [], 0  # the peer's: its own shard's
    events, joined_at = [], None
    # thinwire train's accounting: the metrics file (node 0's local rank 0: compare follows
    # it), the evaluations' curve and the summary's numbers; each node keeps its own
    quiet = dataclasses.replace(cfg, summary=None)  # the summary is written with the record
    # no steps per epoch: each evaluation is given its epoch, from the full steps trained
    metrics = Metrics(quiet, place, world, max_steps)
    met = quality.check_metric(metrics.metric)

    def full_steps() -> float:
        return manager.current_step() if peer else ft.progress

    def evaluated() -> bool:
        """Evaluate the model as it stands and record it; whether the run stops there."""
        accuracy, loss_value = _evaluate(cfg, model, dataset, ft, peer)
        metrics.record_eval(manager.current_step(), full_steps() / steps_per_epoch, accuracy,
                            loss_value)
        metrics.curve[-1].update(full_steps=full_steps(), nodes=ft.nodes)
        return bool(metrics.stop_reason)

    def at_the_end() -> bool:
        if full_steps() < max_steps:
            return False
        if not finish_with_every_node:
            return True
        if peer:
            return bool(events and events[-1][3] and ft.nodes == nodes)
        return ft.last_commit_nodes == nodes  # healed: alike on every node of the quorum
    try:
        while True:
            # the peer's quorum is asynchronous (its step may move while it heals): the peer
            # decides before it, as it evaluates after its commit (each process alone)
            if peer and at_the_end():
                break
            tick = time.time()
            ft.begin()
            if joined_at is None:
                joined_at = timeline["first_quorum"] = time.time()
                healings = getattr(ft.transport, "healings", None) if not peer else None
                if healings:  # the quorum took it in at the healing's start
                    timeline["in_quorum"], timeline["healed"] = healings[0]
                    if out is not None and local == 0:  # this return's own record
                        write_rejoin(out, node, timeline)
                metrics.start_timing(None)
            # thinwire's nodes evaluate the steps committed up to the last quorum at this
            # one's start, where every node of the quorum holds them (a node that rolled back
            # a step another committed has healed, and its count of evaluations with it), so
            # they evaluate together and stop together
            if not peer:
                if ft.evaluation_due(eval_every):
                    spent = time.time()
                    if evaluated():
                        break
                    tick += time.time() - spent  # the evaluation is not the step's time
                if at_the_end():
                    break
            step = manager.current_step()
            if peer:
                while len(batches) <= step:
                    batches += data_sets.rank_batches(len(dataset.train_x), cfg.batch_size,
                                                      place, world, cfg.seed, epoch)
                    epoch += 1
                index = batches[step]
            else:
                index = data_sets.stream_batch(len(dataset.train_x), cfg.seed,
                                               ft.sample_start(cfg.batch_size), cfg.batch_size)
            loss, _, _ = models.loss_and_correct(forward, dataset.train_x[index],
                                                 dataset.train_y[index])
            loss.backward()
            if state is not None:
                thinwire.synchronize(params, state)
            done = ft.commit()
            events.append((time.time(), step, ft.nodes, done))
            if not done:
                metrics.add_overhead(time.time() - tick)  # a rolled-back step: time, no step
                continue
            before = full_steps() - (1 if peer else 0)  # the peer: a step per step
            metrics.record_step(manager.current_step(), int(full_steps() // steps_per_epoch),
                                time.time() - tick, loss.detach(),
                                optimizer.param_groups[0]["lr"])
            if peer and full_steps() // eval_every > before // eval_every and evaluated():
                break
        job.set(DONE_KEY, str(manager.current_step()))  # a node back from now on has no job
        metrics.stop_timing(None, None, None)  # collective over the node's ranks
        reached = next((point for point in metrics.curve
                        if metrics.target is not None
                        and met.reached(point[metrics.metric], metrics.target)), None)
        if local == 0 and (out is not None or (summary and node == 0)):
            result = {
                **metrics.summary(quiet, manager.current_step(),
                                  sum(p.numel() for p in params), stopped=False),
                "node": node, "algorithm": peer or cfg.algorithm, "reached": reached,
                "step": manager.current_step(), "full_steps": full_steps(),
                "committed": sum(e[3] for e in events),
                "rolled_back": ft.rolled_back, "quorums": ft.quorums,
                "departures": ft.departures,
                "dropped_at_heals": getattr(ft, "dropped_at_heals", []),  # DDP's peer: none
                "started_at": STARTED_AT, "began_at": began,
                "joined_at": joined_at,
                "timeline_s": {k: v - STARTED_AT for k, v in timeline.items()},
                "events": events,
                # every node that trained to the end holds the same weights: compared by digest
                "weights_sha256": per_step.weights_digest(params).hex()}
            write_json_atomic(out / f"node{node}.json" if out is not None else summary, result)
            if record is not None:
                record.update(result)
        metrics.close()
    finally:
        manager.shutdown(wait=False)
        dist.destroy_process_group()
    return 0




def _evaluate(cfg, model, dataset, ft, peer) -> tuple[float, float]:
    """thinwire train's evaluation, split over every rank of the quorum just formed and summed
    over its nodes (each node evaluating the whole test set cost N times the work: 4 nodes
    side by side on the emulator's 2 cores took about half a 4 x 1 run's time). Where the sum
    fails (a node lost since the quorum), the node's ranks evaluate the whole set themselves:
    the same counts, so every node takes the same stop decision. The torchft peer's nodes
    each evaluate the whole set (its process group is its node's)."""
    cpu = torch.device("cpu")
    if peer:
        return evaluate(cfg, model, dataset, cpu)
    topology = ft.topology
    accuracy, loss = evaluate(cfg, model, dataset, cpu, share=(topology.rank,
                                                                topology.world_size),
                              group=topology.world)
    # each local rank sums over its own cross-node group: the node's ranks agree on the outcome
    failed = torch.tensor([float(topology.inter.failed())])
    dist.all_reduce(failed, op=dist.ReduceOp.MAX)  # this process's group: its node's
    if failed.item():
        return evaluate(cfg, model, dataset, cpu)  # the node's ranks share the test set
    return accuracy, loss


def _thinwire_step(cfg, node, nodes, n, local, lighthouse, node_group, address, timeout,
                   model, optimizer, scheduler, timeline):
    """thinwire's fault-tolerant step: (FaultTolerantStep, its Manager, the model to run
    forward, its SyncState); the node is the replica group."""
    store, port = per_step.node_store(node_group, address, local)
    holder = {}
    manager, pg, transport = per_step.build_manager(
        lighthouse=lighthouse, node=node, local_rank=local, ranks_per_node=n,
        store_addr=address, store_port=port, hostname=address, timeout=timeout,
        user_state=lambda: holder["ft"].user_state(),
        load_user_state=lambda s: holder["ft"].load_user_state(s),
        node_group=node_group)
    topo = per_step.topology(manager, pg, node_group, n, local, timeout)
    timeline["manager"] = time.time()
    # the run's settings, as `thinwire train` hands them to its hook
    state = thinwire.SyncState(topo, cfg.algorithm, **hook_settings(cfg))
    ft = holder["ft"] = per_step.FaultTolerantStep(manager, topo, state, model, optimizer,
                                                   scheduler, job_nodes=nodes,
                                                   transport=transport)
    ft.node_store = store  # torchft's cross-node groups meet through it: alive with the step
    return ft, manager, model, state


if __name__ == "__main__":
    sys.exit(main())
