"""The training loop (nanoGPT-style: one function a reader can hold in their head).

    summary = train(TrainConfig(model="lenet", algorithm="hitopk", epochs=2))

Under torchrun (``RANK`` in the environment) every rank runs this; without it, a world of one
in this process. Per step: forward and backward (DDP's hook synchronises the gradients during
backward), optimizer step, schedule step. Timing covers whole steps only (not evaluation or
checkpoints) and leaves out the first ``WARMUP_STEPS`` (DDP rebuilds its buckets after step 1).

The communication share: before training, every rank times ``compute_probe_iters`` steps of a
copy of the model and optimizer without DDP (all ranks at once, so the CPU is as contended as in
training). ``sync_ms_per_iter`` = mean step time - that compute-only time: what synchronisation
adds to a step, overlapped parts excluded. Inter-node bytes come from the node interface's
counters on the emulated cluster (every byte that left the node, headers included) and from
thinwire's traffic model elsewhere.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import datetime
import logging
import os
import statistics
import time

import torch
import torch.distributed as dist

from thinwire.output import check_output_path
from thinwire.peer_failure import noting
from thinwire.optim import LARS, param_groups, warmup_cosine, warmup_poly
from thinwire.train import checkpoint, checkpoint_checks, data, models, modes, replan
from thinwire.train.config import TrainConfig
from thinwire.train.metrics import Metrics, interface_tx_bytes

log = logging.getLogger("thinwire.train")
WARMUP_STEPS = 2
# LARS scales each layer's step by trust = 0.001 * ||w|| / ||g||: its lr is ~10-100x SGD's.
LARS_DEFAULT_LR = 2.0


def train(cfg: TrainConfig) -> dict:
    """Run ``cfg`` with per-step synchronisation (one wave); returns the summary on rank 0 (an
    empty dict on other ranks). ``thinwire.train.train`` chooses this or the two-wave loop."""
    cfg.validate()
    if cfg.waves != 1:
        raise ValueError(f"thinwire.train.loop trains one wave, got waves={cfg.waves}: "
                         "thinwire.train.train (thinwire.train.entry) runs --waves 2")
    for path, param in ((cfg.summary, "--summary"), (cfg.metrics, "--metrics")):
        check_output_path(path, param)  # before training, not after it
    device = _device(cfg)
    owns_group = _init_distributed(device, cfg.collective_timeout_s)
    try:
        chooser = modes.mode_of(cfg.algorithm).resolve
        if chooser is None:
            return _train(cfg, device)
        with noting(dist.get_rank(), "choosing the algorithm (--algorithm auto)", 0):
            resolved, record = chooser(cfg, lambda: _compute_before_choosing(cfg, device))
        replanner = None
        # no plan at the start (a resume the plan could not choose for): none later either
        if cfg.replan_every_s > 0 and modes.mode_of(resolved.algorithm).per_step \
                and "plan_error" not in record:
            # auto's configuration, with the ranks per node the choice resolved (unset: the
            # launcher's), for the re-checks' probes
            planned = dataclasses.replace(cfg, ranks_per_node=resolved.ranks_per_node)
            replanner = replan.Replanner(planned, record,  # DiLoCo's loop is not switched
                                         momentum_correction=resolved.momentum_correction)
            if not resolved.eval_every and dist.get_rank() == 0:
                log.warning("auto: re-planning checks after evaluations; with --eval-every 0 "
                            "they come only at the end of each epoch")
        return _train(resolved, device, record, replanner)
    finally:
        if owns_group:
            dist.destroy_process_group()


def check_device(cfg: TrainConfig) -> None:
    """``cfg``'s device and precision are there on this host (compare checks its runs' before
    the race: they run here)."""
    if cfg.device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: no CUDA device is available (use --device cpu)")
    if cfg.amp == "fp16" and not (cfg.device != "cpu" and torch.cuda.is_available()):
        raise ValueError("--amp fp16 needs a CUDA device (fp16 with GradScaler); on the CPU use "
                         "--amp bf16 or --amp none")


def _device(cfg: TrainConfig) -> torch.device:
    check_device(cfg)
    if cfg.device == "cuda" or (cfg.device == "auto" and torch.cuda.is_available()):
        local = int(os.environ.get("LOCAL_RANK", 0))
        torch.cuda.set_device(local)
        return torch.device("cuda", local)
    return torch.device("cpu")


def _init_distributed(device: torch.device, timeout_s: float) -> bool:
    """The default group, with the run's collective timeout (thinwire's own groups and dlcp's
    transport take theirs from it)."""
    if dist.is_initialized():
        return False
    # On CUDA the gradients travel by NCCL and the loop's own small CPU tensors (evaluation
    # totals, the stop decision, checkpoint votes) by gloo: NCCL takes device tensors only.
    backend = "cpu:gloo,cuda:nccl" if device.type == "cuda" else "gloo"
    timeout = datetime.timedelta(seconds=timeout_s)
    if "RANK" in os.environ:
        dist.init_process_group(backend, timeout=timeout)
    else:  # a world of one, for a plain `thinwire train`
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1,
                                timeout=timeout)
    return True


def _optimizer(cfg: TrainConfig, model: torch.nn.Module, total_steps: int):
    lr = cfg.lr if cfg.lr is not None else \
        (LARS_DEFAULT_LR if cfg.optimizer == "lars" else models.default_lr(cfg.model))
    warmup = cfg.warmup_steps if cfg.warmup_steps is not None else round(0.05 * total_steps)
    warmup = min(warmup, total_steps)
    if cfg.optimizer == "lars":
        opt = LARS(param_groups(model, cfg.weight_decay), lr=lr, momentum=cfg.momentum)
        return opt, warmup_poly(opt, total_steps, warmup)
    # with momentum correction the hook adds the weight decay and the momentum before top-k
    # (thinwire.feedback): the optimizer applies what was sent as it is
    opt = torch.optim.SGD(model.parameters(), lr=lr,
                          momentum=0.0 if cfg.momentum_correction else cfg.momentum,
                          weight_decay=0.0 if cfg.momentum_correction else cfg.weight_decay)
    return opt, warmup_cosine(opt, total_steps, warmup)


def _autocast(cfg: TrainConfig, device: torch.device):
    if cfg.amp == "none":
        return contextlib.nullcontext()
    dtype = torch.bfloat16 if cfg.amp == "bf16" else torch.float16
    return torch.autocast(device.type, dtype=dtype)


def batch_on(ds: data.Dataset, index: torch.Tensor, device: torch.device):
    """The training samples at ``index``, on ``device``."""
    return ds.train_x[index].to(device, non_blocking=True), ds.train_y[index].to(device)


def train_step(cfg, model, opt, sched, scaler, x, y, device) -> torch.Tensor:
    """Forward, backward (the DDP hook synchronises inside it), the optimizer and schedule
    steps; the loss."""
    with _autocast(cfg, device):
        loss, _, _ = models.loss_and_correct(model, x, y)
    if scaler is not None:
        scaler.scale(loss).backward()
        scaler.unscale_(opt)  # LARS's trust ratios need the true gradients
        scaler.step(opt)
        scaler.update()
    else:
        loss.backward()
        opt.step()
    if sched is not None:
        sched.step()
    opt.zero_grad(set_to_none=True)
    return loss.detach()


def compute_only_ms(cfg, module, ds, batches, device, total_steps) -> float | None:
    """Median step time of a copy of the model and optimizer, no communication at all."""
    if not cfg.compute_probe_iters:
        return None
    probe = copy.deepcopy(module)
    opt, _ = _optimizer(cfg, probe, total_steps)
    scaler = torch.amp.GradScaler("cuda") if cfg.amp == "fp16" else None
    times = []
    dist.barrier()
    for i in range(cfg.compute_probe_iters + 1):
        x, y = batch_on(ds, batches[i % len(batches)], device)
        start = time.perf_counter()
        train_step(cfg, probe, opt, None, scaler, x, y, device)
        if device.type == "cuda":
            torch.cuda.synchronize()
        if i:  # the first one allocates
            times.append(time.perf_counter() - start)
    dist.barrier()
    return 1000 * statistics.median(times)


@torch.no_grad()
def evaluate(cfg, module, ds, device, share: tuple[int, int] | None = None,
             group=None) -> tuple[float, float]:
    """Test accuracy and loss over the whole test set; each rank takes every W-th sample.
    ``share`` (rank, W) and ``group`` (what sums the shares; a fault-tolerant run's composed
    world, thinwire.ft.groups) default to the process group's."""
    from thinwire.collectives.primitives import all_reduce_sum

    rank, world = share if share is not None else (dist.get_rank(), dist.get_world_size())
    module.eval()
    totals = torch.zeros(3, dtype=torch.float64)
    for chunk in torch.arange(rank, ds.test_x.shape[0], world).split(500):
        x, y = ds.test_x[chunk].to(device), ds.test_y[chunk].to(device)
        with _autocast(cfg, device):
            loss, correct, count = models.loss_and_correct(module, x, y)
        totals += torch.tensor([correct.item(), count, loss.item() * count], dtype=torch.float64)
    module.train()
    if device.type == "cuda":
        totals = totals.to(device)
    if group is None:
        dist.all_reduce(totals)
    else:
        all_reduce_sum(totals, group)
    totals = totals.cpu()
    return float(totals[0] / totals[1]), float(totals[2] / totals[1])


