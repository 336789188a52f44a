"""``--algorithm auto`` re-planning: the link is probed again while the run trains, and where
its goodput moved by more than ``--replan-share`` since the last plan, the plan is made again
at the new rate and the run switches to its choice.

When: right after an evaluation (every rank is there at the same step) once ``--replan-every-s``
seconds of training (the slowest rank's, the number every rank shares) have passed since the
last check, and sooner where the pace of steps moved past ``--replan-share`` in two evaluation
intervals in a row (:meth:`Replanner.due`). The re-check probes with smaller all-reduces than
the first choice (256 KiB and 1 MiB, once each): at 25 Mbit/s it costs about half a second. Its
time, the plan's and the switch's count as training time: the run's time to target pays for its
adaptivity. A re-check the host bound (:mod:`thinwire.link_probe`'s verdict: saturated CPUs, a
CPU quota, or under 80% of the emulator's configured rate) is no evidence of the link: the run
keeps its choice and the check records why.

The switch (:func:`switch`): the residuals a sparse algorithm (or PowerSGD) holds back mean
the coordinates of its own buckets and settings, so each rank hands its own over: added to its
next ``HANDOVER_STEPS`` gradients in equal shares (:class:`HandOver`; at once it is a stale
lump early in training: ``plan_choice.HANDOVER_STEPS`` says what that cost) before the new
synchronisation averages them (its error feedback keeps what it does not send). The mass is
delivered or held (tested: applied + held + still owed = the dense average, through a switch
either way; a checkpoint holds what is still owed and a resumed run goes on taking it), and
the switch sends nothing of its own (a dense flush would cost an all-reduce of the model,
about a dense step: seconds at 25 Mbit/s, just where a switch
to a compressed algorithm pays). With momentum correction the residuals are flushed densely
(DGC's velocity would otherwise count them again at every step they stay unsent). The new
choice starts compressing at once: PowerSGD's dense warm-up steps are not run again. A switch
is ranked by the plan without warm-ups (:func:`thinwire.train.auto.mid_run_s`) and made where it
promises ``SWITCH_MIN_GAIN``; the seconds it saves in the steps left are recorded
(:func:`weigh_switch`). The new synchronisation is a new DDP wrapper around the same module
(DDP takes one communication hook for its life); the optimizer, its momentum and the schedule
go on. Momentum correction's velocities are dropped. DiLoCo candidates are left out mid-run
(another loop), and a run whose first choice is DiLoCo is not re-planned.
"""

from __future__ import annotations

import datetime
import gc
import logging
import time
import weakref

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from thinwire import link_probe
from thinwire.plan_choice import HANDOVER_STEPS, RECHECK_BYTES, SWITCH_MIN_GAIN
from thinwire.train import auto, grad_sync, modes

log = logging.getLogger(__name__)

RECHECK_REPEATS = 1
RECHECK_TRIES = 2  # a re-check whose sizes came out inverted is taken once more at once
# The pace trigger: the reference is the mean pace of this many evaluation intervals after a
# check (the one holding the check skipped), and a check is due where this many intervals in a
# row moved past the share the same way. One interval of compare's MNIST is 2 steps, whose pace
# moves 30% by itself on a busy host: replayed over the recorded races (`thinwire bench
# pace-trigger`, docs/results.md), one interval fires a check (0.4 s at 25 Mbit/s) on steady
# links several times more often than two. A lasting change is seen at its second interval
# once the reference has formed (the fifth interval after a check at the earliest); one inside
# the reference's intervals is left to the clock.
PACE_REFERENCE_INTERVALS = 2
PACE_CONFIRM_INTERVALS = 2
# a run past its predicted steps to target has this share of them left, for weighing a switch
MIN_LEFT_SHARE = 0.1


