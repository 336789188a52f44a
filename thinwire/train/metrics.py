"""What a run measures and reports: step times, accuracy over training time, bytes on the wire.

Rank 0 writes JSONL lines (``{"event": "step" | "eval" | "summary", ...}``) and draws the tqdm
bar; every rank takes part in the few all-reduces that turn per-rank numbers into run numbers.
"""

from __future__ import annotations

import json
import logging
import math
import time
import os
from pathlib import Path

import torch
import torch.distributed as dist

from thinwire.output import finite_json
from thinwire.train import models, quality

log = logging.getLogger("thinwire.train")
LANGUAGE_DATA = ("stdlib_text",)  # data sets judged by held-out bits per byte


def interface_tx_bytes(ifname: str = "eth0") -> int | None:
    """Bytes this node has sent out of its inter-node interface (local rank 0 of a node of the
    shaped emulated cluster only; None elsewhere). Every byte that left the node, headers too."""
    if os.environ.get("THINWIRE_CLUSTER_SHAPED") != "1" or os.environ.get("LOCAL_RANK", "0") != "0":
        return None
    try:
        for line in Path("/proc/net/dev").read_text().splitlines():
            name, _, counters = line.partition(":")
            if name.strip() == ifname:
                return int(counters.split()[8])  # rx: 8 fields, then tx bytes
    except (OSError, ValueError, IndexError):
        pass
    return None


