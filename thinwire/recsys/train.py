"""Training and evaluation of the recommender models: one rank of a cluster run, or one process.

Run by the launcher (`thinwire recsys train`, `thinwire bench des`) as
``python -m thinwire.recsys.train --out rows.json --models fm --methods des ps ...``: every
rank trains each (model, method) on its slice of the same global batches, then the test set is
scored (each rank a slice) and rank 0 writes one row per (model, method): bytes per step (mean
over ranks, from the counters), samples/s (global samples over the slowest rank's training
time) and AUC. `train_single` trains the unsharded reference model on the same batches.
"""

from __future__ import annotations

import argparse
import logging
import time

import numpy as np
import torch
import torch.distributed as dist

from thinwire.cliargs import integer, number
from thinwire.recsys.data import DATASETS, Dataset, rank_batches, synthetic

log = logging.getLogger(__name__)


def load(dataset: str, samples: int = 200_000, fields: int = 16, vocab: int = 100_000,
         multi_hot: float = 8.0, seed: int = 0, zipf: float = 1.1) -> tuple[Dataset, Dataset]:
    """(train, test): 80/20, seeded."""
    if dataset == "synthetic":
        data = synthetic(samples, fields, vocab, multi_hot, zipf=zipf, seed=seed)
    elif dataset in DATASETS:
        data = DATASETS[dataset]()
    else:
        raise ValueError(f"dataset must be one of {sorted(DATASETS) + ['synthetic']}, "
                         f"got {dataset!r}")
    return data.split(0.2, seed)