class Replanner:
    """What the loop asks after each evaluation: :meth:`due`, then :meth:`check` (collective)."""

    def __init__(self, cfg, info: dict, momentum_correction: bool = False):
        self.cfg = cfg  # the run's configuration as given: --algorithm auto, --plan-from
        # the optimizer was built for it (momentum and weight decay in the hook, or in the
        # optimizer): a switch may not change it
        self.momentum_correction = momentum_correction
        self._skip_interval = False  # the interval after a check holds the check's own time
        self.every_s, self.share = cfg.replan_every_s, cfg.replan_share
        self.basis = info["probe"]["goodput_Bps"]  # the goodput the current plan was made at
        self.compute_ms = (info.get("compute") or {}).get("probed_ms")  # the first choice's
        self.intra_node = info["probe"].get("intra_node")  # likewise (checks probe between nodes)
        self.current = info["choice"]
        self.current_settings = info.get("settings")  # what --resume needs to run it again
        # resumed with the checkpoint's choice where the plan at the probed rate ranks another
        # first (the link changed while the job was down): the first check plans again
        # whatever the change since that probe, which is the basis and shows none
        resumed = info.get("resumed") or {}
        self.replan_first = resumed.get("plan_now") not in (None, self.current)
        self.checked_at_s = 0.0
        # seconds a step of each clean interval since the last check (or switch): the first
        # PACE_REFERENCE_INTERVALS make the reference, the later ones are compared with it
        self.paces: list[float] = []
        self._moved: list[int] = []  # each compared interval's way past the share (+1/-1/0)
        # the trigger's interval counts (a replay of recorded curves may try others)
        self.reference_intervals = PACE_REFERENCE_INTERVALS
        self.confirm_intervals = PACE_CONFIRM_INTERVALS
        self.events: list[dict] = []  # every check and switch, for the summary
        self._leaders = None  # the node leaders' group, made at the first check and kept
        self._answers = None  # every rank's group for rank 0's answer, likewise

    def due(self, curve: list[dict]) -> bool:
        """After an evaluation (``curve``: the run's, the same on every rank): every
        ``every_s`` seconds of training, and at once where the pace (seconds a step) of the
        last ``confirm_intervals`` evaluation intervals moved by more than the share, the same
        way, from the mean pace of the ``reference_intervals`` after the last check, which is
        how a link change shows first (one interval alone is the host's noise as often as the
        link)."""
        if self.every_s <= 0 or not curve:
            return False
        now = curve[-1]
        if now["train_time_s"] - self.checked_at_s >= self.every_s:
            return True
        pace = _pace(curve)
        if pace is None:
            return False
        if self._skip_interval:  # it holds the last check's probe, plan and switch
            self._skip_interval = False
            return False
        if len(self.paces) < self.reference_intervals:  # the reference since the last check
            self.paces.append(pace)
            return False
        reference = sum(self.paces) / len(self.paces)
        if reference <= 0:  # no time between evaluations: nothing to compare with
            return False
        ratio = pace / reference
        self._moved.append(1 if ratio > 1 + self.share else
                           -1 if ratio < 1 / (1 + self.share) else 0)
        self._moved = self._moved[-self.confirm_intervals:]
        last = self._moved
        return len(last) == self.confirm_intervals and last[0] != 0 and \
            all(way == last[0] for way in last)

    def restart(self, train_time_s: float) -> None:
        """A check at ``train_time_s``: the clock counts from it; the next interval holds its
        probe, plan and switch and is skipped; the reference pace is measured again after it
        (a switch changes it too)."""
        self.checked_at_s = train_time_s
        self.paces, self._moved, self._skip_interval = [], [], True

    def check(self, train_time_s: float, step: int) -> dict | None:
        """Probe; where the goodput moved by more than the share, plan again (rank 0) and
        return the new choice's settings where it differs from the current one (collective:
        every rank gets the same answer)."""
        self.restart(train_time_s)
        began = time.perf_counter()
        if self._leaders is None:
            self._leaders = link_probe.node_leaders_group(self.cfg.ranks_per_node,
                                                    self.cfg.collective_timeout_s)
            _warm_up(self._leaders)
        probe = None
        for attempt in range(RECHECK_TRIES):
            try:
                probe = auto.probe_inter_node(self.cfg.ranks_per_node,
                                              self.cfg.collective_timeout_s, RECHECK_BYTES,
                                              RECHECK_REPEATS, self._leaders)
                break
            except ValueError as exc:  # swamped by noise (its sizes inverted): alike on every
                # rank (rank 0's numbers); at high rates the two sizes differ by milliseconds
                if attempt + 1 == RECHECK_TRIES:  # no evidence of a change this time
                    self.events.append({"step": step, "at_s": train_time_s,
                                        "kept": self.current, "reason": str(exc)})
                    return None
        goodput = probe["goodput_Bps"]
        change = goodput / self.basis - 1
        event = {"step": step, "at_s": train_time_s, "goodput_Bps": goodput,
                 "change": change, "probe_s": time.perf_counter() - began}
        if not probe.get("trusted", True):  # it measured the host: no evidence of the link
            self.events.append(dict(event, kept=self.current, bound_by=probe.get("bound_by"),
                                    reason=f"probe not trusted: {probe.get('why')}"))
            return None
        if abs(change) <= self.share and not self.replan_first:
            self.events.append(dict(event, kept=self.current))
            return None
        self.replan_first = False
        message = None
        if dist.get_rank() == 0:
            try:
                chosen, info = auto.choose(self.cfg, probe["nodes"],
                                           dict(probe, intra_node=self.intra_node),
                                           per_step_only=True, current=self.current,
                                           compute_ms=self.compute_ms)
                message = {"chosen": chosen, "choice": info["choice"],
                           "planned_at_bps": info["planned_at_bps"],
                           "best_s": info["predicted_time_to_target_s"],
                           "current_s": info.get("current_time_to_target_s"),
                           "switch": info.get("switch")}
            except Exception as exc:  # noqa: BLE001 - every rank ends with rank 0's error
                message = {"error": f"{type(exc).__name__}: {exc}"}
        if self._answers is None:  # a gloo group of every rank, kept: rank 0 plans meanwhile
            self._answers = dist.new_group(backend="gloo", timeout=datetime.timedelta(
                seconds=max(auto.RECHOOSING_TIMEOUT_S, self.cfg.collective_timeout_s)))
        message = auto.broadcast_json(message, self._answers)
        if "error" in message:  # the run goes on with what it has: no rank is left waiting
            log.warning("auto: re-planning at step %d failed (%s); keeping %s", step,
                        message["error"], self.current)
            self.events.append(dict(event, kept=self.current, reason=message["error"]))
            return None
        self.basis = goodput
        event["planned_at_bps"] = message["planned_at_bps"]
        event["probe_and_plan_s"] = time.perf_counter() - began
        if message["choice"] == self.current:
            self.events.append(dict(event, kept=self.current))
            return None
        if bool(message["chosen"].get("momentum_correction", False)) != \
                self.momentum_correction:
            self.events.append(dict(event, kept=self.current, best=message["choice"],
                                    reason="the best changes momentum correction, which the "
                                           "optimizer was built for"))
            return None
        if message["current_s"] is not None:
            gain = message["current_s"] / message["best_s"] - 1
            event["predicted_gain"] = gain
            if gain < SWITCH_MIN_GAIN:
                self.events.append(dict(event, kept=self.current, best=message["choice"]))
                return None
        # the seconds it saves, for the record: with nothing sent and no warm-up run by the
        # switch, the relative gain above decides alone
        weighed = weigh_switch(message.get("switch") or {}, step)
        if weighed is not None:
            event["weighed"] = weighed
        event.update(switched_from=self.current, switched_to=message["choice"])
        self.events.append(event)
        log.info("auto: the link moved %+.0f%%; switching from %s to %s at step %d",
                 100 * change, self.current, message["choice"], step)
        self.current, self.current_settings = message["choice"], message["chosen"]
        return message["chosen"]


