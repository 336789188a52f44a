"""One rank of `thinwire bench diloco` (launched by the cluster launcher, torchrun environment).

Trains the same model from the same start on the same per-rank batches once per configuration:

* ``ddp``: DDP over all ranks with thinwire's ``allreduce`` hook (DDP's default all-reduce, with
  byte counters), every step;
* ``hitopk``: DDP with HiTopKComm, every step;
* ``diloco-H`` / ``diloco-hitopk-H`` / ``diloco-sparseloco-H``: DDP inside each node every
  step (its own group, no inter-node bytes), DiLoCo across nodes every H steps with a dense
  hierarchical all-reduce, HiTopKComm, or the SparseLoCo-style exchange (chunked top-k,
  quantised values, decayed error feedback; outer lr/momentum of its own) on the outer step.

Every configuration uses the same inner optimizer (AdamW). Held-out loss (bits per byte for the
byte-level LM) is measured every ``--eval-every`` steps outside the timed region. Time per step
is the slowest rank's; bytes are per rank, the busiest rank's. Rank 0 writes JSON to ``--out``.
"""

from __future__ import annotations

import argparse
import math
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import thinwire
from thinwire.bench.report import (add_collective_timeout, end_worker, init_worker_group,
                                   write_json_atomic)
from thinwire.local_sgd import DiLoCo, node_group
from thinwire.topology import Topology
from thinwire.train import data as data_sets
from thinwire.train import models