def _fits(cfg: TrainConfig, module: torch.nn.Module, opt, sched):
    """The check a checkpoint passes before any of it is loaded (else the previous one is)."""
    shapes = [tuple(p.shape) for p in module.parameters() if p.requires_grad]

    def check(payload: dict) -> None:
        checkpoint_checks.check_model(payload["model"], module)
        checkpoint_checks.check_optimizer(payload["optimizer"], opt)
        checkpoint_checks.check_scheduler(payload["scheduler"], sched)
        modes.mode_of(cfg.algorithm).check_hook(payload.get("hook"), cfg.algorithm, shapes)
        checkpoint_checks.check_handover(payload.get("handover"), list(module.parameters()))
    return check


def say_training_started() -> None:
    """Touch the file the emulated cluster's launcher waits for where its schedules count
    from the start of training (``--schedule-clock training``)."""
    from thinwire.cluster.spec import TRAINING_STARTED_ENV

    path = os.environ.get(TRAINING_STARTED_ENV)
    if path:
        with open(path, "a"):
            pass


def _compute_before_choosing(cfg: TrainConfig, device: torch.device) -> float | None:
    """This rank's compute-only step (ms) on the run's model, data and optimizer, for a mode
    that chooses before it trains (auto's compute probe); collective."""
    rank, world = dist.get_rank(), dist.get_world_size()
    ds, module, _, total_steps, _, _ = setup_run(cfg, rank, world, device)
    batches = data.rank_batches(len(ds), cfg.batch_size, rank, world, cfg.seed, 0)
    return compute_only_ms(cfg, module, ds, batches, device, total_steps)