def weigh_switch(figures: dict, step: int) -> dict | None:
    """A switch's worth in seconds at the new rate: the steps left (the share of the current
    choice's predicted steps not yet taken, at least ``MIN_LEFT_SHARE``: a run past its
    prediction is not taken to be done) at each one's step time. The switch itself sends
    nothing (the residuals are handed over, not flushed: :func:`switch`) and runs no warm-up;
    the new wrapper's first step is an ordinary one. None where the plan gave no figures for
    the current choice."""
    current, best = figures.get("current"), figures.get("best")
    if not current or not best or not current["steps"]:
        return None
    share = max(MIN_LEFT_SHARE, 1.0 - step / current["steps"])
    current_left = share * current["steps"] * current["step_s"]
    best_left = share * best["steps"] * best["step_s"]
    return {"left_share": share, "current_left_s": current_left, "best_left_s": best_left,
            "gain_s": current_left - best_left}


def _pace(curve: list[dict]) -> float | None:
    """Seconds of training a step over the last evaluation interval."""
    if len(curve) < 2 or curve[-1]["step"] <= curve[-2]["step"]:
        return None
    return (curve[-1]["train_time_s"] - curve[-2]["train_time_s"]) / \
        (curve[-1]["step"] - curve[-2]["step"])


def _warm_up(leaders_group) -> None:
    """One small exchange on a new leaders' group: its connections open outside the timing."""
    leaders, group = leaders_group
    if len(leaders) > 1 and dist.get_rank() in leaders:
        dist.all_reduce(torch.ones(1024, device=link_probe.probe_device()), group=group)