def _max(value: float, group) -> float:
    t = torch.tensor([value], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return float(t)


@torch.no_grad()
def _held_out(model, dataset, blocks: int) -> float:
    """Mean held-out cross-entropy, in bits per token (bits per byte for the byte LM)."""
    model.eval()
    x, y = dataset.test_x[:blocks], dataset.test_y[:blocks]
    loss, _, _ = models.loss_and_correct(model, x, y)
    model.train()
    return float(loss) / math.log(2)


# The outer step of each DiLoCo configuration of the benchmark (name DILOCO-KIND-H):
# (DiLoCo's algorithm settings, outer learning rate, outer momentum).
OUTER_RECIPES = {
    "diloco": lambda args: (dict(algorithm="hier_allreduce"), args.outer_lr,
                            args.outer_momentum),
    # chunked top-k, quantised, decayed error feedback
    "diloco-sparseloco": lambda args: (
        dict(algorithm="sparseloco", density=args.sparse_density,
             sync_options={"chunk": args.outer_chunk, "decay": args.outer_decay,
                           "bits": args.outer_bits or None}),
        args.sparse_outer_lr, args.sparse_outer_momentum),
    # one exchange every H steps: compress every bucket, however small
    "diloco-hitopk": lambda args: (
        dict(algorithm="hitopk", density=args.outer_density or args.density,
             sync_options={"dense_below_bytes": 0}),
        args.outer_lr, args.outer_momentum),
}


def check_config_name(name: str) -> tuple[str, int]:
    """A DiLoCo configuration's (recipe, H); a clear error naming the allowed ones."""
    kind, _, h = name.rpartition("-")
    if kind not in OUTER_RECIPES or not h.isdigit() or int(h) < 1:
        raise ValueError(f"--configs: unknown configuration {name!r}; allowed: ddp, hitopk, "
                         f"{', '.join(k + '-H' for k in OUTER_RECIPES)} (H an integer >= 1)")
    return kind, int(h)


def _build(name: str, args, topo: Topology, intra):
    """(model to train, inner optimizer, DiLoCo or None, SyncState that counts the bytes)."""
    net = models.build(args.model, seed=0)
    if name in ("ddp", "hitopk"):
        model = DDP(net)
        algorithm = "allreduce" if name == "ddp" else "hitopk"
        state = thinwire.ddp.register(model, algorithm, density=args.density, topology=topo)
        return model, torch.optim.AdamW(model.parameters(), lr=args.lr), None, state
    kind, h = check_config_name(name)
    model = DDP(net, process_group=intra)
    inner = torch.optim.AdamW(model.parameters(), lr=args.lr)
    outer, lr, momentum = OUTER_RECIPES[kind](args)
    diloco = DiLoCo(model, inner, sync_every=h, outer_lr=lr, outer_momentum=momentum,
                    fragments=args.fragments, overlap=args.overlap, topology=topo, **outer)
    return model, inner, diloco, diloco.state


def run_config(name: str, args, topo: Topology, intra, dataset) -> dict:
    model, opt, diloco, state = _build(name, args, topo, intra)
    rank, world = topo.rank, topo.world_size
    batches = []
    epoch = 0
    while len(batches) < args.steps:
        batches += data_sets.rank_batches(len(dataset.train_x), args.batch, rank, world, 0, epoch)
        epoch += 1
    curve, elapsed = [], 0.0
    dist.barrier(group=topo.world)
    start = time.perf_counter()
    for step in range(args.steps):
        index = batches[step]
        opt.zero_grad()
        loss, _, _ = models.loss_and_correct(model, dataset.train_x[index], dataset.train_y[index])
        loss.backward()
        opt.step()
        if diloco is not None:
            diloco.step()
        if (step + 1) % args.eval_every == 0 or step + 1 == args.steps:
            if diloco is not None and step + 1 == args.steps:
                diloco.flush()
            dist.barrier(group=topo.world)
            elapsed += time.perf_counter() - start
            curve.append({"step": step + 1, "seconds": _max(elapsed, topo.world),
                          "bits": _held_out(model.module, dataset, args.eval_blocks)})
            dist.barrier(group=topo.world)
            start = time.perf_counter()
    seconds = curve[-1]["seconds"]
    return {"config": name, "steps": args.steps, "seconds": seconds,
            "s_per_step": seconds / args.steps,
            "inter_bytes_per_step": _max(state.totals["bytes_inter"], topo.world) / args.steps,
            "outer_exchanges": state.steps if diloco is not None else None,
            "final_bits": curve[-1]["bits"], "curve": curve}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--model", default="transformer")
    parser.add_argument("--configs", nargs="+", required=True)
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--density", type=float, default=0.01)
    parser.add_argument("--outer-density", type=float, default=None,
                        help="density of the hitopk outer step (default: --density)")
    parser.add_argument("--outer-lr", type=float, default=0.7)
    parser.add_argument("--outer-momentum", type=float, default=0.9)
    parser.add_argument("--sparse-density", type=float, default=0.1)
    # the DiLoCo settings: checked by `thinwire bench diloco` (thinwire.bench.diloco)
    parser.add_argument("--outer-chunk", type=int, default=4096)
    parser.add_argument("--outer-bits", type=int, default=2, help="0 = float32 values")
    parser.add_argument("--outer-decay", type=float, default=0.95)
    parser.add_argument("--sparse-outer-lr", type=float, default=0.7)
    parser.add_argument("--sparse-outer-momentum", type=float, default=0.0)
    parser.add_argument("--fragments", type=int, default=1)
    parser.add_argument("--overlap", action="store_true")
    parser.add_argument("--eval-every", type=int, default=20)
    parser.add_argument("--eval-blocks", type=int, default=256)
    add_collective_timeout(parser)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    init_worker_group(args.collective_timeout)
    try:
        topo = Topology.build()
        intra = node_group(topo)
        dataset = data_sets.load(models.data_name(args.model))
        rows = []
        for name in args.configs:
            rows.append(run_config(name, args, topo, intra, dataset))
            if topo.rank == 0:
                print(f"bench diloco: {name} done: {rows[-1]['s_per_step']:.3f} s/step, "
                      f"{rows[-1]['final_bits']:.3f} bits", flush=True)
        if topo.rank == 0:
            write_json_atomic(args.out, {"rows": rows, "world_size": topo.world_size,
                                         "ranks_per_node": topo.ranks_per_node})
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    end_worker(main, "thinwire bench diloco")
