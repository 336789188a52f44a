"""CPR on the emulated cluster: a rank's process is killed (SIGKILL) and a replacement recovers.

Run on every rank (``thinwire.cluster.run(spec, ["-m", "thinwire.recsys.cpr.cluster_job", ...])``):

    -m thinwire.recsys.cpr.cluster_job --dir CKPT --steps 30 --save-every 5 --mode partial \\
        --out-dir OUT [--pid-dir PIDS] [--step-sleep 0.15]

* The process torchrun starts is a *supervisor*: it runs the real trainer as a child process
  (``--role trainer``) and, when the child dies by a signal, starts a replacement (at most
  ``--max-restarts``) with ``--recover``. torchrun (``--max-restarts 0``) never sees the death.
  The trainer writes its PID to ``PIDS/rank<r>.pid`` and its step to ``PIDS/rank<r>.progress``.
* Training is synchronous: every rank holds one embedding shard (`make_method`, PS or DES) and
  trains on its slice of each global batch over gloo.
* Process-group *generations*: every trainer connects to the torchrun agent's TCPStore and
  joins the gloo group of generation g under the prefix ``cpr/gen<g>``. A replacement adds 1 to
  ``cpr/failures`` and joins that generation; a survivor whose collective raised (the peer is
  gone) destroys its group, waits until ``cpr/failures`` exceeds its generation and joins it.
* Every ``--save-every`` steps each rank saves its shard (rows + optimizer state) and the dense
  model (+ its optimizer, + step) to ``CKPT/rank<r>`` (`CheckpointStore`: atomic, versioned,
  checksummed); step 0 is saved before training.
* Agreement once the group is re-formed (all_gather of what each rank has):

  - ``partial``: survivors keep their rows; a survivor undoes the step it was in (and, if it had
    finished one step more than another survivor, that step too: two snapshots are kept) so that
    all survivors stand at the same step T = the smallest step a survivor completed (known to
    all from the all_gather); the dense model and its optimizer come from the lowest surviving
    rank (broadcast); the replacement loads its shard's newest checkpoint not after T (step C):
    the updates of its rows in steps C..T-1 are lost (``lost_steps = T - C``), as in CPR.
  - ``full``: every rank reloads its checkpoint of the newest step C that every rank has; the
    steps C..T-1 are redone (``lost_steps = T - C``, T the step the survivors had reached).

``OUT/rank<r>.json``: final step, digest of the shard and of the dense state, the step this rank
recovered from (null when it kept its in-memory state), lost steps, generations, and the digest
of the shard and dense state after every step of the final trajectory (for tests).
"""

from __future__ import annotations

import argparse
import copy
import ctypes
import hashlib
import logging
import os
import signal
import subprocess
import sys
import time
from collections import OrderedDict
from datetime import timedelta
from pathlib import Path

import torch

log = logging.getLogger("thinwire.cpr.cluster_job")

FAILURES_KEY = "cpr/failures"


# -- supervisor ----------------------------------------------------------------------------------

