"""``algorithm="auto"`` for :func:`thinwire.ddp.register`: the hook's settings chosen from a plan
at registration, and chosen again while the script trains (:func:`replan`).

Registration (:func:`auto_state`): the plan and the caller's settings are checked on every rank
before anything is probed; the node leaders probe the link and every rank registers the plan's
fastest candidate a thinwire hook runs at that rate (:mod:`thinwire.plan_choice`).

Re-planning (:func:`replan`, collective, between steps): the leaders probe the link again with
two small all-reduces (``plan_choice.RECHECK_BYTES``: about half a second at 25 Mbit/s), and
where the goodput moved by more than ``share`` since the current choice was made, the plan is
read at the new rate (:func:`thinwire.plan_choice.decide_switch`). A switch replaces the hook's
SyncState between steps; DDP keeps its one hook and its buckets. What a sparse algorithm held
back (its residuals mean its own buckets' coordinates) is handed over: each rank's own residual
is added to its next ``plan_choice.HANDOVER_STEPS`` steps' buckets in equal shares before they
are reduced (at once it is a stale lump early in training: see ``HANDOVER_STEPS``), so the new
algorithm averages it with the gradient and its error feedback keeps what it does not send; the
mass is delivered or held and the switch exchanges nothing (the same rule as ``thinwire
train``'s re-planning;
tested: the steps' gradients add up to the ranks' dense average). With momentum correction
they are flushed densely instead (averaged, added after the next step's reduction): DGC's
velocity would count a handed-over residual again at every step it stays unsent. The new state
continues the old one's step count (a warm-up or ``dense_iterations`` is not run again); its
traffic totals and momentum correction's velocities start anew. Until those steps have taken
their shares the residuals are owed by the hook, not held by a state:
:func:`thinwire.ddp.flush_residuals` returns them with the state's own (and owes nothing
more), but a checkpoint of the state taken in those steps lacks them (checkpoint before
``replan``, or ``HANDOVER_STEPS`` steps after a switch). Each share is added to whatever its
step's buckets carry: a step the caller then skips (a GradScaler's overflow,
``nonfinite="skip"``) drops its share, and with ``find_unused_parameters=True`` a parameter a
step did not use gets none of that share. A run resumed
from a checkpoint (``register(model, state=saved)``) trains with the saved choice and is not
re-planned. A re-check whose probe
measured the host rather than the link keeps the choice and says why; so does one whose plan
has no candidate at the new rate: training never stops for a re-check.
"""

from __future__ import annotations

import logging
import math
import statistics
import time

import torch
import torch.distributed as dist

from thinwire import link_probe, plan_choice
from thinwire.state import SyncState
from thinwire.topology import Topology, ranks_per_node_of

log = logging.getLogger(__name__)

PACE_CALLS = 5  # calls of replan(every_s=...) whose median interval is a step's pace
# one interval this many times the pace is due at once: a link that fell under a wire-bound
# step shows as a jump (1 Gbit/s -> 25 Mbit/s made ddp-fp16's MNIST step 11x longer), and
# waiting for the median to move cost 3 such steps; a smaller change waits for the median
JUMP = 2.0
# the clock's interval doubles after each check that found the link where it was, up to this
# many times every_s (and is every_s again after one that found it moved): at 25 Mbit/s a
# check costs about 0.45 s, 4.5% of a 10 s clock, while the pace and jump triggers, which cost
# nothing, see a change of a wire-bound step first (the library race: 4 clock checks after the
# fall, every one of them keeping hitopk)
CLOCK_BACKOFF_MAX = 8


