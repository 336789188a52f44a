"""A training process that survives being killed: full checkpoints every `--save-every` steps,
and on start the newest valid checkpoint (if any) is loaded and training goes on from there.

    python -m thinwire.recsys.cpr.worker --dir CKPT --steps 40 --save-every 5 --out final.json

The test kills it (SIGKILL) mid-run and starts it again on the same folder; the final state
must equal that of an uninterrupted run (`--out` holds a digest of every shard and the dense
model).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import time

import torch

from thinwire.recsys.cpr.store import CheckpointStore, encode
from thinwire.recsys.cpr.trainer import ShardedTrainer
from thinwire.recsys.data import rank_batches, synthetic
from thinwire.recsys.models import make_model

log = logging.getLogger(__name__)


def state_digest(trainer: ShardedTrainer) -> str:
    h = hashlib.sha256()
    for shard in trainer.shards:
        h.update(encode({"rows": shard.rows, "opt": shard.optimizer_state}))
    h.update(encode(trainer.model.dense.state_dict()))
    return h.hexdigest()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m thinwire.recsys.cpr.worker")
    parser.add_argument("--dir", required=True, help="checkpoint folder")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--save-every", type=int, default=5)
    parser.add_argument("--n-emb", type=int, default=4)
    parser.add_argument("--step-sleep", type=float, default=0.0, help="seconds after each step")
    parser.add_argument("--out", help="JSON: final step, digest, where training resumed from")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s cpr-worker: %(message)s")
    torch.set_num_threads(1)
    data = synthetic(2000, fields=4, vocab_per_field=200, mean_multi_hot=2.0, seed=0)
    batches = list(rank_batches(data, 64, 0, 1, 0, 0))
    batches = (batches * (args.steps // len(batches) + 1))[:args.steps]
    model = make_model("fm", data.num_fields, k=4, seed=0)
    store = CheckpointStore(args.dir)
    trainer = ShardedTrainer(model, data.num_rows, args.n_emb, store)
    try:
        step = trainer.restore_all()
        log.info("resumed from the checkpoint of step %d", step)
    except FileNotFoundError:
        step = 0
        trainer.save_full(0)
    resumed_from = step
    while step < args.steps:
        trainer.train_step(batches[step])
        step += 1
        if step % args.save_every == 0:
            trainer.save_full(step)
            print(f"saved step {step}", flush=True)
        time.sleep(args.step_sleep)
    if args.out:
        from thinwire.output import write_json_atomic
        write_json_atomic(args.out, {"step": step, "digest": state_digest(trainer),
                                     "resumed_from": resumed_from})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