def _die_with_parent() -> None:
    """In the child (preexec): SIGKILL when the supervisor dies, so nothing outlives the job."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def supervise(argv: list[str], max_restarts: int, rank: int) -> int:
    """Run the trainer; restart it in recovery mode when a signal kills it."""
    stopping = {"signal": None}
    child: dict[str, subprocess.Popen | None] = {"proc": None}

    def forward(signum, frame):  # torchrun stops the job: pass it on, do not restart
        stopping["signal"] = signum
        if child["proc"] is not None and child["proc"].poll() is None:
            child["proc"].send_signal(signum)

    for s in (signal.SIGTERM, signal.SIGINT):
        signal.signal(s, forward)
    base = [sys.executable, "-m", "thinwire.recsys.cpr.cluster_job", *argv, "--role", "trainer"]
    restarts = 0
    while True:
        cmd = base + (["--recover"] if restarts else [])
        if stopping["signal"] is not None:  # stopped between the death and the restart
            return 128 + stopping["signal"]
        child["proc"] = proc = subprocess.Popen(cmd, preexec_fn=_die_with_parent)
        code = proc.wait()
        if code >= 0 or stopping["signal"] is not None:
            return code if code >= 0 else 128 - code
        name = signal.Signals(-code).name
        if restarts >= max_restarts:
            log.error("rank %d: trainer killed by %s; no restarts left", rank, name)
            return 128 - code
        restarts += 1
        log.warning("rank %d: trainer (pid %d) killed by %s: starting a replacement "
                    "(recovery, restart %d of %d)", rank, proc.pid, name, restarts, max_restarts)


# -- state helpers -------------------------------------------------------------------------------

def _hash(h, obj) -> None:
    """Feed a nested structure of tensors / containers / scalars into `h`, order-independent of
    dict insertion order (keys sorted by their repr)."""
    if isinstance(obj, torch.Tensor):
        t = obj.detach().contiguous().reshape(-1)
        h.update(f"T{obj.dtype}{tuple(obj.shape)}".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    elif isinstance(obj, dict):
        h.update(b"{")
        for key in sorted(obj, key=repr):
            h.update(repr(key).encode())
            _hash(h, obj[key])
        h.update(b"}")
    elif isinstance(obj, (list, tuple)):
        h.update(b"[")
        for item in obj:
            _hash(h, item)
        h.update(b"]")
    else:
        h.update(repr(obj).encode())


def digest(obj) -> str:
    h = hashlib.sha256()
    _hash(h, obj)
    return h.hexdigest()


def shard_digest(shard) -> str:
    """Rows and optimizer state in id order (independent of the row layout)."""
    order = shard._slot
    return digest({"ids": shard.keys, "rows": shard.rows[order],
                   "opt": {k: v[order] for k, v in shard.optimizer_state.items()}})


class Job:
    """One rank's trainer: the method (shard + dense model), the data, the checkpoints."""

    def __init__(self, args, rank: int, world: int, comm):
        from thinwire.recsys.baselines import make_method
        from thinwire.recsys.cpr.store import CheckpointStore
        from thinwire.recsys.data import rank_batches, synthetic
        from thinwire.recsys.models import make_model

        self.args, self.rank, self.world = args, rank, world
        data = synthetic(args.samples, fields=args.fields, vocab_per_field=args.vocab,
                         mean_multi_hot=2.0, seed=0)
        batches: list = []
        epoch = 0
        while len(batches) < args.steps:
            batches += list(rank_batches(data, args.batch, rank, world, epoch, 0))
            epoch += 1
        self.batches = batches[:args.steps]
        kw = {"k": 4} if args.model == "fm" else {"k": 4, "hidden": (16,)}
        self.model = make_model(args.model, data.num_fields, seed=0, **kw)
        self.method = make_method(args.method, self.model, comm, data.num_rows, "adagrad", 0.05,
                                  seed=0)
        self.shard, self.dense_opt = self.method.shard, self.method.dense_opt
        self.store = CheckpointStore(Path(args.dir) / f"rank{rank}", keep=3,
                                     namespace=f"rank{rank}")

    # state
    def dense_state(self) -> dict:
        return {"model": copy.deepcopy(self.model.dense.state_dict()),
                "optimizer": copy.deepcopy(self.dense_opt.state_dict())}

    def load_dense(self, state: dict) -> None:
        self.model.dense.load_state_dict(state["model"])
        self.dense_opt.load_state_dict(copy.deepcopy(state["optimizer"]))

    def snapshot(self) -> dict:
        return {"shard": self.shard.state_dict(), "dense": self.dense_state()}

    def restore(self, snap: dict) -> None:
        self.shard.load_state_dict(snap["shard"])
        self.load_dense(snap["dense"])

    def digests(self) -> dict:
        return {"shard": shard_digest(self.shard),
                "dense": digest({k: v for k, v in self.dense_state().items()})}

    # checkpoints
    def save(self, step: int) -> None:
        shard = self.shard.state_dict()
        shard["step"] = step
        self.store.save("shard", shard, "full")
        dense = self.dense_state()
        dense["step"] = step
        self.store.save("dense", dense, "full")
        log.info("rank %d: saved checkpoint of step %d", self.rank, step)

    def checkpoints(self, key: str) -> dict[int, Path]:
        """step -> newest readable file of `key` for that step."""
        from thinwire.recsys.cpr.store import CorruptCheckpoint
        found: dict[int, Path] = {}
        for _, _, path in self.store.versions(key):
            try:
                found[int(self.store.read(path)["step"])] = path
            except (CorruptCheckpoint, OSError, RuntimeError, KeyError) as err:
                log.warning("rank %d: skipping unreadable checkpoint %s: %s", self.rank, path, err)
        return found

    def load_shard(self, path: Path) -> None:
        self.shard.load_state_dict(self.store.read(path))

    def train_step(self, step: int) -> None:
        self.method.train_step(self.batches[step], self.args.batch)


# -- process-group generations -------------------------------------------------------------------

def connect_store():
    import torch.distributed as dist
    host, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    return dist.TCPStore(host, port, is_master=False, timeout=timedelta(seconds=120))


def join_generation(store, gen: int, rank: int, world: int, timeout_s: float) -> None:
    import torch.distributed as dist
    start = time.monotonic()
    dist.init_process_group("gloo", store=dist.PrefixStore(f"cpr/gen{gen}", store), rank=rank,
                            world_size=world, timeout=timedelta(seconds=timeout_s))
    log.info("rank %d: process group of generation %d formed (%.2f s)", rank, gen,
             time.monotonic() - start)


