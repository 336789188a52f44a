"""`thinwire train --waves 2`: data-parallel tick-tock training, one loop per wave.

Every process of the job runs `train(cfg)` under torchrun, two per device slot (see
`schedule.py` for the layout). The loop is `thinwire.train.loop`'s step (same models, data,
optimizer, schedule and gradient synchronisation through `grad_sync.register`) with the
handshake around the forward, a record of each iteration's phases and a memory sampler.
Without torchrun (no ``RANK``) the command starts itself on one node with two processes.

Each process takes its own ``--batch-size`` samples per step from the epoch's order, as every
rank of `thinwire train` does, so a step of the whole job uses world x batch samples: two
waves are one data-parallel job with twice the ranks, and its result is that of data-parallel
training with the combined batch (tested against a float64 single-process reference).
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import logging
import os
import tempfile
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from thinwire.output import check_output_path, write_json_atomic
from thinwire.peer_failure import noting
from thinwire.train import data, grad_sync, loop, models
from thinwire.train.config import TrainConfig
from thinwire.wavelet import memory
from thinwire.wavelet.schedule import TickTock, Wave, check_train_config

log = logging.getLogger("thinwire.wavelet")
WARMUP_STEPS = 2
PROBE_BATCH = 8


def train(cfg: TrainConfig) -> dict:
    """Run one wave of ``cfg`` (``cfg.waves == 2``); returns the summary on rank 0."""
    check_train_config(cfg)
    check_output_path(cfg.summary, "--summary")
    if "RANK" not in os.environ:
        return _launch_locally(cfg)
    from thinwire.wavelet import tallmlp
    tallmlp.register()
    memory.release_freed_memory()
    owns = not dist.is_initialized()
    if owns:
        dist.init_process_group("gloo",
                                timeout=datetime.timedelta(seconds=cfg.collective_timeout_s))
    try:
        return _train(cfg, Wave.from_env(cfg.waves))
    finally:
        if owns:
            import gc
            gc.collect()
            dist.destroy_process_group()


def _launch_locally(cfg: TrainConfig) -> dict:
    """One node, one device slot: a tick and a tock process through torchrun on loopback."""
    from thinwire.cluster import ClusterSpec, run

    with tempfile.TemporaryDirectory(prefix="thinwire-waves-") as folder:
        config = os.path.join(folder, "config.json")
        summary = cfg.summary or os.path.join(folder, "summary.json")
        write_json_atomic(config, {**dataclasses.asdict(cfg), "summary": summary})
        status = run(ClusterSpec(1, cfg.waves, shaping=False),
                     ["-m", "thinwire.wavelet", "--config", config])
        if status:
            raise RuntimeError(f"--waves {cfg.waves}: a wave failed (status {status}; its "
                               f"error is above) and the run was stopped")
        with open(summary) as handle:
            return json.load(handle)


def _device(wave: Wave, requested: str) -> torch.device:
    """The slot's device: ``--device`` cpu, cuda (which must exist) or auto (cuda where there
    is one)."""
    if requested == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: no CUDA device is available (use --device cpu)")
    if requested != "cpu" and torch.cuda.is_available():  # the two waves of a slot share it
        torch.cuda.set_device(wave.local_rank // wave.waves)
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _check_memory(cfg, wave, module, ds, opt, device) -> dict:
    """Refuses a node limit below one wave's peak, before anything large is allocated."""

    probe_batch = min(PROBE_BATCH, cfg.batch_size)
    index = torch.arange(probe_batch)
    x, y = loop.batch_on(ds, index, device)
    # one small step allocates gradients and optimizer state (lr 0: the weights stay)
    lrs = [group["lr"] for group in opt.param_groups]
    for group in opt.param_groups:
        group["lr"] = 0.0
    loop.train_step(cfg, module, opt, None, None, x, y, device)
    for group, lr in zip(opt.param_groups, lrs):
        group["lr"] = lr
    # resident now: runtime, data, weights and optimizer state; gradients are freed by _step
    # but live from the first backward to the update, so they count in the peak
    grads = sum(p.numel() * p.element_size() for p in module.parameters())
    resident = (memory.anon_bytes() or 0) + grads
    opt.state.clear()  # start the run itself with no optimizer state, as plain training does
    # per sample: the difference between two batch sizes (weights are saved once, not per
    # sample)
    saved = [memory.saved_activation_bytes(
        lambda a, b: models.loss_and_correct(module, a, b)[0], x[:n], y[:n])
        for n in (max(probe_batch // 2, 1), probe_batch)]
    per_sample = max(saved[1] - saved[0], 0) / max(probe_batch - probe_batch // 2, 1) \
        if probe_batch > 1 else saved[0]
    peak = memory.estimate_wave_peak(resident, per_sample, cfg.batch_size,
                                     wave.slots_per_node)
    node = memory.NodeMemory()
    valley = memory.estimate_wave_peak(resident, 0, cfg.batch_size, wave.slots_per_node)
    memory.check_node_limit(node.limit_bytes(), peak, cfg.batch_size, wave.waves, valley)
    return {"estimated_wave_peak_bytes": peak, "resident_bytes": resident,
            "activation_bytes_per_sample": per_sample,
            "node_limit_bytes": node.limit_bytes()}


def _train(cfg: TrainConfig, wave: Wave) -> dict:

    rank, world = wave.rank, wave.world
    device = _device(wave, cfg.device)
    ds, module, _, total_steps, opt, sched = loop.setup_run(cfg, rank, world, device)
    estimate = _check_memory(cfg, wave, module, ds, opt, device)
    model = DistributedDataParallel(module)
    sync = grad_sync.register_sync(cfg, model, wave.local_world)
    ticktock = TickTock(wave, turn=cfg.wave_turn)
    ticktock.attach(module)
    node_memory = memory.NodeMemory() if wave.local_rank == 0 else None
    sampler = memory.Sampler(node_memory).start()
    dist.barrier()
    if rank == 0:
        loop.say_training_started()
    step, epoch, losses, timed_from = 0, 0, [], None
    while step < total_steps:
        batches = data.rank_batches(len(ds), cfg.batch_size, rank, world, cfg.seed, epoch)
        for index in batches[:total_steps - step]:
            if step == WARMUP_STEPS:
                timed_from = time.time()
            with noting(rank, "in a training step", step + 1):
                x, y = loop.batch_on(ds, index, device)
                with ticktock.forward(step):
                    loss, _, _ = models.loss_and_correct(model, x, y)
                backward_from = time.time()
                loss.backward()  # DDP's hook synchronises; backward returns when it is done
                synced = time.time()
                computed = ticktock.backward_done_at
                ticktock.record(step, "backward", backward_from, computed)
                ticktock.record(step, "sync", computed, synced)
                opt.step()
                sched.step()
                opt.zero_grad(set_to_none=True)
                ticktock.record(step, "update", synced, time.time())
            losses.append(float(loss.detach()))
            step += 1
            if rank == 0 and cfg.log_every and step % cfg.log_every == 0:
                log.info("step %d/%d loss %.4f", step, total_steps, losses[-1])
        epoch += 1
    timed_to = time.time()
    ticktock.close()
    samples = sampler.stop()
    with noting(rank, "evaluating", step):
        accuracy, test_loss = loop.evaluate(cfg, module, ds, device)
    record = {"rank": rank, "wave": wave.index, "node": wave.node, "slot": wave.slot,
              "events": ticktock.events, "memory": samples, "estimate": estimate,
              "sync_totals": sync.totals()}
    gathered = [None] * world if rank == 0 else None
    dist.gather_object(record, gathered, dst=0)
    if rank != 0:
        return {}
    timed_steps = max(step - WARMUP_STEPS, 0)
    elapsed = timed_to - timed_from if timed_from is not None else None
    summary = {
        "config": cfg.to_dict(), "waves": wave.waves, "world_size": world,
        "processes_per_node": wave.local_world, "steps": step, "timed_steps": timed_steps,
        "samples_per_step": world * cfg.batch_size,
        "samples_per_s": (timed_steps * world * cfg.batch_size / elapsed) if elapsed else None,
        "step_ms": 1000 * elapsed / timed_steps if timed_steps else None,
        "samples_seen": step * world * cfg.batch_size, "final_train_loss": losses[-1],
        "test_accuracy": accuracy, "test_loss": test_loss, "timed_from": timed_from,
        "timed_to": timed_to, "ranks": gathered}
    if cfg.summary:
        write_json_atomic(cfg.summary, summary)
    return summary