def setup_run(cfg: TrainConfig, rank: int, world: int, device: torch.device):
    """This rank's data set, model, schedule length and optimizer (the same for every entry
    point that trains `cfg`): (ds, module, steps_per_epoch, total_steps, opt, sched)."""
    torch.manual_seed(cfg.seed)
    ds = data.load(models.data_name(cfg.model))
    module = models.build(cfg.model, cfg.seed).to(device)
    steps_per_epoch = len(data.rank_batches(len(ds), cfg.batch_size, rank, world, cfg.seed, 0))
    total_steps = cfg.epochs * steps_per_epoch
    if cfg.max_iters:
        total_steps = min(total_steps, cfg.max_iters)
    opt, sched = _optimizer(cfg, module, total_steps)
    return ds, module, steps_per_epoch, total_steps, opt, sched


def _train(cfg: TrainConfig, device: torch.device, chosen: dict | None = None,
           replanner: replan.Replanner | None = None) -> dict:
    """``chosen``: --algorithm auto's record of its choice (the summary's ``auto``);
    ``replanner``: its re-planning (thinwire.train.replan), or None."""
    rank, world = dist.get_rank(), dist.get_world_size()
    ds, module, steps_per_epoch, total_steps, opt, sched = setup_run(cfg, rank, world, device)
    resume = checkpoint.agreed_resume_directory(cfg)
    saved = checkpoint.load(resume, rank, cfg, world, steps_per_epoch=steps_per_epoch,
                            check=_fits(cfg, module, opt, sched),
                            max_bytes=checkpoint.size_limit(module),
                            # auto's files may straddle a switch: its choice names the step
                            other_choices=bool(chosen and chosen.get("resumed"))) \
        if resume else None
    if saved is not None:
        module.load_state_dict(saved["model"])
    run_id = checkpoint.run_id(saved, device)
    device_ids = [device.index] if device.type == "cuda" else None
    sync = modes.mode_of(cfg.algorithm).build(cfg, module, device_ids)
    model = sync.model
    sync.attach(opt)  # DiLoCo's: a post-step hook on opt runs the outer step
    scaler = torch.amp.GradScaler("cuda") if cfg.amp == "fp16" else None
    metrics = Metrics(cfg, rank, world, total_steps, steps_per_epoch)
    metrics.chosen = chosen
    step, epoch, position = 0, 0, 0
    if saved is not None:
        opt.load_state_dict(saved["optimizer"])
        sched.load_state_dict(saved["scheduler"])
        if scaler is not None and saved.get("scaler"):
            scaler.load_state_dict(saved["scaler"])
        sync.load_state_dict(saved["hook"])
        if saved.get("handover") is not None:  # a switch's shares still owed go on
            sync.handover = replan.HandOver.restored(
                opt, list(module.parameters()), saved["handover"],
                scaler.get_scale if scaler is not None else None)
        step, epoch, position = saved["step"], saved["epoch"], saved["position"]
        metrics.load_state_dict(saved["metrics"])
        log.info("rank %d: resumed from %s at step %d (epoch %d, batch %d)", rank, resume,
                 step, epoch, position)
    first_batches = data.rank_batches(len(ds), cfg.batch_size, rank, world, cfg.seed, epoch)
    metrics.compute_ms = compute_only_ms(cfg, module, ds, first_batches, device, total_steps)
    start_step = step
    tx_start = None

    saved_at = [None]  # the step last saved: the final save does not repeat it (which would
    # also replace the previous checkpoint, the fallback, with a copy of the newest)

    def save_checkpoint():
        saved_at[0] = step
        with noting(rank, "saving a checkpoint", step):
            checkpoint.save(cfg.checkpoint, rank, {
                "identity": checkpoint.identity(cfg), "world_size": world,
                "model": module.state_dict(), "optimizer": opt.state_dict(),
                "scheduler": sched.state_dict(),
                "scaler": scaler.state_dict() if scaler is not None else None,
                "hook": sync.state_dict(), "step": step, "epoch": epoch, "position": position,
                # a switch's residuals not delivered yet (replan.HandOver), or None
                "handover": sync.handover.state_dict() if sync.owes() else None,
                "metrics": metrics.state_dict(), "run": run_id,
                # --algorithm auto's current choice: what a resumed auto run goes on with
                "auto": None if chosen is None else {
                    "choice": replanner.current if replanner else chosen.get("choice"),
                    "settings": replanner.current_settings if replanner
                    else chosen.get("settings")}})

    def run_eval():
        with noting(rank, "evaluating", step):
            acc, loss = evaluate(cfg, module, ds, device)
            metrics.record_eval(step, epoch, acc, loss)  # collective too

    switches: list = []

    def maybe_replan():
        """After an evaluation: every rank holds the same slowest-rank training time."""
        nonlocal cfg, sync, model
        if replanner is None or metrics.stop_reason or not replanner.due(metrics.curve):
            return
        train_time_s = metrics.curve[-1]["train_time_s"]
        began = time.perf_counter()
        with noting(rank, "re-planning (--algorithm auto)", step):
            chosen_now = replanner.check(train_time_s, step)
            if chosen_now:
                totals_end, switch_began = sync.totals(), time.perf_counter()
                model = None  # the old wrapper is freed inside switch, before the new one
                cfg, sync, handed_over = replan.switch(
                    replanner.cfg, chosen_now, sync, module, opt, device_ids,
                    scaler.get_scale if scaler is not None else None,
                    replanner.cfg.handover_steps)
                model = sync.model
                metrics.switched_sync(totals_end, sync.totals())
                switches.append({"step": step, "to": replanner.current,
                                 "handed_over": handed_over,
                                 "switch_s": time.perf_counter() - switch_began})
        took = time.perf_counter() - began
        metrics.add_overhead(took)
        if replanner.events:  # check() records one event each time, whatever it found
            replanner.events[-1]["took_s"] = took  # probe, plan and switch: what it cost

    if rank == 0:
        say_training_started()
    stopped = False
    while step < total_steps and not stopped and not metrics.stop_reason:
        batches = data.rank_batches(len(ds), cfg.batch_size, rank, world, cfg.seed, epoch)
        while position < len(batches) and step < total_steps and not stopped \
                and not metrics.stop_reason:
            if step - start_step == WARMUP_STEPS:
                tx_start = interface_tx_bytes()
                metrics.start_timing(sync.totals())
            x, y = batch_on(ds, batches[position], device)
            begin, cpu_begin = time.perf_counter(), time.process_time()
            with noting(rank, "in a training step", step + 1):
                loss = train_step(cfg, model, opt, sched, scaler, x, y, device)
                if device.type == "cuda":
                    torch.cuda.synchronize()
            step, position = step + 1, position + 1
            metrics.record_step(step, epoch, time.perf_counter() - begin, loss,
                                sched.get_last_lr()[0], time.process_time() - cpu_begin)
            stopped = bool(cfg.stop_after) and step - start_step >= cfg.stop_after
            if cfg.eval_every and step % cfg.eval_every == 0:
                run_eval()
                if step < total_steps and not stopped:  # a switch's hand-over needs a next step
                    maybe_replan()
            if cfg.checkpoint and cfg.checkpoint_every and step % cfg.checkpoint_every == 0:
                save_checkpoint()  # with a switch's residuals not delivered yet
        epoch_done = position >= len(batches)
        if epoch_done:
            epoch, position = epoch + 1, 0
        if not cfg.eval_every and (epoch_done or step >= total_steps) \
                and not metrics.stop_reason:
            run_eval()
            if step < total_steps and not stopped:
                maybe_replan()
    with noting(rank, "finishing the last exchange", step):
        sync.finish(stopped)  # DiLoCo: an exchange in flight lands before the final evaluation
    tx_end = interface_tx_bytes()
    with noting(rank, "finishing", step):
        metrics.stop_timing(sync.totals(), tx_start, tx_end)  # collective
    if cfg.eval_every and not stopped and (not metrics.curve
                                          or metrics.curve[-1]["step"] != step):
        run_eval()
    if cfg.checkpoint and saved_at[0] != step:
        save_checkpoint()
    if replanner is not None:
        metrics.chosen = dict(metrics.chosen, replanning=replan.record(replanner, switches))
    summary = metrics.summary(cfg, step, sum(p.numel() for p in module.parameters()),
                              stopped=stopped)
    metrics.close()
    with noting(rank, "finishing", step):
        dist.barrier()
    with noting(rank, "finishing", step):
        sync.close()  # torchft's managers and lighthouse stop while every rank is here
    return summary if rank == 0 else {}


def setup_logging(verbose: bool = False) -> None:
    rank = os.environ.get("RANK", "0")
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO,
                        format=f"%(asctime)s rank{rank} %(levelname)s %(name)s: %(message)s")