class AutoContext:
    """What a model registered with ``algorithm="auto"`` keeps for :func:`replan`."""

    def __init__(self, plan: dict, settings: dict, basis_Bps: float, device: torch.device):
        self.plan = plan  # checked (plan_choice.load and check)
        self.settings = dict(settings)  # the caller's, kept through every switch
        self.basis_Bps = basis_Bps  # the goodput the current choice was planned at
        self.device = device
        self.leaders = None  # the node leaders' group, made at the first re-check and kept
        self.checks: list[dict] = []  # every re-check, for the state's record
        self.switches = 0
        # rank 0's clock for replan(every_s=...): when the last check ended, when replan was
        # last called, and the seconds between calls since (a step's pace)
        self.last_check_s = time.perf_counter()
        self.last_call_s: float | None = None
        self.recent: list[float] = []
        self.pace: float | None = None  # the median of PACE_CALLS calls after the last check
        self.due_why: str | None = None  # rank 0's DUE_WHY, at the last due_at
        self.flag_group = None  # a gloo group for the due flag (no device sync a step)
        # off after a jump that was not the link (its check kept the choice and found the
        # link where it was, or could not tell: a script's evaluation every few steps would
        # otherwise probe at each); on again after a clock check or a switch
        self.jump_armed = True
        self.clock_backoff = 1  # the clock waits every_s times this (CLOCK_BACKOFF_MAX)
        # the pilot (replan(every_s=..., pilot=N)): the candidates still to measure after the
        # current one (None: not yet listed for the current plan choice), and whether a pilot
        # is under way (it holds the clock and pace checks)
        self.pilot_queue: list[str] | None = None
        self.piloting = False
        # every pace a pilot measured: candidate -> [(the plan's nominal bps then, seconds a
        # step)]; near that rate it stands for the plan's step time (a link that comes back to
        # a rate already piloted is not piloted again)
        self.measured: dict[str, list[tuple[float, float]]] = {}

    def due_at(self, now: float, every_s: float, share: float) -> bool:
        """Whether a check is due at ``now`` (rank 0's ``time.perf_counter()``, at a call of
        replan): ``every_s`` seconds (times ``clock_backoff``: :meth:`checked`) since the
        last check ended ("clock"); the last interval
        alone at least ``JUMP`` times the pace after the last check ("jump"); or the pace (the
        median seconds between the last ``PACE_CALLS`` calls) moved by more than ``share``
        from it ("pace"): how a link change shows first, whatever ``every_s``. The first
        ``PACE_CALLS + 1`` calls after a check set that pace: a change inside them is seen by
        the clock, or once the pace is set and it moves again. A jump that was not the link
        (a script's evaluation, a collection pause) costs one probe that keeps the choice,
        and turns the jump trigger off until the next clock check (:meth:`checked`). While a
        pilot runs, the check due is its own ("pilot"), once the pace is set, or a jump over
        the candidate's own steps so far (the pilot is then given up for a check)."""
        if self.last_call_s is not None:
            self.recent = (self.recent + [now - self.last_call_s])[-PACE_CALLS:]
        self.last_call_s = now
        self.due_why = None
        if self.piloting:  # the pilot holds the other checks: its paces are at one rate
            earlier = self.recent[:-1]
            if self.jump_armed and len(earlier) >= 2 and \
                    self.recent[-1] >= JUMP * statistics.median(earlier) > 0:
                self.due_why = "jump"  # the link moved under the pilot: it is given up
            elif len(self.recent) == PACE_CALLS and self.pace is None:
                self.pace = statistics.median(self.recent)
                self.due_why = "pilot"
        elif now - self.last_check_s >= every_s * self.clock_backoff:
            self.due_why = "clock"
        elif len(self.recent) == PACE_CALLS:
            pace = statistics.median(self.recent)
            if self.pace is None:
                self.pace = pace
            elif self.jump_armed and self.recent[-1] >= JUMP * self.pace > 0:
                self.due_why = "jump"
            elif not self.pace / (1 + share) <= pace <= self.pace * (1 + share):
                self.due_why = "pace"
        return self.due_why is not None

    def checked(self, now: float, why: str = "call", switched: bool = False,
                steady: bool | None = None) -> None:
        """A check (due for ``why``) ended at ``now``: the clock and the pace start again (the
        interval that holds the check is not a step's pace); a jump whose check kept the
        choice, unless its probe found the link moved (``steady`` False: the jump was the
        link, re-planned to the same choice), disarms the jump trigger until a clock check or
        a switch. ``steady``: the
        check's probe found the link within ``share`` of the plan's rate (the clock's interval
        doubles, up to ``CLOCK_BACKOFF_MAX``), or moved (back to ``every_s``); None: no
        evidence either way (a probe the host bound, a pilot's check). Any switch, a pilot's
        too, sets the interval back to ``every_s``."""
        self.last_check_s, self.last_call_s, self.recent, self.pace = now, None, [], None
        if switched or steady is False:
            self.clock_backoff = 1
        elif steady:
            self.clock_backoff = min(2 * self.clock_backoff, CLOCK_BACKOFF_MAX)
        if why == "jump" and not switched and steady is not False:
            self.jump_armed = False
        elif why == "clock" or switched:
            self.jump_armed = True

    def start_pilot(self) -> None:
        """A pilot starts at the next call: the pace is measured from there (the steps before
        may be a warm-up's)."""
        self.last_call_s, self.recent, self.pace = None, [], None

    def fits(self, algorithm: str, chosen: dict) -> str | None:
        """None where the caller's settings suit ``algorithm`` with ``chosen``, else why not."""
        try:
            SyncState(None, algorithm, **chosen, **self.settings)
        except (TypeError, ValueError) as exc:
            return str(exc)
        return None


