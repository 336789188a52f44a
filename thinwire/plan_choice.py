"""``thinwire.ddp.register(ddp_model, "auto", plan=...)``: the hook's settings chosen from a plan.

A plan is what ``thinwire plan --json PLAN`` writes: for a cluster shape and a few link rates,
every candidate (algorithm x density x wire ...) ranked by predicted time to target. At
registration the node leaders probe the link (:mod:`thinwire.link_probe`, probed again where
the host, not the link, set the probe's pace); the goodput becomes a nominal rate (over the
plan's ``inter_efficiency``, the goodput/nominal ratio its calibration fitted); each
candidate's time to target is interpolated there (linear in log rate and log time between the
plan's two nearest rates, the end's value outside them); the fastest candidate a thinwire hook
can run is registered. PyTorch's DDP (``ddp``, ``ddp-fp16``) maps to thinwire's ``allreduce``
(fp32 or fp16 on the wire: the same bytes); PowerSGD and DiLoCo are not DDP hooks of thinwire's
and are skipped, but named where they ranked ahead (register PyTorch's PowerSGD hook, or use
``thinwire.local_sgd``, to run them).

The plan is data: JSON, checked field by field on every rank before the probe (the ranks then
agree that every check passed: :func:`agree`). Every rank chooses from the broadcast probe and
its own plan, and the ranks check that they chose alike.
"""

from __future__ import annotations

import json
import math
import statistics
import zlib
from pathlib import Path

import torch
import torch.distributed as dist

from thinwire import collectives, link_probe, node_probe

# the hook's settings a plan's candidate sets (auto chooses them: not the caller's to pass)
CHOSEN_SETTINGS = ("density", "selector", "sparse_wire", "wire")
# PyTorch DDP's own all-reduce, as thinwire's hook runs it
DDP_AS = {"ddp": ("allreduce", {}), "ddp-fp16": ("allreduce", {"wire": "fp16"})}


def _finite(value, where: str, positive: bool = True) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(
            value) or (positive and value <= 0):
        raise ValueError(f"plan: {where} must be a finite number > 0, got {value!r}")
    return float(value)


def load(plan) -> dict:
    """``plan`` (a path to ``thinwire plan --json``'s file, or its dict), checked."""
    if isinstance(plan, (str, Path)):
        from thinwire.output import read_json  # size-capped and depth-checked: a clear error

        try:
            plan = read_json(plan, "plan")
        except (OSError, ValueError) as exc:  # its message names the file
            raise ValueError(f"{exc}: not a readable JSON plan; write one with thinwire plan "
                             "--json PATH") from None
    if not isinstance(plan, dict):
        raise ValueError(f"plan must be a path or a dict (thinwire plan --json), got "
                         f"{type(plan).__name__}")
    for key in ("nodes", "ranks_per_node"):
        if isinstance(plan.get(key), bool) or not isinstance(plan.get(key), int) or \
                plan[key] < 1:
            raise ValueError(f"plan: {key} must be an integer >= 1, got {plan.get(key)!r}")
    plans = plan.get("plans")
    if not isinstance(plans, list) or not plans:
        raise ValueError("plan: 'plans' must be a non-empty list (one per link rate)")
    meanings = {}  # candidate -> (algorithm, settings)
    for i, at in enumerate(plans):
        _finite(at.get("inter_node_bps") if isinstance(at, dict) else None,
                f"plans[{i}].inter_node_bps")
        if not isinstance(at.get("rows"), list):
            raise ValueError(f"plan: plans[{i}].rows must be a list, got "
                             f"{type(at.get('rows')).__name__}")
        for j, row in enumerate(at["rows"]):
            where = f"plans[{i}].rows[{j}]"
            if not isinstance(row, dict) or not isinstance(row.get("candidate"), str) or \
                    not isinstance(row.get("algorithm"), str) or \
                    not isinstance(row.get("settings"), dict):
                raise ValueError(f"plan: {where} needs candidate, algorithm (strings) and "
                                 f"settings (a dict), got {row!r}"[:300])
            for field in ("time_to_target_s", "step_s"):
                if row.get(field) is not None:
                    _finite(row[field], f"{where}.{field}")
            # a candidate is one configuration at every rate: its times are interpolated
            # across the rates, and the hook registered for it is one row's
            meaning = (row["algorithm"], row["settings"])
            if meanings.setdefault(row["candidate"], meaning) != meaning:
                raise ValueError(f"plan: candidate {row['candidate']!r} is "
                                 f"{meanings[row['candidate']]} at one rate and {meaning} at "
                                 f"{where}; a candidate must name one algorithm and settings")
    if plan.get("inter_efficiency") is not None:
        _finite(plan["inter_efficiency"], "inter_efficiency")
    return plan