def wait_for_generation(store, gen: int, timeout_s: float) -> int:
    """The newest generation once the failure counter exceeds `gen` (a replacement joined)."""
    deadline = time.monotonic() + timeout_s
    while True:
        failures = store.add(FAILURES_KEY, 0)
        if failures > gen:
            return failures
        if time.monotonic() > deadline:
            raise TimeoutError(f"no replacement joined within {timeout_s:.0f} s "
                               f"(failures={failures}, generation {gen})")
        time.sleep(0.05)


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


# -- trainer -------------------------------------------------------------------------------------

def train(args) -> int:
    import torch.distributed as dist
    from thinwire.output import write_json_atomic
    from thinwire.recsys.comm import Comm

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.set_num_threads(1)
    pid_dir = Path(args.pid_dir) if args.pid_dir else None
    if pid_dir is not None:
        pid_dir.mkdir(parents=True, exist_ok=True)
        _write_atomic(pid_dir / f"rank{rank}.pid", f"{os.getpid()}\n")
    store = connect_store()
    gen = store.add(FAILURES_KEY, 1) if args.recover else 0
    if args.recover:
        log.info("rank %d: replacement trainer (pid %d) joins generation %d", rank, os.getpid(),
                 gen)
    join_generation(store, gen, rank, world, args.pg_timeout)
    job = Job(args, rank, world, Comm())
    history: OrderedDict[int, dict] = OrderedDict()   # step -> digests (the final trajectory)
    snaps: OrderedDict[int, dict] = OrderedDict()     # partial mode: state at the last 2 steps
    recovered_from, lost_steps, resumed_at, generations = None, 0, None, 1
    detected_at = None
    if args.recover:
        step = recover(job, args, None, rank, world, history, snaps)
        recovered_from, lost_steps, resumed_at = job.recovered_from, job.lost_steps, step
        generations = gen + 1
    else:
        step = 0
        job.save(0)
        history[0] = job.digests()
    while step < args.steps:
        if args.mode == "partial":
            snaps[step] = job.snapshot()
            while len(snaps) > 2:
                snaps.popitem(last=False)
        try:
            job.train_step(step)
        except RuntimeError as err:  # a peer died: gloo reports it as a (DistBackend)RuntimeError
            detected_at = time.time()
            log.warning("rank %d: failure detected in step %d: %s", rank, step,
                        str(err).splitlines()[0][:200])
            try:
                dist.destroy_process_group()
            except Exception as exc:  # noqa: BLE001 - the group is broken anyway
                log.warning("rank %d: destroy_process_group: %s", rank, exc)
            gen = wait_for_generation(store, gen, args.rejoin_timeout)
            log.info("rank %d: joining generation %d", rank, gen)
            join_generation(store, gen, rank, world, args.pg_timeout)
            generations = gen + 1
            step = recover(job, args, step, rank, world, history, snaps)
            recovered_from, lost_steps, resumed_at = job.recovered_from, job.lost_steps, step
            continue
        step += 1
        history[step] = job.digests()
        if step % args.save_every == 0:
            job.save(step)
        if pid_dir is not None:  # after the save: progress p means the checkpoint of p is there
            _write_atomic(pid_dir / f"rank{rank}.progress", f"{step}\n")
        time.sleep(args.step_sleep)
    dist.barrier()
    final = job.digests()
    write_json_atomic(Path(args.out_dir) / f"rank{rank}.json", {
        "rank": rank, "world": world, "mode": args.mode, "step": step,
        "digest": digest(final), "shard_digest": final["shard"], "dense_digest": final["dense"],
        "recovered_from": recovered_from, "resumed_at": resumed_at, "lost_steps": lost_steps,
        "generations": generations, "failure_detected_at": detected_at,
        "history": {str(k): v for k, v in history.items()}})
    log.info("rank %d: done at step %d (generations: %d)", rank, step, generations)
    dist.destroy_process_group()
    return 0