def auto_state(ddp_model, plan, topology, ranks_per_node, timeout, settings):
    """(the chosen state, its AutoContext, the topology). A rank whose check failed ends every
    rank (its own error there, a note naming it elsewhere): none waits."""
    if plan is None:
        raise ValueError("algorithm='auto' needs plan= (thinwire plan --json PATH's file, or "
                         "its dict)")
    shape = _world_and_ranks_per_node(topology, ranks_per_node)
    device = link_probe.probe_device(next(ddp_model.module.parameters(), torch.empty(0)).device)
    error, checked = None, None
    try:
        checked = plan_choice.load(plan)
        auto = AutoContext(checked, settings, 0.0, device)
        # a bad value, or one that suits no algorithm (a sparse-only setting suits the sparse
        # candidates alone: the choice keeps to them)
        why = [auto.fits(name, {}) for name in ("hitopk", "allreduce")]
        if all(why):
            raise ValueError(f"algorithm='auto': these settings suit neither hitopk nor "
                             f"allreduce: {why[0]}")
        plan_choice.check(checked, *shape, settings)
    except ValueError as exc:
        error = exc
    # the plans themselves must agree, not only the choice at the probed rate: plans that
    # differ at another rate would part the ranks' decisions at a later re-check, and their
    # collectives with them (a hang, not an error). On the default group: the topology's
    # groups are made after (making them waits for every rank, one that failed here too).
    plan_choice.agree(error, device, "checking its plan and settings",
                      plan_choice.digest_of(plan_choice.deciding(checked))
                      if error is None else 0, differ="the ranks' plans differ")
    topology = topology or Topology.shared(ranks_per_node, timeout)
    algorithm, chosen, record = plan_choice.resolve(checked, topology.ranks_per_node,
                                                    _timeout_s(topology), auto.fits, device,
                                                    topology.world)
    auto.basis_Bps = record["probe"]["goodput_Bps"]
    auto.checked(time.perf_counter())  # replan's clock counts from here, not the checks
    state = SyncState(None, algorithm, **chosen, **settings)
    state.auto = record
    return state, auto, topology


def _timeout_s(topology: Topology) -> float:
    # the probe's collectives wait as long as the hook's would (PyTorch's default where unset)
    return topology.timeout.total_seconds() if topology.timeout else 1800.0


def _world_and_ranks_per_node(topology, ranks_per_node) -> tuple[int, int]:
    """The cluster's shape before any group is built (a bad plan fails before a collective)."""
    if topology is not None:
        return topology.world_size, topology.ranks_per_node
    if not dist.is_initialized():
        raise RuntimeError("algorithm='auto' needs torch.distributed initialised "
                           "(init_process_group) before thinwire.ddp.register")
    world = dist.get_world_size()
    return world, ranks_per_node_of(ranks_per_node, world)