def shared_cores(world: int) -> float | None:
    """The cores every rank of the run shares, which their summed CPU time a step is spread
    over: the host's (this process's affinity) where all ranks run on one host - the emulated
    cluster, or a run whose local world is the whole world - capped by the emulator's node
    budgets (``--node-cpus``, a CFS quota per node); None where the ranks span hosts (their
    CPU is summed over hosts whose cores are not one pool)."""
    one_host = "THINWIRE_CLUSTER_SHAPED" in os.environ \
        or int(os.environ.get("LOCAL_WORLD_SIZE", world)) == world
    if not one_host:
        return None
    try:
        cores = float(len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        cores = float(os.cpu_count() or 1)
    budget = os.environ.get("THINWIRE_NODE_CPUS")
    if budget:
        cores = min(cores, float(budget) * int(os.environ.get("THINWIRE_NODES", "1")))
    return cores


class Metrics:
    def __init__(self, cfg, rank: int, world: int, total_steps: int,
                 steps_per_epoch: int | None = None):
        self.rank, self.world, self.total_steps = rank, world, total_steps
        self.steps_per_epoch = steps_per_epoch
        self.train_time_s = 0.0          # step time only, summed over the whole run
        self.curve: list[dict] = []      # evaluations: accuracy against training time
        self.compute_ms: float | None = None
        self.chosen: dict | None = None  # --algorithm auto's record (thinwire.train.auto)
        self.timed_steps, self.timed_s = 0, 0.0
        # CPU seconds the rank's process spent in its timed steps (every thread: gloo's, the
        # intra-op pool's), where the loop measured them: the host work a step costs whatever
        # the link, also where it hides behind a slow wire (thinwire.sim.calibrate's floor)
        self.timed_cpu_s: float | None = None
        self.cpu_ms: float | None = None  # the timed steps' CPU ms a step, summed over ranks
        self._timing, self._totals_start, self.hook_totals = False, None, None
        self.inter_node_bytes_per_iter: float | None = None
        self.inter_node_source: str | None = None
        self.last_loss = float("nan")
        # the quality that decides: held-out bits per byte for a language model, else accuracy
        self.language = models.data_name(cfg.model) in LANGUAGE_DATA
        self.metric = "bits_per_byte" if self.language else "test_accuracy"
        self.target = cfg.target_bits_per_byte if self.language else cfg.target_accuracy
        if self.language and cfg.target_accuracy is not None:
            self.metric, self.target = "test_accuracy", cfg.target_accuracy  # next-byte accuracy
        self.budget_s, self.stop_at_target = cfg.budget_s, cfg.stop_at_target
        self.stop_reason: str | None = None
        self.log_every = cfg.log_every
        self._file = open(cfg.metrics, "a") if cfg.metrics and rank == 0 else None
        self._want_bar = cfg.progress and rank == 0
        self._bar = None

    # ---------------------------------------------------------------- per step and evaluation

    def record_step(self, step: int, epoch: int, seconds: float, loss: torch.Tensor,
                    lr: float, cpu_seconds: float | None = None) -> None:
        self.train_time_s += seconds
        if self._timing:
            self.timed_steps += 1
            self.timed_s += seconds
            if cpu_seconds is not None:
                self.timed_cpu_s = (self.timed_cpu_s or 0.0) + cpu_seconds
        if step % self.log_every == 0 or step == self.total_steps:
            self.last_loss = float(loss)
            self._write({"event": "step", "step": step, "epoch": epoch, "loss": self.last_loss,
                         "lr": lr, "step_ms": 1000 * seconds, "train_time_s": self.train_time_s})
        if self._want_bar:
            if self._bar is None:
                from tqdm import tqdm
                self._bar = tqdm(total=self.total_steps, initial=step - 1, desc="train",
                                 unit="step", mininterval=2.0, dynamic_ncols=True)
            self._bar.update(1)
            if step % self.log_every == 0:
                self._bar.set_postfix(loss=f"{self.last_loss:.3f}", refresh=False)

    def record_eval(self, step: int, epoch: int, accuracy: float, loss: float) -> None:
        """One evaluation (collective: every rank calls it). Its time is the slowest rank's
        training time, so every rank takes the same stop decision."""
        slowest = torch.tensor([self.train_time_s], dtype=torch.float64)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        # epochs as steps done / steps per epoch: one numbering for every evaluation
        epochs = step / self.steps_per_epoch if self.steps_per_epoch else float(epoch)
        # unix_time: when (wall clock); a run resumed after a restart spans its downtime in
        # it, which train_time_s (saved with the checkpoint) does not count
        point = {"step": step, "epoch": round(epochs, 4), "train_time_s": float(slowest),
                 "test_accuracy": accuracy, "test_loss": loss, "unix_time": time.time()}
        if self.language:  # mean cross-entropy per byte, nats -> bits
            point["bits_per_byte"] = loss / math.log(2)
        self.curve.append(point)
        self._write({"event": "eval", **point})
        self.stop_reason = quality.stop_reason(self.curve, self.metric, self.target,
                                               self.budget_s, self.stop_at_target)
        if self.rank == 0:
            log.info("step %d (epoch %.2f): test accuracy %.4f, loss %.4f%s (%.1f s of "
                     "training)%s", step, epochs, accuracy, loss,
                     f", {point['bits_per_byte']:.3f} bits/byte" if self.language else "",
                     point["train_time_s"],
                     f": stopping ({self.stop_reason})" if self.stop_reason else "")

    # ---------------------------------------------------------------- the timed window

    def start_timing(self, hook_totals: dict | None) -> None:
        self._timing, self._totals_start = True, hook_totals

    def add_overhead(self, seconds: float) -> None:
        """Work between steps that the run's time to target must pay for (auto's re-planning:
        the probe, the plan, the switch)."""
        self.train_time_s += seconds

    def switched_sync(self, old_end: dict | None, new_start: dict | None) -> None:
        """The loop replaced its synchronisation: the old one's counts so far are carried, the
        new one's start from ``new_start``. Where either keeps no counters (PyTorch's hooks),
        the run reports none."""
        if not self._timing:
            return
        if old_end is None or new_start is None or self._totals_start is None:
            self._totals_start = None
            return
        # counted so far = old_end - start; from here new - new_start: one start for both
        self._totals_start = {k: new_start.get(k, 0.0) - (old_end[k] - self._totals_start[k])
                              for k in old_end}

    def stop_timing(self, hook_totals: dict | None, tx_start: int | None,
                    tx_end: int | None) -> None:
        """Combine every rank's numbers for the timed window (collective)."""
        self._timing = False
        delta = {k: hook_totals[k] - self._totals_start.get(k, 0.0) for k in hook_totals} \
            if hook_totals is not None and self._totals_start is not None else None
        measured = tx_end - tx_start if tx_start is not None and tx_end is not None else None
        keys = sorted(delta) if delta else []
        numbers = torch.tensor([float(measured or 0), float(measured is not None),
                                self.compute_ms or 0.0, self.timed_cpu_s or 0.0,
                                float(self.timed_cpu_s is not None)] + [delta[k] for k in keys],
                               dtype=torch.float64)
        dist.all_reduce(numbers)
        steps = max(self.timed_steps, 1)
        nodes = int(os.environ.get("THINWIRE_NODES", "1"))
        summed = dict(zip(keys, numbers[5:].tolist()))
        if numbers[4] == self.world:  # every rank measured its CPU time
            self.cpu_ms = 1000 * float(numbers[3]) / steps
        if numbers[1] > 0:  # one counter per node
            self.inter_node_bytes_per_iter = float(numbers[0] / numbers[1]) / steps
            self.inter_node_source = "interface counters"
        elif delta is not None:
            self.inter_node_bytes_per_iter = summed["bytes_inter"] / nodes / steps
            self.inter_node_source = "traffic model"
        if delta is not None:  # thinwire's own timers, mean over ranks, per step
            self.hook_totals = {k[:-2] + "_ms_per_iter": 1000 * v / self.world / steps
                                for k, v in summed.items() if k.endswith("_s")}
        if self.compute_ms is not None:
            self.compute_ms = float(numbers[2]) / self.world  # mean over ranks

    # ---------------------------------------------------------------- the end

    def summary(self, cfg, steps: int, parameters: int, stopped: bool) -> dict:
        iter_ms = 1000 * self.timed_s / self.timed_steps if self.timed_steps else None
        samples = cfg.batch_size * self.world
        sync_ms = max(iter_ms - self.compute_ms, 0.0) \
            if iter_ms is not None and self.compute_ms is not None else None
        split = self._step_split(iter_ms)
        out = {
            "model": cfg.model, "algorithm": cfg.algorithm, "density": cfg.density,
            "selector": cfg.selector, "powersgd_rank": cfg.powersgd_rank,
            "optimizer": cfg.optimizer, "amp": cfg.amp, "seed": cfg.seed,
            "world_size": self.world, "nodes": int(os.environ.get("THINWIRE_NODES", "1")),
            "batch_size": cfg.batch_size, "parameters": parameters, "steps": steps,
            "stopped_early": stopped, "timed_steps": self.timed_steps,
            "samples_per_s": samples / (iter_ms / 1000) if iter_ms else None,
            "iter_ms": iter_ms, "compute_ms_per_iter": self.compute_ms,
            "sync_ms_per_iter": sync_ms,
            "cpu_ms_per_iter": self.cpu_ms, "host_cores": shared_cores(self.world),
            "comm_share": sync_ms / iter_ms if sync_ms is not None and iter_ms else None,
            "inter_node_mb_per_iter": self.inter_node_bytes_per_iter / 1e6
            if self.inter_node_bytes_per_iter is not None else None,
            "inter_node_mb_source": self.inter_node_source,
            "hook": self.hook_totals,
            "test_accuracy": self.curve[-1]["test_accuracy"] if self.curve else None,
            "final_loss": self.last_loss, "train_time_s": self.train_time_s,
            "target_accuracy": cfg.target_accuracy,
            "metric": self.metric, "target": self.target, "budget_s": self.budget_s,
            "stop_reason": self.stop_reason or ("stopped" if stopped else "end"),
            "time_to_target_s": quality.time_to_target(self.curve, self.metric, self.target,
                                                       self.budget_s)
            if self.target is not None else None,
            "time_to_target_resolution_s": quality.resolution_s(self.curve, self.metric,
                                                                self.target)
            if self.target is not None else None,
            "quality_at_budget": quality.quality_at_budget(self.curve, self.metric,
                                                           self.budget_s),
            "step_split_ms": split,
            **({"auto": self.chosen} if self.chosen is not None else {}),
            "curve": self.curve,
        }
        self._write({"event": "summary", **out})
        if self.rank == 0 and cfg.summary:
            from thinwire.output import write_json_atomic
            write_json_atomic(cfg.summary, out)
        return out

    def _step_split(self, iter_ms: float | None) -> dict | None:
        """Where a mean step's time goes: compute (the compute-only probe), thinwire's own
        timers (selection, intra-node, inter-node collectives) and the rest ("idle": waiting,
        contention, DDP's own work). PyTorch's hooks have no timers: their sync time stays one
        number ("sync")."""
        if iter_ms is None or self.compute_ms is None:
            return None
        out = {"compute": self.compute_ms}
        if self.hook_totals is not None:
            for name, key in (("selection", "select_ms_per_iter"), ("intra_node", "intra_ms_per_iter"),
                              ("inter_node", "inter_ms_per_iter")):
                out[name] = self.hook_totals.get(key, 0.0)
            out["idle"] = max(iter_ms - sum(out.values()), 0.0)
        else:
            out["sync"] = max(iter_ms - self.compute_ms, 0.0)
        return out

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
        if self._file is not None:
            self._file.close()
            self._file = None

    def _write(self, record: dict) -> None:
        if self._file is not None:
            self._file.write(json.dumps(finite_json(record), allow_nan=False) + "\n")
            self._file.flush()

    # ---------------------------------------------------------------- checkpoints

    def state_dict(self) -> dict:
        return {"train_time_s": self.train_time_s, "curve": list(self.curve)}

    def load_state_dict(self, state: dict) -> None:
        self.train_time_s = float(state["train_time_s"])
        self.curve = list(state["curve"])