def check(plan: dict, world_size: int, ranks_per_node: int, given: dict) -> None:
    """The plan fits this run (its cluster shape), and the caller set nothing auto chooses."""
    nodes = world_size // ranks_per_node
    if (plan["nodes"], plan["ranks_per_node"]) != (nodes, ranks_per_node):
        raise ValueError(f"plan: made for {plan['nodes']} x {plan['ranks_per_node']} (nodes x "
                         f"ranks per node), this run is {nodes} x {ranks_per_node}; plan for "
                         "this cluster (thinwire plan --nodes --ranks-per-node)")
    if nodes < 2:
        raise ValueError("algorithm='auto' needs at least 2 nodes (one node has no inter-node "
                         "link to choose for)")
    clash = sorted(set(given) & set(CHOSEN_SETTINGS))
    if clash:
        raise ValueError(f"algorithm='auto' chooses {', '.join(CHOSEN_SETTINGS)}; got {clash} "
                         "too: leave them to the plan, or name the algorithm yourself")


def hook_settings(row: dict) -> tuple[str, dict] | str:
    """(thinwire algorithm, its settings) for a plan row; else why no thinwire hook runs it as
    ranked (its algorithm is not a hook, or it was measured with a setting the hook would not
    reproduce: registering without it would run another configuration than the ranked one)."""
    if row["algorithm"] not in DDP_AS and row["algorithm"] not in collectives.names():
        return f"{row['algorithm']} is not a thinwire hook"
    other = sorted(k for k in row["settings"] if k not in CHOSEN_SETTINGS)
    if other:
        return f"measured with {other}, which plan= does not carry to the hook"
    if row["algorithm"] in DDP_AS:
        algorithm, settings = DDP_AS[row["algorithm"]]
        return algorithm, dict(settings, **row["settings"])
    return row["algorithm"], dict(row["settings"])


def candidate_hook(plan: dict, name: str) -> tuple[str, dict]:
    """(thinwire algorithm, its settings) of the plan's candidate ``name``: the hook a fixed
    choice registers. A name the plan does not hold, or one no hook runs, is refused."""
    rows = {row["candidate"]: row for at in plan["plans"] for row in at["rows"]}
    if name not in rows:
        raise ValueError(f"{name!r} is not a candidate of the plan: {sorted(rows)}")
    mapped = hook_settings(rows[name])
    if isinstance(mapped, str):
        raise ValueError(f"{name!r} is not a thinwire hook ({mapped})")
    return mapped


def predicted(plan: dict, bps: float,
              field: str = "time_to_target_s") -> dict[str, float | None]:
    """Each candidate's ``field`` at ``bps`` (its time to target, or ``"step_s"``: a step's
    time), interpolated between the plan's rates."""
    rates = sorted(plan["plans"], key=lambda p: p["inter_node_bps"])
    times: dict[str, list] = {}
    for at in rates:
        for row in at["rows"]:
            times.setdefault(row["candidate"], []).append(
                (at["inter_node_bps"], row.get(field)))
    out = {}
    for name, points in times.items():
        below = [p for p in points if p[0] <= bps]
        above = [p for p in points if p[0] >= bps]
        lo = below[-1] if below else above[0]
        hi = above[0] if above else below[-1]
        if lo[1] is None or hi[1] is None:
            out[name] = None  # it missed the target at a neighbouring rate
        elif lo[0] == hi[0]:
            out[name] = lo[1]
        else:
            share = math.log(bps / lo[0]) / math.log(hi[0] / lo[0])
            out[name] = math.exp(math.log(lo[1]) + share * math.log(hi[1] / lo[1]))
    return out


def nominal_bps(plan: dict, goodput_Bps: float) -> float:
    """The plan's link rate for a probed goodput (over the calibration's inter_efficiency)."""
    return goodput_Bps * 8 / (plan.get("inter_efficiency") or 1.0)


# a pace a pilot measured stands for its candidate at rates within this factor of the one it
# was measured at (about replan's default share, 0.3: a link that moved less is not re-planned)
MEASURED_WITHIN = 1.3