def _check_share(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or \
            not math.isfinite(value) or value < 0:
        raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
    return float(value)


def replan(ddp_model, context, share: float = 0.3,
           min_gain: float = plan_choice.SWITCH_MIN_GAIN,
           every_s: float | None = None, pilot: int = 2) -> dict | None:
    """Probe the link again and switch the hook where the plan says so (collective: every rank
    calls it between the same two steps). Returns the re-check's event (also appended to the
    state's ``auto["replanning"]["checks"]``); the registered state afterwards is
    ``context.state`` (a new SyncState where it switched). ``every_s``: called after every
    step, it checks only where due (:meth:`AutoContext.due_at`, rank 0's clock, broadcast: one
    two-number collective a call) and returns None where not. ``pilot`` (with ``every_s``):
    after each choice the plan makes, up to this many runners-up the plan predicts within
    ``plan_choice.PILOT_WITHIN`` of it are run for ``PACE_CALLS + 1`` steps each, and the
    candidate whose measured pace gives the shortest time to target is kept (:func:`_pilot`)."""
    share, min_gain = _check_share("share", share), _check_share("min_gain", min_gain)
    if every_s is not None:
        every_s = _check_share("every_s", every_s)
    if isinstance(pilot, bool) or not isinstance(pilot, int) or pilot < 0:
        raise ValueError(f"pilot must be an integer >= 0 (how many runners-up to measure), "
                         f"got {pilot!r}")
    auto: AutoContext | None = getattr(context, "auto", None)
    if auto is None:
        raise ValueError("thinwire.ddp.replan is for a model registered with algorithm='auto' "
                         "(thinwire.ddp.register(model, 'auto', plan=...))")
    why = "call"
    if every_s is not None:
        # a new plan choice, past the caller's warm-up (a dense or denser start would be
        # measured, not the candidate): list its pilot, alike on every rank (checked)
        warm_up = auto.settings.get("dense_iterations", 0) + \
            auto.settings.get("density_warmup_steps", 0)
        if auto.pilot_queue is None and context.state.steps >= warm_up:
            _list_pilot(context, auto, pilot)
        why, pace = _due(auto, every_s, share, context.state.topology)
        if why is None:
            return None
        if why == "pilot":
            event = dict(_pilot(context, auto, pace), due=why)
            auto.checks[-1] = event
            auto.checked(time.perf_counter(), why, "switched_to" in event)
            return event
        if auto.piloting:  # a jump under the pilot: the link moved; check it, pilot again
            auto.piloting, auto.pilot_queue = False, None
    event = dict(_check(context, auto, share, min_gain), due=why)
    auto.checks[-1] = event
    # a trusted probe inside the share: steady; one that moved: not; no evidence: None
    trusted = "change" in event and "bound_by" not in event
    auto.checked(time.perf_counter(), why, "switched_to" in event,
                 abs(event["change"]) <= share if trusted else None)
    return event


def _list_pilot(context, auto: AutoContext, pilot: int) -> None:
    """The pilot of the current choice (collective: the ranks check they listed alike before
    any of them switches): the runners-up to measure after it, and whether to pilot at all
    (also where no runner-up is left to measure but the current choice was not measured at
    this rate while others near it were: it is measured to be compared with them)."""
    error, queue, piloting = None, [], False
    try:
        current = context.state.auto["choice"]
        queue = plan_choice.pilot_candidates(auto.plan, auto.basis_Bps, current, auto.fits,
                                             measured=auto.measured)[:pilot]
        near = plan_choice.measured_near(auto.measured, plan_choice.nominal_bps(
            auto.plan, auto.basis_Bps))
        piloting = pilot > 0 and (bool(queue) or (current not in near and bool(near)))
    except (ValueError, KeyError, TypeError) as exc:
        error = exc
    plan_choice.agree(error, auto.device, "listing the pilot",
                      plan_choice.digest_of([queue, piloting]), context.state.topology.world)
    auto.pilot_queue, auto.piloting = queue, piloting
    if piloting:
        auto.start_pilot()


DUE_WHY = (None, "clock", "pace", "jump", "pilot")


def _due(auto: AutoContext, every_s: float, share: float,
         topology: Topology) -> tuple[str | None, float]:
    """Rank 0's decision, every rank's (collective): why a check is due, or None, and rank 0's
    pace (a pilot's measure). The flag travels by a gloo group of its own: on the CPU, so
    reading it never waits for the GPU."""
    if auto.flag_group is None:  # waits as long as the hook's collectives (register's timeout)
        auto.flag_group = dist.new_group(backend="gloo", timeout=topology.timeout)
    flag = torch.zeros(2, dtype=torch.float64)
    if dist.get_rank() == 0:
        auto.due_at(time.perf_counter(), every_s, share)
        flag[0] = DUE_WHY.index(auto.due_why)
        flag[1] = auto.pace if auto.pace is not None else -1.0
    dist.broadcast(flag, src=0, group=auto.flag_group)
    return DUE_WHY[int(flag[0].item())], float(flag[1].item())


def _pilot(context, auto: AutoContext, pace: float) -> dict:
    """The current candidate's pace is set: record it, then switch to the next candidate to
    measure, or, all measured, keep the one whose plan steps at its measured pace reach the
    target soonest, among this pilot's and those an earlier pilot measured near this rate
    (switching to it where it is not the one running and promises more than
    ``plan_choice.PILOT_MARGIN``). Every rank decides from rank 0's broadcast pace, and the
    ranks check they decided alike before any of them switches (a switch changes what every
    rank's hook reduces)."""
    state = context.state
    current = state.auto["choice"]
    replanning = state.auto.get("replanning") or {}
    event = {"pilot": True, "measured": current, "pace_s": pace, "step": state.steps}
    error, target, switch = None, None, None
    try:
        bps = plan_choice.nominal_bps(auto.plan, auto.basis_Bps)
        auto.measured.setdefault(current, []).append((bps, pace))
        if auto.pilot_queue:
            target = auto.pilot_queue.pop(0)
        else:
            auto.piloting = False
            # this pilot's candidates and any an earlier pilot measured near this rate
            scores = plan_choice.measured_scores(auto.plan, auto.basis_Bps, auto.measured)
            best = min(scores, key=scores.get) if scores else current
            event.update(paces=plan_choice.measured_near(auto.measured, bps),
                         predicted_at_pace_s=scores, best=best)
            # a current choice without a score (its plan row has no step time to scale by
            # its pace) cannot be compared: it is kept, not left for any measured one
            if best != current and current in scores and scores[current] > \
                    scores[best] * (1 + plan_choice.PILOT_MARGIN):
                target = best
            event["chosen"] = target or current
        switch = plan_choice.choose(auto.plan, auto.basis_Bps, auto.fits, among={target},
                                    measured=auto.measured) if target else None
    except (ValueError, KeyError, TypeError) as exc:
        error = exc
    plan_choice.agree(error, auto.device, "the pilot", plan_choice.digest_of([target, current]),
                      context.state.topology.world)
    began = time.perf_counter()
    if switch is None:
        event["kept"] = current
    else:
        _switch(context, auto, state.auto.get("probe"), *switch)
        event.update(switched_from=current, switched_to=target)
        log.info("auto: pilot measured %s at %.3f s a step; switched to %s at step %d",
                 current, pace, target, state.steps)
    event["switch_s"] = time.perf_counter() - began
    if not auto.piloting:
        context.state.auto["pilot"] = {k: event[k] for k in ("paces", "predicted_at_pace_s",
                                                              "best", "chosen") if k in event}
    auto.checks.append(event)
    context.state.auto["replanning"] = dict(replanning, checks=auto.checks,
                                            switches=auto.switches)
    return event


def _check(context, auto: AutoContext, share: float, min_gain: float) -> dict:
    state = context.state
    topology = state.topology
    began = time.perf_counter()
    if auto.leaders is None:
        auto.leaders = link_probe.node_leaders_group(topology.ranks_per_node,
                                                     _timeout_s(topology))
        leaders, group = auto.leaders
        if dist.get_rank() in leaders:  # its connections open outside the timing
            dist.all_reduce(torch.ones(1024, device=auto.device), group=group)
    current = state.auto["choice"]
    switch = None
    try:
        probe = link_probe.probe_inter_node(topology.ranks_per_node, _timeout_s(topology),
                                            plan_choice.RECHECK_BYTES, 1, auto.leaders,
                                            auto.device, topology.world)
    except ValueError as exc:  # a probe swamped by noise (alike on every rank): no evidence
        event = {"kept": current, "reason": str(exc)}
    else:
        try:
            event, switch = plan_choice.decide_switch(auto.plan, current, auto.basis_Bps,
                                                      probe, share, min_gain, auto.fits,
                                                      auto.measured)
        except ValueError as exc:  # no candidate at the new rate: training goes on as it is
            event = {"goodput_Bps": probe["goodput_Bps"], "kept": current, "reason": str(exc),
                     "change": probe["goodput_Bps"] / auto.basis_Bps - 1}
        if "planned_at_bps" in event:  # planned again at a new rate: a choice to pilot
            auto.basis_Bps, auto.pilot_queue = probe["goodput_Bps"], None
    # the choice and the rate it now stands planned at: ranks that kept the choice but differ
    # on the rate would part at the next pilot's listing
    decided = [switch[:2] if switch else event.get("kept"), auto.basis_Bps]
    plan_choice.agree(None, auto.device, "re-planning", plan_choice.digest_of(decided),
                      topology.world)
    event = dict(event, step=state.steps, probe_s=time.perf_counter() - began)
    if switch is not None:
        _switch(context, auto, probe, *switch)
        log.info("auto: the link moved %+.0f%%; switched from %s to %s at step %d",
                 100 * event["change"], current, event["switched_to"], event["step"])
    auto.checks.append(event)
    context.state.auto["replanning"] = {"share": share, "min_gain": min_gain,
                                        "checks": auto.checks, "switches": auto.switches}
    return event


def _switch(context, auto: AutoContext, probe: dict, algorithm: str, settings: dict,
            record: dict) -> None:
    """Register the new state and hand this rank's residuals of the current one over to it:
    the hook adds them to the next ``HANDOVER_STEPS`` steps' buckets in equal shares before
    they are reduced (its pending), so the new algorithm averages them with the gradient and
    its own error feedback keeps what it does not send. Nothing is exchanged for the switch.
    With momentum correction (DGC's
    velocity would count a handed-over residual again at every step it stays unsent) they
    are flushed densely instead: averaged in one all-reduce, added after the reduction."""
    from thinwire.sync import flush_indexed

    old = context.state
    new = SyncState(None, algorithm, **settings, **auto.settings)  # checked by fits: no raise
    dense_flush = bool(new.feedback.momentum)  # the user's setting: alike on every rank
    owed, mass = flush_indexed(context.params, old, average=dense_flush)
    if owed is not None and owed[0].is_cuda:
        # the worker adds them on its side stream, which waits only for backward's stream:
        # they were made on the caller's current stream, which may be another
        torch.cuda.current_stream(owed[0].device).synchronize()
    new.attach(old.topology)
    new.steps = old.steps
    new.auto = dict(record, probe=probe,
                    handed_over=dict(mass, how="flushed densely" if dense_flush
                                     else f"handed over in {plan_choice.HANDOVER_STEPS} "
                                          f"steps"))
    # handed over: in equal shares over the coming steps; flushed densely: at the next one
    context.switch_to(new, owed, 1 if dense_flush else plan_choice.HANDOVER_STEPS)
    auto.switches += 1