def recover(job: Job, args, failed_in: int | None, rank: int, world: int, history: dict,
            snaps: dict) -> int:
    """Agree on the state to go on from, in the new group; returns the step to continue at.

    `failed_in`: the step this survivor was in when its collective failed (None: this is the
    replacement)."""
    import torch.distributed as dist

    survivor = failed_in is not None
    job.recovered_from, job.lost_steps = None, 0
    shard_ckpts = job.checkpoints("shard")
    dense_ckpts = job.checkpoints("dense")
    info = {"rank": rank, "survivor": survivor, "at": failed_in,
            "snaps": sorted(snaps) if survivor else [],
            "complete": sorted(set(shard_ckpts) & set(dense_ckpts)),
            "shard": sorted(shard_ckpts)}
    everyone: list = [None] * world
    dist.all_gather_object(everyone, info)
    survivors = [i for i in everyone if i["survivor"]]
    if not survivors:
        raise RuntimeError("no survivor to recover from: every rank was replaced")
    reached = max(i["at"] for i in survivors)
    if args.mode == "full":
        common = set(everyone[0]["complete"])
        for i in everyone[1:]:
            common &= set(i["complete"])
        if not common:
            raise RuntimeError(f"no checkpoint step common to all ranks: {everyone}")
        back = max(common)
        job.load_shard(shard_ckpts[back])
        dense = job.store.read(dense_ckpts[back])
        job.load_dense(dense)
        job.recovered_from, job.lost_steps = back, reached - back
        for k in [k for k in history if k > back]:
            del history[k]
        history[back] = job.digests()
        log.info("rank %d: recovered from step %d (full: every rank reloads; %d steps to redo)",
                 rank, back, reached - back)
        log.info("rank %d: resumed at step %d", rank, back)
        return back
    # partial: survivors undo to the smallest step any survivor completed
    target = min(i["at"] for i in survivors)
    source = min(i["rank"] for i in survivors)
    if survivor:
        if target not in snaps:
            raise RuntimeError(f"rank {rank}: no snapshot of step {target} (have {sorted(snaps)})")
        job.restore(snaps[target])
        for k in [k for k in history if k > target]:
            del history[k]
        if failed_in != target:
            log.warning("rank %d: undid step %d to stand with the other survivors at %d", rank,
                        target, target)
    else:
        if not shard_ckpts:
            raise FileNotFoundError(f"rank {rank}: no readable shard checkpoint in {job.store.root}")
        # a checkpoint newer than the survivors' step (saved just before a survivor failed in
        # an earlier step) would re-apply steps: take the newest one not after the target
        usable = [c for c in shard_ckpts if c <= target]
        if not usable:
            raise RuntimeError(f"rank {rank}: no shard checkpoint at or before step {target} "
                               f"(have {sorted(shard_ckpts)})")
        back = max(usable)
        job.load_shard(shard_ckpts[back])
        job.recovered_from, job.lost_steps = back, target - back
        log.info("rank %d: recovered shard from the checkpoint of step %d (partial: updates of "
                 "steps %d..%d to its rows are lost)", rank, back, back, target - 1)
    payload = [job.dense_state() if rank == source else None]
    dist.broadcast_object_list(payload, src=source)
    if rank != source:
        job.load_dense(payload[0])
    history[target] = job.digests()
    log.info("rank %d: resumed at step %d (%s; dense model and step from rank %d)", rank, target,
             "kept its rows" if survivor else "stale rows from its checkpoint", source)
    return target


# -- entry point ---------------------------------------------------------------------------------

def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m thinwire.recsys.cpr.cluster_job")
    p.add_argument("--dir", required=True, help="checkpoint folder (one subfolder per rank)")
    p.add_argument("--out-dir", required=True, help="rank<r>.json results")
    p.add_argument("--pid-dir", help="rank<r>.pid (trainer PID) and rank<r>.progress (step)")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--save-every", type=int, default=5)
    p.add_argument("--mode", choices=["partial", "full"], default="partial")
    p.add_argument("--method", choices=["ps", "des"], default="ps")
    p.add_argument("--model", choices=["fm", "deepfm"], default="fm")
    p.add_argument("--batch", type=int, default=64, help="global batch")
    p.add_argument("--samples", type=int, default=2000)
    p.add_argument("--fields", type=int, default=4)
    p.add_argument("--vocab", type=int, default=200, help="ids per field")
    p.add_argument("--step-sleep", type=float, default=0.0, help="seconds after each step")
    p.add_argument("--max-restarts", type=int, default=1, help="replacements per rank")
    p.add_argument("--pg-timeout", type=float, default=30.0, help="gloo timeout, seconds")
    p.add_argument("--rejoin-timeout", type=float, default=120.0,
                   help="seconds a survivor waits for a replacement")
    p.add_argument("--role", choices=["supervisor", "trainer"], default="supervisor")
    p.add_argument("--recover", action="store_true", help="(trainer) this is a replacement")
    return p


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser().parse_args(argv)
    rank = int(os.environ.get("RANK", "0"))
    logging.basicConfig(level=logging.INFO,
                        format=f"%(asctime)s cpr-{args.role} rank{rank}: %(message)s")
    if args.save_every < 1 or args.steps < 1:
        raise SystemExit("--steps and --save-every must be >= 1")
    if args.role == "supervisor":
        return supervise(argv, args.max_restarts, rank)
    return train(args)


if __name__ == "__main__":
    from thinwire.rank_exit import exit_rank

    exit_rank(main())