def measured_near(measured: dict | None, bps: float) -> dict[str, float]:
    """From ``measured`` (candidate -> [(nominal bps, seconds a step)], what pilots measured on
    this run), each candidate's pace measured nearest to ``bps``, within MEASURED_WITHIN."""
    out = {}
    for name, points in (measured or {}).items():
        near = [(abs(math.log(at / bps)), pace) for at, pace in points
                if abs(math.log(at / bps)) <= math.log(MEASURED_WITHIN)]
        if near:
            out[name] = min(near)[1]
    return out


def expected_times(plan: dict, bps: float, measured: dict | None = None) -> dict:
    """Each candidate's time to target at ``bps``: for one a pilot measured near this rate,
    the plan's steps to target at its measured pace (the plan's time x measured / predicted
    seconds a step); for the others, the plan's time x the script's factor there (the
    geometric mean of measured / predicted seconds a step over the measured ones: a script
    slower or faster than the plan's model is so for every candidate, and an unmeasured one
    left at the plan's time would be favoured or penalised against the measured)."""
    times = predicted(plan, bps)
    steps = predicted(plan, bps, "step_s")
    paces = {name: pace for name, pace in measured_near(measured, bps).items()
             if times.get(name) and steps.get(name)}
    if not paces:
        return times
    factor = math.exp(statistics.fmean(math.log(max(pace, 1e-9) / steps[name])
                                       for name, pace in paces.items()))
    return {name: None if t is None else
            t * (paces[name] / steps[name] if name in paces else factor)
            for name, t in times.items()}


def ranked_hooks(plan: dict, goodput_Bps: float, fits=None,
                 measured: dict | None = None) -> tuple[list, list, list]:
    """At the probed goodput: (the candidates a thinwire hook runs with the caller's settings,
    fastest first, each ``(time to target, name, algorithm, settings)``; those ranked that no
    hook runs; those the caller's settings do not suit), the last two as choose records them.
    ``measured``: paces pilots measured on this run (:func:`expected_times`)."""
    times = expected_times(plan, nominal_bps(plan, goodput_Bps), measured)
    rows = {row["candidate"]: row for at in plan["plans"] for row in at["rows"]}
    runnable, skipped, unsuited = [], [], []
    for t, name in sorted((t, name) for name, t in times.items() if t is not None):
        mapped = hook_settings(rows[name])
        if isinstance(mapped, str):
            skipped.append({"candidate": name, "time_to_target_s": t, "why": mapped})
            continue
        why = fits(*mapped) if fits is not None else None
        if why is not None:
            unsuited.append({"candidate": name, "time_to_target_s": t, "why": why})
            continue
        runnable.append((t, name, *mapped))
    return runnable, skipped, unsuited


def choose(plan: dict, goodput_Bps: float, fits=None, among: set | None = None,
           measured: dict | None = None) -> tuple[str, dict, dict]:
    """(algorithm, settings, the record) for the probed goodput. ``fits(algorithm,
    settings)``: None where the caller's own settings suit that candidate, else why not (a
    candidate they do not suit is passed over and named). ``among``: only these candidates'
    names (a pilot's switch to the one it measured). ``measured``: paces pilots measured on
    this run, which stand for the plan's step times near their rates."""
    bps = nominal_bps(plan, goodput_Bps)
    runnable, skipped, unsuited = ranked_hooks(plan, goodput_Bps, fits, measured)
    ranked = sorted([(t, name) for t, name, *_ in runnable] +
                    [(r["time_to_target_s"], r["candidate"]) for r in skipped + unsuited])
    for t, name, algorithm, settings in runnable:
        if among is not None and name not in among:
            continue
        rates = sorted(p["inter_node_bps"] for p in plan["plans"])
        return algorithm, settings, {
            "choice": name, "algorithm": algorithm, "settings": settings,
            "planned_at_bps": bps, "predicted_time_to_target_s": t,
            "inside_plan_rates": rates[0] <= bps <= rates[-1],
            "measured_here": sorted(measured_near(measured, bps)),
            "ahead_but_not_a_thinwire_hook": [s for s in skipped if s["time_to_target_s"] <= t],
            "ahead_but_not_for_your_settings": [u for u in unsuited
                                                if u["time_to_target_s"] <= t],
            "runners_up": [{"candidate": n, "time_to_target_s": s}
                           for s, n in ranked if n != name][:3]}
    raise ValueError(f"plan: no candidate a thinwire hook runs with these settings reaches the "
                     f"target at {bps / 1e6:.0f} Mbit/s (ranked: "
                     f"{[n for _, n in ranked] or 'none'}; not for these settings: "
                     f"{[u['why'] for u in unsuited][:2] or 'none'})")


