"""Checkpoints: one file per rank (residuals differ between ranks), checksummed and atomic.

A checkpoint holds the model, the optimizer, the schedule, the loss scaler, the hook's state
(thinwire's residuals, or PowerSGD's error and P/Q memories), and the data position (epoch and
step within it; batches are a function of seed and epoch, so that is enough to continue with the
same batches), plus the identity of the run it belongs to, checked before anything is loaded.

Files are `thinwire.safefile` records: plain tensors and containers (loaded with
``weights_only=True``, so a crafted file cannot run code), a SHA-256 over the payload and the
key ``train/rank<r>`` inside, so a file that was truncated, changed or copied from another rank
is refused. Saving keeps the previous checkpoint as ``rank<r>.prev.pt``; loading falls back to
it, with a warning naming the refused file, when the newest is unreadable or does not fit the
run. The ranks agree on the step they resume from (a collective), so a fallback on one rank is
a fallback on all, and a rank that cannot resume ends every rank with a clear error.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
from pathlib import Path
from typing import Callable

import torch
import torch.distributed as dist

from thinwire import safefile
from thinwire.train.checkpoint_checks import CheckpointMismatch, check_fields
from thinwire.train.grad_sync import is_sparse

log = logging.getLogger(__name__)

MAGIC = b"TWTRAIN1\n"

# Resuming with another value of any of these would silently train something else.
IDENTITY = ("model", "algorithm", "density", "selector", "powersgd_rank", "optimizer",
            "batch_size", "seed", "momentum_correction", "dense_warmup_steps")


class NoUsableCheckpoint(ValueError):
    """No checkpoint of this run can be resumed from (on this rank or on another)."""


def rank_file(directory: str | os.PathLike, rank: int) -> Path:
    return Path(directory) / f"rank{rank}.pt"


def previous_file(directory: str | os.PathLike, rank: int) -> Path:
    return Path(directory) / f"rank{rank}.prev.pt"


def any_present(directory: str | os.PathLike) -> bool:
    """Whether the directory holds a checkpoint of any rank (newest or previous). Every rank
    sees the same directory, so every rank gets the same answer; a rank whose own file is
    missing then fails in :func:`load` on every rank, as a bad checkpoint does."""
    path = Path(directory)
    return path.is_dir() and any(path.glob("rank*.pt"))


def file_key(rank: int) -> str:
    return f"train/rank{rank}"


def identity(config) -> dict:
    out = {name: getattr(config, name) for name in IDENTITY}
    if not is_sparse(config.algorithm):  # density and selector do not matter to dense ones
        for name in ("density", "selector", "momentum_correction", "dense_warmup_steps"):
            out.pop(name)
    if config.algorithm != "powersgd":
        out.pop("powersgd_rank")
    return out


def save(directory: str | os.PathLike, rank: int, payload: dict) -> Path:
    """Write this rank's checkpoint; the one it replaces becomes ``rank<r>.prev.pt``."""
    path, previous = rank_file(directory, rank), previous_file(directory, rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    safefile.remove_orphans(path)
    safefile.remove_orphans(previous)
    data = safefile.encode(payload, MAGIC, file_key(rank))
    tmp = path.parent / f"{safefile.temp_prefix(path)}{os.getpid()}.tmp"
    try:
        with open(tmp, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        if path.exists():  # a kill between these two renames leaves the previous one: loadable
            os.replace(path, previous)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    safefile.fsync_dir(path.parent)
    return path


def size_limit(module: torch.nn.Module) -> int:
    """The most bytes a checkpoint of ``module`` can hold: the model, the optimizer's state,
    residuals, velocities and DiLoCo's anchor and momentum are each at most the model's size
    (8 of them, generously), plus the schedule, metrics and framing."""
    model_bytes = sum(t.numel() * t.element_size() for t in module.state_dict().values())
    return 8 * model_bytes + 64 * 2**20


def read(path: Path, rank: int, max_bytes: int | None = None) -> dict:
    """The payload of one file; CorruptFile when it is not an intact checkpoint of ``rank``,
    or (``max_bytes``) larger than one can be: it is not read into memory then."""
    try:
        size = path.stat().st_size
    except OSError as exc:
        raise safefile.CorruptFile(f"{path}: cannot be read ({exc.strerror})") from None
    if max_bytes is not None and size > max_bytes:
        raise safefile.CorruptFile(f"{path}: {size} bytes, more than a checkpoint of this model "
                                   f"can hold ({max_bytes}); not read")
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise safefile.CorruptFile(f"{path}: cannot be read ({exc.strerror})") from None
    return safefile.decode(data, MAGIC, str(path), file_key(rank))


def saved_choices(directory: str | os.PathLike, rank: int) -> list[dict]:
    """What ``--algorithm auto`` was running when it wrote each of ``rank``'s intact files in
    ``directory`` (newest first; a resumed auto run goes on with the choice of the step every
    rank can resume from): ``[{"step", "auto": {"choice", "settings"} or None}]``. Never
    raises: a file it cannot read is left out, as :func:`load` would refuse it."""
    found = []
    for candidate in (rank_file(directory, rank), previous_file(directory, rank)):
        try:
            if not candidate.is_file():
                continue
            payload = read(candidate, rank)
        except (OSError, safefile.CorruptFile) as exc:
            log.warning("rank %d: %s", rank, exc)
            continue
        step = payload.get("step") if isinstance(payload, dict) else None
        if isinstance(step, int) and not isinstance(step, bool):
            entry, identity = payload.get("auto"), payload.get("identity")
            algorithm = identity.get("algorithm") if isinstance(identity, dict) else None
            found.append({"step": step, "auto": entry if _plain(entry) else None,
                          "algorithm": algorithm if isinstance(algorithm, str) else None})
    return found


def _plain(entry) -> bool:
    """A dict JSON can carry (the ranks exchange what they found as JSON: a tensor or other
    object in a crafted file must not stop one rank before the exchange)."""
    if not isinstance(entry, dict):
        return False
    try:
        json.dumps(entry)
    except (TypeError, ValueError):
        return False
    return True


def resume_directory(config) -> str | None:
    """The directory ``config`` resumes from: --resume, or --checkpoint's where
    --resume-if-present and it holds a checkpoint; None: a new run."""
    if config.resume:
        return config.resume
    if config.resume_if_present and config.checkpoint and any_present(config.checkpoint):
        return config.checkpoint
    return None


def agreed_resume_directory(config) -> str | None:
    """:func:`resume_directory`, the same on every rank (collective where a group of several
    ranks is up): with ``--resume-if-present`` each rank looks in its own ``--checkpoint``,
    and where only some find files (node-local directories, a replacement node's empty one)
    those would load and gather while the others went on to build the model: their
    collectives would not match, a hang until the timeout. Every rank raises instead."""
    directory = resume_directory(config)
    if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
        return directory
    device = (torch.device("cuda", torch.cuda.current_device())
              if dist.get_backend() == "nccl" else torch.device("cpu"))
    mine = torch.tensor([int(directory is not None)], dtype=torch.int64, device=device)
    gathered = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, mine)
    found = [rank for rank, g in enumerate(gathered) if g.item()]
    if found and len(found) < len(gathered):
        missing = [rank for rank, g in enumerate(gathered) if not g.item()]
        raise NoUsableCheckpoint(
            f"--resume-if-present: rank(s) {found} found a checkpoint in {config.checkpoint}, "
            f"rank(s) {missing} did not; a run resumes on every rank or on none: give every "
            f"node the checkpoint (a shared --checkpoint directory), or start a new run")
    return directory


def check_identity(payload: dict, directory, config, world_size: int) -> None:
    saved = payload.get("identity", {})
    if not isinstance(saved, dict):  # a damaged file, not another run's: passed over
        raise CheckpointMismatch(f"its identity is a {type(saved).__name__}, not a dict")
    if is_sparse(config.algorithm):  # written before these options existed: they were off
        saved = {"momentum_correction": False, "dense_warmup_steps": 0, **saved}
    mine = identity(config)
    for key in ("model", "algorithm"):  # the two most likely mistakes get their own message
        if saved.get(key) != mine.get(key):
            raise ValueError(f"--resume {directory}: the checkpoint is for --{key} "
                             f"{saved.get(key)!r}, this run has --{key} {mine.get(key)!r}; "
                             f"resume with --{key} {saved.get(key)} or start a new run")
    if saved != mine:
        diff = {k: (saved.get(k), mine.get(k)) for k in set(saved) | set(mine)
                if saved.get(k) != mine.get(k)}
        raise ValueError(f"--resume {directory}: checkpoint differs from this run in "
                         + ", ".join(f"--{k.replace('_', '-')} (checkpoint {a!r}, now {b!r})"
                                     for k, (a, b) in sorted(diff.items())))
    if payload.get("world_size") != world_size:
        raise ValueError(f"--resume {directory}: the checkpoint was written by "
                         f"{payload.get('world_size')} ranks, this run has {world_size}; "
                         "residuals are per rank, so the world size must match")


def load(directory: str | os.PathLike, rank: int, config, world_size: int, *,
         steps_per_epoch: int, check: Callable[[dict], None] | None = None,
         max_bytes: int | None = None, other_choices: bool = False) -> dict:
    """This rank's newest checkpoint that is intact and fits ``config`` (and ``check``, which
    raises CheckpointMismatch for tensors that do not fit the model), at a step every rank
    has. ``max_bytes``: a larger file is refused unread (:func:`size_limit`).
    ``other_choices``: a file of another configuration is passed over, not an error (a
    resumed ``--algorithm auto`` run: its two files may straddle a switch). Collective when
    a process group is initialised: every rank must call it."""
    path = rank_file(directory, rank)
    safefile.remove_orphans(path)
    safefile.remove_orphans(previous_file(directory, rank))
    usable: dict[int, dict] = {}
    refused: list[str] = []
    failure: Exception | None = None
    for candidate in (path, previous_file(directory, rank)):
        if not candidate.is_file():
            continue
        try:
            payload = read(candidate, rank, max_bytes)
            if not isinstance(payload, dict):
                raise CheckpointMismatch(f"holds a {type(payload).__name__}, not a dict")
            check_identity(payload, directory, config, world_size)
            check_fields(payload, steps_per_epoch, config.epochs)
            if check is not None:
                check(payload)
        except (safefile.CorruptFile, CheckpointMismatch, KeyError, TypeError, IndexError,
                AttributeError) as exc:  # damaged in a way no check named: passed over too
            # (raised here, it ended this rank before the ranks agree on a step: a hang)
            reason = str(exc) if str(exc).startswith(str(candidate)) else f"{candidate}: {exc}"
            log.warning("rank %d: not resuming from %s: %s", rank, candidate, reason)
            refused.append(reason)
            continue
        except ValueError as exc:  # another run's checkpoint: the user's mistake, say so
            if other_choices:
                log.warning("rank %d: not resuming from %s: %s", rank, candidate, exc)
                refused.append(f"{candidate}: {exc}")
                continue
            failure = exc
            break
        usable.setdefault(payload["step"], payload)
    if failure is None and not usable and not refused:
        failure = FileNotFoundError(f"--resume {directory}: no checkpoint for rank {rank} "
                                    f"(expected {path})")
    step = _agree(sorted(usable), failure is not None, directory, refused,
                  {s: int(p["run"]) for s, p in usable.items() if _is_run_id(p.get("run"))})
    if failure is not None:
        raise failure
    if step != max(usable):
        log.warning("rank %d: resuming from the checkpoint of step %d, not %d (not usable on "
                    "every rank)", rank, step, max(usable))
    elif refused:
        log.warning("rank %d: fell back to the previous checkpoint (step %d) after refusing: %s",
                    rank, step, "; ".join(refused))
    return usable[step]


def run_id(saved: dict | None, device: torch.device) -> int:
    """The run's identity, the same on every rank: a resumed run keeps its checkpoint's, a new
    one takes rank 0's random number (collective). Every file carries it, so that the ranks
    cannot resume from files of different runs (another run's rank-1 file, copied in)."""
    if saved is not None and _is_run_id(saved.get("run")):
        return int(saved["run"])
    mine = torch.tensor([secrets.randbits(62) + 1], dtype=torch.int64)
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        mine = mine.to(device if dist.get_backend() == "nccl" else torch.device("cpu"))
        dist.broadcast(mine, 0)
    return int(mine.cpu()[0])


def _is_run_id(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 < value < 2**63


def _agree(steps: list[int], failed: bool, directory, refused: list[str],
           runs: dict | None = None) -> int | None:
    """The newest step usable on every rank, whose files all belong to one run (``runs``:
    step -> run id, 0 where a file predates run ids); every rank raises when there is none."""
    runs = runs or {}
    mine = torch.full((5,), -1, dtype=torch.int64)
    mine[0] = int(failed)
    mine[1:1 + len(steps[-2:])] = torch.tensor(steps[-2:], dtype=torch.int64)
    mine[3:3 + len(steps[-2:])] = torch.tensor([runs.get(s, 0) for s in steps[-2:]],
                                               dtype=torch.int64)
    gathered = [mine]
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        device = (torch.device("cuda", torch.cuda.current_device())
                  if dist.get_backend() == "nccl" else torch.device("cpu"))
        mine = mine.to(device)
        gathered = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
        dist.all_gather(gathered, mine)
        gathered = [g.cpu() for g in gathered]
    if failed:
        return None
    broken = [r for r, g in enumerate(gathered) if g[0]]
    if broken:
        raise NoUsableCheckpoint(f"--resume {directory}: rank(s) {broken} cannot resume "
                                 "(their error is in their log); no rank resumes")
    per_rank = [{int(s) for s in g[1:3] if s >= 0} for g in gathered]
    common = set.intersection(*per_rank)
    run_of = [{int(g[1 + i]): int(g[3 + i]) for i in range(2) if g[1 + i] >= 0}
              for g in gathered]
    for step in sorted(common):
        known = {r[step] for r in run_of if r[step]}  # 0: a file from before run ids
        if len(known) > 1:
            common.discard(step)
            refused.append(f"the ranks' files of step {step} belong to different runs (run ids "
                           f"{[r[step] for r in run_of]}): another run's file was copied in")
    if not common:
        empty = [r for r, s in enumerate(per_rank) if not s]
        detail = ("; ".join(refused) if refused else
                  f"rank(s) {empty} have none (see their log)" if empty else
                  "the ranks' checkpoints are of different steps")
        raise NoUsableCheckpoint(
            f"--resume {directory}: no usable checkpoint (steps per rank: "
            f"{[sorted(s) for s in per_rank]}): {detail}")
    return max(common)