def _scores(predict, test: Dataset, rank: int, world: int, batch: int) -> np.ndarray:
    """This rank's slice of the test set, scored in batches of equal count on every rank."""
    share = np.array_split(np.arange(len(test)), world)[rank]
    steps = -(-max(len(s) for s in np.array_split(np.arange(len(test)), world)) // batch)
    out = []
    for i in range(steps):
        chunk = share[i * batch:(i + 1) * batch]
        if len(chunk) == 0:  # still a collective: send a one-sample dummy and drop it
            predict(test.batch(share[:1]))
            continue
        out.append(torch.sigmoid(predict(test.batch(chunk))).numpy())
    return np.concatenate(out) if out else np.empty(0)


def train_method(model_name: str, method_name: str, train: Dataset, test: Dataset, args,
                 comm) -> dict:
    from thinwire.recsys.baselines import make_method
    from thinwire.recsys.models import make_model, roc_auc

    comm.counter.reset()  # one counter per run of a method
    model = make_model(model_name, train.num_fields, k=args.k, hidden=tuple(args.hidden),
                       seed=args.seed)
    method = make_method(method_name, model, comm, train.num_rows, args.optimizer, args.lr,
                         seed=args.seed)
    steps, elapsed, loss_sum = 0, 0.0, 0.0
    for epoch in range(args.epochs):
        for batch in rank_batches(train, args.batch, comm.rank, comm.world, epoch, args.seed):
            if comm.world > 1:
                dist.barrier()
            start = time.perf_counter()
            _, loss = method.train_step(batch, args.batch)
            elapsed += time.perf_counter() - start
            loss_sum += loss
            steps += 1
            if args.max_steps and steps >= args.max_steps:
                break
    sent = method.counter.total / max(steps, 1)
    # what the paper counts: model values only (rows or partials, their gradients, dense
    # gradients), without the ids and input values that tell owners what to look up
    payload = (method.counter.total - method.counter.bytes.get("ids", 0.0)) / max(steps, 1)
    scores = _scores(method.predict, test, comm.rank, comm.world, args.batch // comm.world)
    if comm.world > 1:
        stats = torch.tensor([sent, elapsed, payload], dtype=torch.float64)
        gathered = [torch.zeros_like(stats) for _ in range(comm.world)]
        dist.all_gather(gathered, stats)
        sent = float(sum(g[0] for g in gathered)) / comm.world
        elapsed = float(max(g[1] for g in gathered))
        payload = float(sum(g[2] for g in gathered)) / comm.world
        parts = [None] * comm.world
        dist.all_gather_object(parts, scores)
        scores = np.concatenate(parts)
    labels = test.labels[np.concatenate(np.array_split(np.arange(len(test)), comm.world))]
    return {"model": model_name, "method": method_name, "steps": steps,
            "bytes_per_iter": sent, "payload_bytes_per_iter": payload, "bytes_by_kind": dict(method.counter.bytes),
            "samples_per_s": steps * args.batch / elapsed if elapsed else float("nan"),
            "train_loss": loss_sum / max(steps, 1), "auc": roc_auc(labels, scores)}


def train_single(model_name: str, train: Dataset, test: Dataset, args) -> dict:
    """The unsharded single-process model on the same global batches (the AUC reference)."""
    from thinwire.recsys.models import (ReferenceModel, dense_optimizer, make_model, roc_auc)
    from thinwire.recsys.sharded import SparseOptimizer

    model = make_model(model_name, train.num_fields, k=args.k, hidden=tuple(args.hidden),
                       seed=args.seed)
    ref = ReferenceModel(model, train.num_rows, seed=args.seed)
    sparse, dense = SparseOptimizer(args.optimizer, args.lr), \
        dense_optimizer(model, args.optimizer, args.lr)
    steps, start = 0, time.perf_counter()
    for epoch in range(args.epochs):
        for batch in rank_batches(train, args.batch, 0, 1, epoch, args.seed):
            ref.train_step(batch, sparse, dense)
            steps += 1
            if args.max_steps and steps >= args.max_steps:
                break
    elapsed = time.perf_counter() - start
    with torch.no_grad():
        scores = _scores(lambda b: ref.forward(b)[0], test, 0, 1, args.batch)
    return {"model": model_name, "method": "single_process", "steps": steps,
            "bytes_per_iter": 0.0, "samples_per_s": steps * args.batch / elapsed,
            "auc": roc_auc(test.labels, scores)}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dataset", default="movielens",
                        choices=sorted(DATASETS) + ["synthetic"], help="data set to train on")
    parser.add_argument("--models", nargs="+", default=["fm"],
                        choices=["lr", "fm", "wide_deep", "deepfm"], help="recommender models")
    parser.add_argument("--methods", nargs="+", default=["des"],
                        choices=["des", "ps", "torchrec_tw", "torchrec_rw"],
                        help="embedding placements")
    parser.add_argument("--epochs", type=integer(1), default=1, help="training epochs")
    parser.add_argument("--max-steps", type=integer(0), default=0, help="0: whole epochs")
    parser.add_argument("--batch", type=integer(1), default=1024, help="global batch size")
    parser.add_argument("--k", type=integer(1), default=8, help="embedding size")
    parser.add_argument("--hidden", type=integer(1), nargs="*", default=[64, 32],
                        help="MLP layer widths (each >= 1; none: no hidden layer)")
    parser.add_argument("--optimizer", default="adagrad", choices=["sgd", "adagrad"],
                        help="optimizer of the embeddings and the dense part")
    parser.add_argument("--lr", type=number(0, 1e3, low_open=True), default=0.05,
                        help="learning rate")
    parser.add_argument("--seed", type=int, default=0,
                        help="seed of the initial weights and the data order")
    add_synthetic_arguments(parser)


SYNTHETIC_OPTIONS = ("samples", "fields", "vocab", "multi_hot", "zipf")


def add_synthetic_arguments(parser: argparse.ArgumentParser, samples: int = 200_000) -> None:
    """The synthetic generator's options (SYNTHETIC_OPTIONS), shared with `bench des`."""
    parser.add_argument("--samples", type=integer(1), default=samples, help="synthetic: samples")
    parser.add_argument("--fields", type=integer(1), default=16, help="synthetic: fields")
    parser.add_argument("--vocab", type=integer(1), default=100_000,
                        help="synthetic: ids per field")
    parser.add_argument("--multi-hot", type=number(0, 1e4, low_open=True), default=8.0,
                        help="synthetic: mean ids per field")
    parser.add_argument("--zipf", type=number(1, 100, low_open=True), default=1.1,
                        help="synthetic: Zipf exponent of the ids (> 1; closer to 1, fewer repeats)")


def main(argv: list[str] | None = None) -> None:
    from thinwire.output import write_json_atomic
    from thinwire.recsys.comm import Comm

    parser = argparse.ArgumentParser(prog="python -m thinwire.recsys.train")
    add_arguments(parser)
    parser.add_argument("--out", help="JSON rows (written by rank 0)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)  # ranks share the machine's cores
    dist.init_process_group("gloo")
    comm = Comm()
    logging.basicConfig(level=logging.INFO,
                        format=f"%(asctime)s rank{comm.rank} %(levelname)s: %(message)s")
    train, test = load(args.dataset, args.samples, args.fields, args.vocab, args.multi_hot,
                       args.seed, args.zipf)
    rows = []
    for model_name in args.models:
        for method_name in args.methods:
            row = train_method(model_name, method_name, train, test, args, comm)
            row.update(dataset=args.dataset, world=comm.world)
            rows.append(row)
            if comm.rank == 0:
                log.info("%s %s: %.0f bytes/step, %.0f samples/s, AUC %.4f", model_name,
                         method_name, row["bytes_per_iter"], row["samples_per_s"], row["auc"])
    if comm.rank == 0 and args.out:
        write_json_atomic(args.out, {"rows": rows, "args": vars(args)})
    dist.destroy_process_group()


if __name__ == "__main__":
    from thinwire.rank_exit import exit_rank

    main()
    exit_rank()