# The pilot (thinwire.ddp.replan(every_s=..., pilot=N)): the plan's step times come from the
# workload it was calibrated on, and a user's script of the same size steps otherwise (on
# compare's MNIST CNN ddp-fp16 stepped 0.14 s and hitopk 0.19 s at 1 Gbit/s; on an MLP of the
# same size hitopk was the faster). Candidates the plan puts within this factor of its choice
# are measured on the script itself: the cost model's out-of-sample target is 20% a candidate,
# so two candidates 1.5x apart in prediction can be either way round in fact.
PILOT_WITHIN = 1.5
# the pilot switches back to an earlier candidate only where it promises this much more than
# the one running (a pace is the median of a few steps: noise must not make it switch back)
PILOT_MARGIN = 0.05


def pilot_candidates(plan: dict, goodput_Bps: float, current: str, fits=None,
                     within: float = PILOT_WITHIN, measured: dict | None = None) -> list[str]:
    """The candidates, fastest first, that a pilot measures after ``current``: a hook runs
    them with the caller's settings, their time to target (:func:`expected_times`) is within
    ``within`` times ``current``'s, the plan has their step time (to scale by the measured
    one), and no pilot of this run measured them near this rate already."""
    runnable, _, _ = ranked_hooks(plan, goodput_Bps, fits, measured)
    times = {name: t for t, name, *_ in runnable}
    if current not in times:
        return []
    bps = nominal_bps(plan, goodput_Bps)
    steps, known = predicted(plan, bps, "step_s"), measured_near(measured, bps)
    return [name for t, name, *_ in runnable if name != current and name not in known and
            t <= within * times[current] and steps.get(name) and steps.get(current)]


def measured_scores(plan: dict, goodput_Bps: float, measured: dict) -> dict[str, float]:
    """The time to target of each candidate measured near the probed rate, at its measured
    pace: the plan's steps to target x the seconds a step measured (:func:`expected_times`)."""
    bps = nominal_bps(plan, goodput_Bps)
    times, steps = expected_times(plan, bps, measured), predicted(plan, bps, "step_s")
    return {name: times[name] for name in measured_near(measured, bps)
            if times.get(name) is not None and steps.get(name)}


# A switch costs a re-check and the new method's first steps (on a new DDP wrapper in thinwire
# train): it must promise at least this much (the new choice's predicted time to target against the current
# one's, both at the new rate). Without it, on MNIST at 1 Gbit/s a run switched back from hitopk
# to ddp-fp16 for a predicted 3%.
SWITCH_MIN_GAIN = 0.1
# a re-check's two all-reduce sizes (bytes), timed once each: about half a second at 25 Mbit/s
RECHECK_BYTES = (256 << 10, 1 << 20)
# A switch delivers what the old algorithm held back in equal shares over this many steps, not
# all at the next one (thinwire train's switch and thinwire.ddp's alike). Handed to one step,
# hitopk's residual after 12-18 steps (its unsent 95%: l1 3,500-6,400 on compare's MNIST
# model) is a stale lump early in training that momentum carries on: at seed 4, switched at
# step 16, 50 steps to target against 42 spread over 16 (40 with the residual dropped). Over
# the changing-link races of seeds 3-12 (docs/results.md) the spread took a median 2 steps
# fewer (fewer at 5 of 9 seeds, more at 3, by 2-4) and 0.98x the time: a small gain on
# average, not at every seed.
HANDOVER_STEPS = 16