def resolved(original, chosen: dict):
    """The run's configuration with a plan's ``chosen`` settings, as auto's first choice
    builds it (:func:`thinwire.train.auto.applied`)."""
    return auto.applied(original, chosen)


def switch(original, chosen: dict, sync, module, optimizer, device_ids, scale_of=None,
           handover_steps: int = HANDOVER_STEPS):
    """Hand ``sync``'s residuals over to the synchronisation ``chosen`` names, built on
    ``module`` (collective). Returns (the new cfg, the new sync, the residuals' record).
    ``scale_of()``: the GradScaler's current loss scale (None: no scaler).

    Each rank's own residual (what its error feedback held back, in its gradient's units) is
    added to its next ``handover_steps`` gradients in equal shares (:class:`HandOver`, held by
    the new sync until delivered), before the new synchronisation sees them: the new algorithm
    averages them with the gradients, and what it does not send its own error feedback keeps.
    The mass the old one held back is delivered or held (a share not delivered yet is the new
    sync's to flush: another switch hands it on), and the switch sends nothing of its
    own (a dense flush of the model cost about a dense step: seconds at 25 Mbit/s). The new
    synchronisation starts compressing at once (PowerSGD's dense warm-up is not run again).
    With momentum correction the residual is DGC's accumulated velocity: fed into the new
    algorithm's momentum it would come back at every step it stays unsent, so it is flushed
    densely as before (averaged over the ranks, added once inside the next optimizer step)."""
    new_cfg = resolved(original, chosen)
    if not modes.mode_of(new_cfg.algorithm).per_step:
        raise ValueError(f"re-planning switches between per-step synchronisations, got "
                         f"{new_cfg.algorithm!r}")
    dense_flush = bool(new_cfg.momentum_correction)
    scale = scale_of() if scale_of is not None else 1.0
    owed, mass = sync.flush(average=dense_flush)
    sync.close()
    _release_wrapper(sync)
    del sync
    # init_sync=False: every rank's parameters are already equal (the same averaged steps);
    # DDP's initial broadcast of the model would cost a dense exchange on the slow link
    # (13 MB, 4 s at 25 Mbit/s for compare's MNIST model)
    model = DistributedDataParallel(module, device_ids=device_ids, init_sync=False)
    new_sync = grad_sync.register_sync(new_cfg, model, new_cfg.ranks_per_node, switched=True)
    new_sync.attach(optimizer)
    if owed is not None and dense_flush:
        add_once_before_step(optimizer, list(module.parameters()), owed, scale)
    elif owed is not None:
        new_sync.handover = HandOver(optimizer, list(module.parameters()), owed, scale,
                                     scale_of, handover_steps)
    how = "flushed densely" if dense_flush else f"handed over in {handover_steps} steps"
    return new_cfg, new_sync, dict(mass, how=how)


def _release_wrapper(sync) -> None:
    """Free ``sync``'s DDP wrapper before a new one is built on the same module: its reducer
    holds hooks on every parameter until it is freed, and two reducers would both reduce each
    gradient. The caller holds no other reference. Its last reference dropped frees it (seen
    in the switches of compare's races); the cycle collector runs only where something still
    holds it, since a full collection cost 0.12-0.41 s of a switch's 0.3-0.5 s on 4 ranks
    sharing this host's 2 cores (285,000 objects a rank, mostly torch's own)."""
    wrapper = weakref.ref(sync.model)
    sync.model = None
    if wrapper() is not None:
        gc.collect()
    if wrapper() is not None:
        raise RuntimeError("re-planning: the old DDP wrapper is still referenced after the "
                           "switch released it; its reducer would reduce every gradient a "
                           "second time")


