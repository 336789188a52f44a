"""`thinwire bench cpr`: checkpoint overhead and model quality of full recovery, partial
recovery, CPR-MFU and CPR-SSU under seeded failures (single-process emulation).

Every method trains the same model on the same global batches with N_emb in-process embedding
shards (thinwire.recsys.cpr.trainer); the clock is emulated with a production-like time model
(MTBF 20 h, saving/loading every shard 3 min, rescheduling 2 min) scaled so that the run lasts
`--mtbfs` MTBFs of failure-free time. Checkpoints are real files (atomic, checksummed). Rows:
overhead (saving + loading + rescheduling + redone work) as a fraction of failure-free time,
the paper's formula at the same interval, PLS measured and from the formula, test AUC and
log-loss; means over `--seeds` failure schedules (full recovery's model is exact, so its AUC
does not depend on the schedule).
"""

from __future__ import annotations

import argparse
import logging
import tempfile

import numpy as np
import torch

from thinwire.bench.report import format_table, save_if_asked
from thinwire.cliargs import integer, number

log = logging.getLogger(__name__)

COLUMNS = ("method", "interval_s", "failures", "overhead_fraction", "overhead_model",
           "overhead_vs_full", "rows_written_per_save", "pls", "pls_model",
           "lost_update_fraction", "auc", "auc_diff_vs_full", "log_loss")
NUMERIC = ("failures", "overhead_fraction", "overhead_model", "save_fraction", "load_fraction",
           "reschedule_fraction", "lost_work_fraction", "rows_written_per_save", "pls",
           "pls_model", "lost_update_fraction", "auc", "log_loss", "wall_save_s", "wall_load_s")


def _evaluate(trainer, test, batch: int) -> tuple[float, float]:
    from thinwire.recsys.models import roc_auc
    scores = []
    for start in range(0, len(test), batch):
        idx = np.arange(start, min(start + batch, len(test)))
        scores.append(torch.sigmoid(trainer.predict(test.batch(idx))).double().numpy())
    p = np.clip(np.concatenate(scores), 1e-7, 1 - 1e-7)
    y = test.labels
    return roc_auc(y, p), float(-np.mean(y * np.log(p) + (1 - y) * np.log(1 - p)))


def run(dataset: str = "movielens", model_name: str = "deepfm",
        methods=("full", "partial", "mfu", "ssu"), epochs: int = 2, batch: int = 256,
        n_emb: int = 8, mtbfs: float = 8.0, pls_target: float = 0.02, mfu_fraction: float = 0.2,
        ssu_rate: float = 0.1, sub_saves: int = 2, seeds=(0, 1, 2), k: int = 8,
        samples: int = 40_000) -> dict:
    from thinwire.recsys.cpr import (CheckpointStore, CPRConfig, ShardedTrainer, TimeModel,
                                     failure_schedule, plan, run as run_cpr, summary)
    from thinwire.recsys.data import rank_batches
    from thinwire.recsys.models import make_model
    from thinwire.recsys.train import load

    train, test = load(dataset, samples=samples, fields=8, vocab=2000, multi_hot=2.0)
    batches = [b for e in range(epochs) for b in rank_batches(train, batch, 0, 1, e, 0)]
    tm = TimeModel.scaled(len(batches), mtbfs)
    rows = []
    for method in methods:
        cfg = CPRConfig(method, n_emb, pls_target, mfu_fraction, ssu_rate, sub_saves)
        per_seed = []
        for seed in seeds:
            model = make_model(model_name, train.num_fields, k=k, seed=0)
            with tempfile.TemporaryDirectory(prefix="thinwire-cpr-") as tmp:
                trainer = ShardedTrainer(model, train.num_rows, n_emb, CheckpointStore(tmp))
                # failures over 3x the failure-free time: more than any run can use
                failures = failure_schedule(tm.mtbf, 3 * len(batches) * tm.t_step, n_emb, seed)
                stats = run_cpr(trainer, batches, cfg, tm, failures, seed)
                row = summary(stats, cfg, tm, batch, trainer.total_rows)
                row["auc"], row["log_loss"] = _evaluate(trainer, test, 4096)
            log.info("%s seed %d: overhead %.4f, %d failures, AUC %.4f", method, seed,
                     row["overhead_fraction"], row["failures"], row["auc"])
            per_seed.append(row)
        out = dict(per_seed[0])
        for key in NUMERIC:
            out[key] = float(np.mean([r[key] for r in per_seed]))
        out["per_seed"] = [{key: r[key] for key in ("overhead_fraction", "failures", "pls", "auc")}
                           for r in per_seed]
        rows.append(out)
    full = next((r for r in rows if r["method"] == "full"), None)
    for row in rows:
        if full:
            row["overhead_vs_full"] = row["overhead_fraction"] / full["overhead_fraction"]
            row["auc_diff_vs_full"] = row["auc"] - full["auc"]
    p = plan(tm.t_save, tm.t_load, tm.t_res, tm.mtbf, n_emb, pls_target)
    return {"rows": rows, "plan": vars(p),
            "setting": {"dataset": dataset, "model": model_name, "epochs": epochs,
                        "batch": batch, "steps": len(batches), "n_emb": n_emb, "mtbfs": mtbfs,
                        "pls_target": pls_target, "mfu_fraction": mfu_fraction,
                        "ssu_rate": ssu_rate, "sub_saves": sub_saves, "seeds": list(seeds),
                        "time_model": vars(tm)}}


