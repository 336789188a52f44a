"""The emulated CPR trainer: N_emb in-process embedding shards, an emulated clock, failures.

One process holds every shard (`EmbeddingShard`, rank k of N_emb) and the dense model, and
trains on global batches exactly like the unsharded `ReferenceModel` (rows are gathered from
their owners, the gradient of each row is applied on its owner). Time is *emulated*: a step
costs ``t_step``; a save of r of the R rows costs ``t_save * r / R``; loading a shard of r rows
costs ``t_load * r / R``; a failure costs ``t_res`` to reschedule. Failures come from a seeded
Poisson schedule in that clock; what a failure does depends on the mode:

* ``full``: every shard and the dense model reload the newest checkpoint; the steps since then
  are redone (they cost their ``t_step`` again: the lost work);
* ``partial``: only the failed shard reloads (base checkpoint plus deltas); training goes on;
* ``mfu`` / ``ssu``: partial recovery whose saves write only some rows, ``sub_saves`` times per
  PLS interval: the rows with the most accesses since they were last saved (per-row counters;
  the hot rows, saved nearly every time) or the rows touched by a seeded ``ssu_rate`` sample of
  the training samples since the last save.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np
import torch

from thinwire.recsys.cpr import overhead as om
from thinwire.recsys.cpr.schedule import Failure
from thinwire.recsys.cpr.store import CheckpointStore, restore_shard, rows_state
from thinwire.recsys.data import Batch
from thinwire.recsys.models import RecModel, bce_loss, check_fields, dense_optimizer, segments
from thinwire.recsys.sharded import EmbeddingShard, SparseOptimizer, owner_of


@dataclass
class TimeModel:
    """Emulated seconds. Defaults: production-like (MTBF 20 h; saving or loading every shard
    3 min; 2 min to reschedule a node); t_step is set per run (see `scaled`)."""
    t_step: float
    mtbf: float = 20 * 3600.0
    t_save: float = 180.0
    t_load: float = 180.0
    t_res: float = 120.0

    def __post_init__(self) -> None:
        om.check_positive("t_step", self.t_step)
        om.check_positive("mtbf", self.mtbf)
        for name in ("t_save", "t_load", "t_res"):
            om.check_positive(name, getattr(self, name), allow_zero=True)

    @classmethod
    def scaled(cls, steps: int, mtbfs: float, **kw) -> "TimeModel":
        """A run of `steps` steps that lasts `mtbfs` MTBFs of failure-free time."""
        mtbf = kw.get("mtbf", cls.mtbf)
        om.check_positive("mtbfs", mtbfs)
        return cls(t_step=mtbfs * mtbf / steps, **kw)


@dataclass
class CPRConfig:
    mode: str
    n_emb: int = 8
    pls_target: float = 0.02
    mfu_fraction: float = 0.2   # share of a shard's rows one MFU save writes
    ssu_rate: float = 0.02      # share of the samples whose rows an SSU save writes
    sub_saves: int = 2          # MFU/SSU saves per PLS-target interval

    def __post_init__(self) -> None:
        om.check_mode(self.mode)
        om.check_n_emb(self.n_emb)
        om.check_pls_target(self.pls_target)
        if not 0 < self.mfu_fraction <= 1:
            raise ValueError(f"mfu_fraction must be in (0, 1], got {self.mfu_fraction!r}")
        if not 0 < self.ssu_rate <= 1:
            raise ValueError(f"ssu_rate must be in (0, 1], got {self.ssu_rate!r}")
        if not isinstance(self.sub_saves, int) or self.sub_saves < 1:
            raise ValueError(f"sub_saves must be an int >= 1, got {self.sub_saves!r}")

    def interval(self, tm: TimeModel) -> float:
        """Emulated seconds between saves."""
        if self.mode == "full":
            return om.best_full_interval(tm.t_save, tm.mtbf)
        t = om.interval_for_pls(self.pls_target, self.n_emb, tm.mtbf)
        return t if self.mode == "partial" else t / self.sub_saves


class ShardedTrainer:
    """Every shard of the table in this process, plus the dense model and its optimizer."""

    def __init__(self, model: RecModel, num_rows: int, n_emb: int, store: CheckpointStore,
                 optimizer: str = "adagrad", lr: float = 0.05, seed: int = 0):
        self.model, self.num_rows, self.n_emb, self.store = model, num_rows, n_emb, store
        self.shards = [EmbeddingShard(model.row_dim, k, n_emb, num_rows, seed, dtype=model.dtype)
                       for k in range(n_emb)]
        self.sparse = SparseOptimizer(optimizer, lr)
        self.dense_opt = dense_optimizer(model, optimizer, lr)
        self.total_rows = sum(len(s) for s in self.shards)

    def _gather(self, ids: torch.Tensor):
        owner = owner_of(ids, self.n_emb)
        rows = torch.empty(len(ids), self.model.row_dim, dtype=self.model.dtype)
        parts = []
        for k, shard in enumerate(self.shards):
            mask = owner == k
            index = shard.lookup(ids[mask])
            rows[mask] = shard.rows[index]
            parts.append((mask, index))
        return rows, parts

    def _logits(self, batch: Batch, rows: torch.Tensor) -> torch.Tensor:
        check_fields(batch, self.model)
        seg, count = segments(batch, self.model)
        p = self.model.partial(rows, batch.values, seg, count)
        if self.model.level == "bag":
            p = p.view(batch.batch_size, batch.num_fields, -1)
        return self.model.combine(p)

    def train_step(self, batch: Batch) -> list[torch.Tensor]:
        """One step on a global batch; returns the local row index each shard updated."""
        rows, parts = self._gather(batch.ids)
        rows.requires_grad_(True)
        loss = bce_loss(self._logits(batch, rows), batch.labels, batch.batch_size)
        self.dense_opt.zero_grad()
        loss.backward()
        for shard, (mask, index) in zip(self.shards, parts):
            self.sparse.step_shard(shard, index, rows.grad[mask])
        self.dense_opt.step()
        return [index for _, index in parts]

    @torch.no_grad()
    def predict(self, batch: Batch) -> torch.Tensor:
        return self._logits(batch, self._gather(batch.ids)[0])

    def dense_state(self, step: int) -> dict:
        return {"model": self.model.dense.state_dict(), "optimizer": self.dense_opt.state_dict(),
                "step": step}

    def save_full(self, step: int) -> None:
        for k, shard in enumerate(self.shards):
            state = shard.state_dict()
            state["step"] = step
            self.store.save(f"shard{k}", state, "full")
        self.store.save("dense", self.dense_state(step), "full")

    def save_rows(self, k: int, local_index: torch.Tensor, step: int) -> None:
        shard = self.shards[k]
        id_of_row = torch.empty_like(shard.keys)
        id_of_row[shard._slot] = shard.keys
        state = rows_state(shard, id_of_row[local_index])
        state["step"] = step
        self.store.save(f"shard{k}", state, "delta")

    def restore_all(self) -> int:
        """Every shard and the dense model from their newest checkpoints; returns its step."""
        for k, shard in enumerate(self.shards):
            restore_shard(self.store, f"shard{k}", shard)
        _, dense, _ = self.store.load_chain("dense")
        self.model.dense.load_state_dict(dense["model"])
        self.dense_opt.load_state_dict(dense["optimizer"])
        return int(dense["step"])

    def restore_one(self, k: int) -> None:
        restore_shard(self.store, f"shard{k}", self.shards[k])


@dataclass
class RunStats:
    steps: int = 0
    failures: int = 0
    clock: float = 0.0
    save_time: float = 0.0
    load_time: float = 0.0
    res_time: float = 0.0
    lost_time: float = 0.0          # redone steps (full recovery)
    saves: int = 0
    rows_written: int = 0
    lost_samples: float = 0.0       # sum over failures of samples since the shard's last save / N
    lost_updates: int = 0           # row updates undone by partial restores
    total_updates: int = 0
    wall_save_s: float = 0.0        # measured, real checkpoint writes
    wall_load_s: float = 0.0
    failure_log: list = field(default_factory=list)


def run(trainer: ShardedTrainer, batches: list[Batch], cfg: CPRConfig, tm: TimeModel,
        failures: list[Failure], seed: int = 0) -> RunStats:
    """Train on `batches` in order under `cfg`, injecting `failures` (sorted by time)."""
    if cfg.n_emb != trainer.n_emb:
        raise ValueError(f"cfg.n_emb={cfg.n_emb} does not match the trainer's {trainer.n_emb}")
    every = max(1, round(cfg.interval(tm) / tm.t_step))
    st = RunStats()
    n = trainer.n_emb
    dirty = [torch.zeros(len(s), dtype=torch.int64) for s in trainer.shards]  # updates since saved
    marked = [torch.zeros(len(s), dtype=torch.bool) for s in trainer.shards]  # SSU sample rows
    last_save = [0] * n
    trainer.save_full(0)  # the initial rows are a function of the seed: this save is not charged
    pending = sorted(failures, key=lambda f: f.time)
    step, high = 0, 0
    while step < len(batches):
        batch = batches[step]
        touched = trainer.train_step(batch)
        step += 1
        st.clock += tm.t_step
        if step <= high:
            st.lost_time += tm.t_step
        else:
            high = step
            for k, index in enumerate(touched):
                dirty[k].index_add_(0, index, torch.ones_like(index))
                st.total_updates += len(index)
        if cfg.mode == "ssu":
            _mark_sample(trainer, batch, marked, cfg.ssu_rate, seed, step)
        failed = st.failures
        step = _failures(trainer, cfg, tm, st, pending, dirty, last_save, step, batch.batch_size)
        if step % every or step >= len(batches) or (cfg.mode == "full" and st.failures > failed):
            continue
        picks = _pick_rows(cfg, dirty, marked)
        rows = trainer.total_rows if picks is None else sum(len(p) for p in picks)
        cost = tm.t_save * rows / trainer.total_rows
        if pending and pending[0].time <= st.clock + cost:
            # the node fails during the save: the save never completes (files are atomic)
            spent = max(0.0, pending[0].time - st.clock)
            st.clock += spent
            st.save_time += spent
            step = _failures(trainer, cfg, tm, st, pending, dirty, last_save, step,
                             batch.batch_size)
            continue
        wall = time.perf_counter()
        if picks is None:
            trainer.save_full(step)
            for k in range(n):
                dirty[k].zero_()
        else:
            for k, pick in enumerate(picks):
                trainer.save_rows(k, pick, step)
                dirty[k][pick] = 0
            trainer.store.save("dense", trainer.dense_state(step), "full")
        st.wall_save_s += time.perf_counter() - wall
        st.clock += cost
        st.save_time += cost
        st.saves += 1
        st.rows_written += rows
        last_save[:] = [step] * n
        step = _failures(trainer, cfg, tm, st, pending, dirty, last_save, step, batch.batch_size)
    st.steps = len(batches)
    return st


def _pick_rows(cfg: CPRConfig, dirty: list, marked: list) -> list | None:
    """Local rows each shard saves now (None: every row, a full checkpoint)."""
    if cfg.mode in ("full", "partial"):
        return None
    picks = []
    for k in range(len(dirty)):
        if cfg.mode == "mfu":  # the most-updated rows since they were last saved
            budget = max(1, math.ceil(cfg.mfu_fraction * len(dirty[k])))
            top = torch.argsort(dirty[k], descending=True, stable=True)[:budget]
            picks.append(top[dirty[k][top] > 0])
        else:  # rows touched by the sampled samples since the last save
            picks.append(torch.nonzero(marked[k]).flatten())
            marked[k].zero_()
    return picks


def _failures(trainer: ShardedTrainer, cfg: CPRConfig, tm: TimeModel, st: RunStats,
              pending: list, dirty: list, last_save: list, step: int, batch_size: int) -> int:
    """Handle every failure due by the clock; returns the step training goes on from."""
    n = trainer.n_emb
    while pending and pending[0].time <= st.clock:
        fail = pending.pop(0)
        st.failures += 1
        wall = time.perf_counter()
        if cfg.mode == "full":
            back = trainer.restore_all()
            load = tm.t_load
            st.failure_log.append((fail.time, fail.shard, step, back))
            step = back
        else:
            k = fail.shard
            trainer.restore_one(k)
            load = tm.t_load * len(trainer.shards[k]) / trainer.total_rows
            st.lost_samples += (step - last_save[k]) * batch_size / n
            st.lost_updates += int(dirty[k].sum())
            dirty[k].zero_()
            st.failure_log.append((fail.time, k, step, last_save[k]))
        st.wall_load_s += time.perf_counter() - wall
        st.clock += load + tm.t_res
        st.load_time += load
        st.res_time += tm.t_res
    return step


def _mark_sample(trainer: ShardedTrainer, batch: Batch, marked: list, rate: float, seed: int,
                 step: int) -> None:
    rng = np.random.default_rng([seed, 0x55, step])
    chosen = torch.from_numpy(rng.random(batch.batch_size) < rate)
    entry_sample = batch.bag_of_entry() // batch.num_fields
    ids = batch.ids[chosen[entry_sample]]
    owner = owner_of(ids, trainer.n_emb)
    for k, shard in enumerate(trainer.shards):
        marked[k][shard.lookup(ids[owner == k])] = True


def summary(st: RunStats, cfg: CPRConfig, tm: TimeModel, global_batch: int,
            total_rows: int) -> dict:
    """Overheads as fractions of failure-free time, PLS measured and from the formula.

    ``overhead_model`` is the paper's formula at the interval used, with the save cost of the
    rows actually written per save (all rows for full and partial recovery)."""
    free = st.steps * tm.t_step
    interval = max(1, round(cfg.interval(tm) / tm.t_step)) * tm.t_step
    per_save = st.rows_written / st.saves if st.saves else float(total_rows)
    t_save_used = tm.t_save * per_save / total_rows
    out = {"method": cfg.mode, "steps": st.steps, "failures": st.failures,
           "interval_s": interval, "saves": st.saves,
           "overhead_fraction": (st.save_time + st.load_time + st.res_time + st.lost_time) / free,
           "save_fraction": st.save_time / free, "load_fraction": st.load_time / free,
           "reschedule_fraction": st.res_time / free, "lost_work_fraction": st.lost_time / free,
           "rows_written_per_save": per_save, "rows_total": total_rows,
           "pls": st.lost_samples / (st.steps * global_batch),
           "lost_update_fraction": st.lost_updates / max(st.total_updates, 1),
           "wall_save_s": st.wall_save_s, "wall_load_s": st.wall_load_s}
    if cfg.mode == "full":
        out["overhead_model"] = om.full_overhead(tm.t_save, tm.t_load, tm.t_res, tm.mtbf,
                                                 interval)
        out["pls_model"] = 0.0
    else:
        out["overhead_model"] = om.partial_overhead(t_save_used, tm.t_load, tm.t_res, tm.mtbf,
                                                    interval, cfg.n_emb)
        out["pls_model"] = om.pls(interval, cfg.n_emb, tm.mtbf)
    return out