class HandOver:
    """Residuals a switch owes the next steps' gradients: ``owed[i] / steps`` added to
    ``params[i]``'s gradient in every backward until an ``optimizer.step()`` completes, for
    ``steps`` completed steps (before DDP's buckets take it: a hook on the parameter runs before
    its gradient is accumulated, DDP's after). A step a GradScaler skips discards that gradient,
    so the next backward adds the share again. ``scale``: the loss scale the residuals were kept
    at; ``scale_of()``: the scale now (the shares follow it), None: no scaler. What no step
    has taken yet is :meth:`pending` (a checkpoint or another switch takes it from there)."""

    def __init__(self, optimizer, params: list, owed: list, scale: float = 1.0, scale_of=None,
                 steps: int = 1):
        if not isinstance(steps, int) or steps < 1:
            raise ValueError(f"steps must be an integer >= 1, got {steps!r}")
        self.owed, self.scale, self.scale_of = owed, scale, scale_of
        self.steps = self.left = steps
        self._handles = [p.register_hook(self._adder(extra))
                         for p, extra in zip(params, owed)
                         if extra is not None and p.requires_grad]
        self._step_handle = optimizer.register_step_post_hook(self._stepped)

    def _adder(self, extra: torch.Tensor):
        def add(grad):
            factor = self._factor()
            return grad + extra.to(grad.dtype) * (factor / self.steps)
        return add

    def _factor(self) -> float:
        """The loss scale now over the one the residuals were kept at: a run without a scaler
        now is at 1 (one resumed under --amp none from a checkpoint kept under fp16's 65536
        takes the shares unscaled, not 65536 times too large)."""
        return (1.0 if self.scale_of is None else self.scale_of()) / self.scale

    def _stepped(self, opt, args, kwargs) -> None:
        self.left -= 1
        if self.left <= 0:
            self.cancel()

    def cancel(self) -> None:
        """No step takes anything more (another switch took :meth:`pending` over)."""
        self.left = 0
        for handle in self._handles:
            handle.remove()
        self._step_handle.remove()
        self._handles = []

    def state_dict(self) -> dict:
        """What a checkpoint keeps of it (plain tensors and numbers: loads with
        ``weights_only=True``; checked by :func:`checkpoint_checks.check_handover`)."""
        return {"owed": list(self.owed), "steps": self.steps, "left": self.left,
                "scale": float(self.scale)}

    @classmethod
    def restored(cls, optimizer, params: list, saved: dict, scale_of=None) -> "HandOver":
        """A checkpoint's hand-over, going on with the shares it had left."""
        owed = [None if o is None else o.to(p.device) for o, p in zip(saved["owed"], params)]
        handover = cls(optimizer, params, owed, saved["scale"], scale_of, saved["steps"])
        handover.left = saved["left"]
        return handover

    def pending(self) -> list | None:
        """What no completed step has taken yet, per parameter, at the loss scale now (as
        the residuals a flush returns); None where nothing is left."""
        if self.left <= 0:
            return None
        factor = self._factor()
        return [None if o is None else o * (factor * self.left / self.steps)
                for o in self.owed]


def add_once_before_step(optimizer, params: list, flushed: list, scale: float = 1.0) -> None:
    """``flushed[i] / scale`` added to ``params[i].grad`` inside the next ``optimizer.step()``,
    after the step's gradients are synchronised (and unscaled, with a GradScaler: ``scale``
    is the loss scale the flushed residuals were kept at), then never again."""
    handle = None

    def add(opt, args, kwargs):
        with torch.no_grad():
            for p, extra in zip(params, flushed):
                if extra is not None and p.grad is not None:
                    p.grad.add_(extra.to(p.grad.dtype), alpha=1.0 / scale)
        handle.remove()

    handle = optimizer.register_step_pre_hook(add)


def record(replanner: Replanner | None, switches: list) -> dict | None:
    """The summary's ``auto.replanning``."""
    if replanner is None:
        return None
    return {"every_s": replanner.every_s, "share": replanner.share,
            "checks": replanner.events, "switches": switches,
            "final_choice": replanner.current, "final_settings": replanner.current_settings}