def _main(args: argparse.Namespace) -> int:
    torch.set_num_threads(1)
    result = run(args.dataset, args.model, args.methods, args.epochs, args.batch, args.n_emb,
                 args.mtbfs, args.pls_target, args.mfu_fraction, args.ssu_rate, args.sub_saves,
                 tuple(args.seeds))
    print(format_table(result["rows"], COLUMNS))
    p = result["plan"]
    print(f"plan: {p['mode']} recovery, interval {p['interval']:.0f} s "
          f"(full {p['full_overhead']:.4f} at {p['full_interval']:.0f} s, partial {p['partial_overhead']:.4f} at "
          f"{p['partial_interval']:.0f} s)")
    save_if_asked(args.json, result)
    return 0


def register(bench_subparsers) -> None:
    parser = bench_subparsers.add_parser(
        "cpr", help="CPR: full vs partial recovery, CPR-MFU, CPR-SSU under seeded failures")
    parser.add_argument("--dataset", default="movielens",
                        choices=["movielens", "adult", "synthetic"], help="data set to train on")
    parser.add_argument("--model", default="deepfm", choices=["lr", "fm", "wide_deep", "deepfm"],
                        help="recommender model")
    parser.add_argument("--methods", nargs="+", default=["full", "partial", "mfu", "ssu"],
                        choices=["full", "partial", "mfu", "ssu"],
                        help="recovery methods to compare")
    parser.add_argument("--epochs", type=integer(1), default=2, help="training epochs per run")
    parser.add_argument("--batch", type=integer(1), default=256, help="global batch size")
    parser.add_argument("--n-emb", type=integer(1), default=8, help="embedding shards")
    parser.add_argument("--mtbfs", type=number(0, 1e4, low_open=True), default=8.0,
                        help="failure-free run length in MTBFs (scales the time model)")
    parser.add_argument("--pls-target", type=number(0, 1, low_open=True), default=0.02,
                        help="CPR's target portion of lost samples (sets the partial-recovery "
                             "checkpoint interval)")
    parser.add_argument("--mfu-fraction", type=number(0, 1, low_open=True), default=0.2,
                        help="CPR-MFU: share of most-used rows saved between checkpoints")
    parser.add_argument("--ssu-rate", type=number(0, 1, low_open=True), default=0.1,
                        help="CPR-SSU: share of rows sampled for saving between checkpoints")
    parser.add_argument("--sub-saves", type=integer(1), default=2,
                        help="MFU/SSU saves between two full checkpoints")
    parser.add_argument("--seeds", type=integer(0), nargs="+", default=[0, 1, 2],
                        help="seeds of the failure schedules (one run each)")
    parser.add_argument("--json", metavar="PATH", help="write the results as JSON here")
    parser.set_defaults(func=_main)