def decide_switch(plan: dict, current: str, basis_Bps: float, probe: dict, share: float,
                  min_gain: float = SWITCH_MIN_GAIN, fits=None,
                  measured: dict | None = None) -> tuple[dict, tuple | None]:
    """A re-check of the link, decided: (the event, ``(algorithm, settings, record)`` of the
    choice to switch to, or None to keep ``current``). ``basis_Bps``: the goodput the current
    choice was made at; ``probe``: the new probe (:func:`thinwire.link_probe.probe_inter_node`'s
    dict). Keeps the current choice where the probe measured the host, not the link (no
    evidence), where the goodput moved by no more than ``share``, where the plan's best at the
    new rate is the current one, and where the best promises less than ``min_gain`` over the
    current at that rate. ``measured``: paces this run's pilots measured (candidate -> [(nominal
    bps, seconds a step)]); near their rates they stand for the plan's step times."""
    goodput = probe["goodput_Bps"]
    event = {"goodput_Bps": goodput, "change": goodput / basis_Bps - 1}
    if not probe.get("trusted", True):
        return dict(event, kept=current, bound_by=probe.get("bound_by"),
                    reason=f"probe not trusted: {probe.get('why')}"), None
    if abs(event["change"]) <= share:
        return dict(event, kept=current), None
    algorithm, settings, record = choose(plan, goodput, fits, measured=measured)
    event["planned_at_bps"] = record["planned_at_bps"]
    if record["measured_here"]:
        event["measured_here"] = record["measured_here"]
    if record["choice"] == current:
        return dict(event, kept=current), None
    now = expected_times(plan, record["planned_at_bps"], measured).get(current)
    if now is None:  # no gain to weigh: the current choice misses the target at the new rate
        event["reason"] = f"{current} has no time to target at the new rate"
    else:
        event["predicted_gain"] = now / record["predicted_time_to_target_s"] - 1
        if event["predicted_gain"] < min_gain:
            return dict(event, kept=current, best=record["choice"]), None
    return dict(event, switched_from=current, switched_to=record["choice"]), \
        (algorithm, settings, record)


CHOSE_DIFFERENTLY = "the ranks chose differently from their plans"


def agree(error: Exception | None, device, what: str, digest: int = 0, group=None,
          differ: str = CHOSE_DIFFERENTLY) -> None:
    """Every rank ends alike (collective on ``group``, None: the default group, whose
    timeout bounds the wait): where any rank's ``error`` is set, that rank raises it and every
    other rank a ValueError saying another rank failed at ``what``; where the ranks'
    ``digest`` differ, every rank raises a ValueError saying ``differ``."""
    flags = torch.tensor([int(error is not None), digest, -digest], dtype=torch.int64,
                         device=device)
    dist.all_reduce(flags, op=dist.ReduceOp.MAX, group=group)
    if error is not None:
        raise error
    if flags[0].item():
        raise ValueError(f"algorithm='auto': another rank failed at {what} (its own error "
                         "names why)")
    if flags[1].item() != -flags[2].item():
        raise ValueError(f"algorithm='auto': {differ} (is plan= the same file on every "
                         "rank?)")


def deciding(plan: dict) -> dict:
    """What of a checked plan the choices depend on (not where its inputs were read from: a
    plan made on each node from the same races at other paths decides alike)."""
    return {key: plan.get(key) for key in ("nodes", "ranks_per_node", "inter_efficiency")} | {
        "plans": [{"inter_node_bps": at["inter_node_bps"],
                   "rows": [{key: row.get(key) for key in ("candidate", "algorithm", "settings",
                                                            "time_to_target_s", "step_s")}
                            for row in at["rows"]]} for at in plan["plans"]]}


def digest_of(value) -> int:
    """A checksum of ``value``'s JSON (keys sorted): alike on ranks that hold equal values."""
    return zlib.crc32(json.dumps(value, sort_keys=True, default=str).encode())


def resolve(plan: dict, ranks_per_node: int, timeout_s: float, fits=None,
            device=None, group=None) -> tuple[str, dict, dict]:
    """Probe (collective), choose, check every rank chose alike: (algorithm, settings,
    record). ``plan``: :func:`load`'s, already :func:`check`-ed on every rank. ``group``: a
    group of every rank whose timeout bounds the waits (None: the default group)."""
    device = device or link_probe.probe_device()
    probe = link_probe.probe_trusted(
        ranks_per_node, timeout_s,
        probe=lambda *args: link_probe.probe_inter_node(*args, device=device,
                                                        world_group=group))
    error, digest = None, 0
    try:
        algorithm, settings, record = choose(plan, probe["goodput_Bps"], fits)
        digest = digest_of([algorithm, settings])
    except ValueError as exc:
        error = exc
    agree(error, device, "choosing from its plan", digest, group)
    # inside the nodes too (NVLink or PCIe on GPUs): recorded, not planned from
    probe["intra_node"] = node_probe.probe_intra_node(ranks_per_node, timeout_s, device=device,
                                                      world_group=group)
    record["probe"] = probe
    return algorithm, settings, record
