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

The plan is data: JSON, checked field by field before any collective call. Every rank
chooses from the broadcast probe and its own plan, and the ranks check that they chose alike.
"""

from __future__ import annotations

import json
import math
import zlib
from pathlib import Path

import torch
import torch.distributed as dist

from thinwire import collectives, link_probe

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
        try:
            plan = json.loads(Path(plan).read_text())
        except (OSError, ValueError) as exc:
            raise ValueError(f"plan: {plan} is not a readable JSON plan ({exc}); write one "
                             "with thinwire plan --json PATH") from None
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
    for i, at in enumerate(plans):
        _finite(at.get("inter_node_bps") if isinstance(at, dict) else None,
                f"plans[{i}].inter_node_bps")
        if not isinstance(at.get("rows"), list):
            raise ValueError(f"plan: plans[{i}].rows must be a list")
        for j, row in enumerate(at["rows"]):
            where = f"plans[{i}].rows[{j}]"
            if not isinstance(row, dict) or not isinstance(row.get("candidate"), str) or \
                    not isinstance(row.get("algorithm"), str) or \
                    not isinstance(row.get("settings"), dict):
                raise ValueError(f"plan: {where} needs candidate, algorithm (strings) and "
                                 "settings (a dict)")
            if row.get("time_to_target_s") is not None:
                _finite(row["time_to_target_s"], f"{where}.time_to_target_s")
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


def hook_settings(row: dict) -> tuple[str, dict] | None:
    """(thinwire algorithm, its settings) for a plan row, None where no thinwire hook runs it."""
    if row["algorithm"] in DDP_AS:
        return DDP_AS[row["algorithm"]]
    if row["algorithm"] not in collectives.names():
        return None
    return row["algorithm"], {k: v for k, v in row["settings"].items() if k in CHOSEN_SETTINGS}


def predicted(plan: dict, bps: float) -> dict[str, float | None]:
    """Each candidate's time to target at ``bps`` (interpolated between the plan's rates)."""
    rates = sorted(plan["plans"], key=lambda p: p["inter_node_bps"])
    times: dict[str, list] = {}
    for at in rates:
        for row in at["rows"]:
            times.setdefault(row["candidate"], []).append(
                (at["inter_node_bps"], row.get("time_to_target_s")))
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


def choose(plan: dict, goodput_Bps: float) -> tuple[str, dict, dict]:
    """(algorithm, settings, the record) for the probed goodput."""
    efficiency = plan.get("inter_efficiency") or 1.0
    bps = goodput_Bps * 8 / efficiency
    times = predicted(plan, bps)
    rows = {row["candidate"]: row for at in plan["plans"] for row in at["rows"]}
    ranked = sorted((t, name) for name, t in times.items() if t is not None)
    skipped = []
    for t, name in ranked:
        mapped = hook_settings(rows[name])
        if mapped is None:
            skipped.append({"candidate": name, "time_to_target_s": t})
            continue
        algorithm, settings = mapped
        rates = sorted(p["inter_node_bps"] for p in plan["plans"])
        return algorithm, settings, {
            "choice": name, "algorithm": algorithm, "settings": settings,
            "planned_at_bps": bps, "predicted_time_to_target_s": t,
            "inside_plan_rates": rates[0] <= bps <= rates[-1],
            "ahead_but_not_a_thinwire_hook": skipped,
            "runners_up": [{"candidate": n, "time_to_target_s": s}
                           for s, n in ranked if n != name][:3]}
    raise ValueError(f"plan: no candidate a thinwire hook runs reaches the target at "
                     f"{bps / 1e6:.0f} Mbit/s (ranked: {[n for _, n in ranked] or 'none'})")


def _agree(record: dict) -> None:
    """Every rank chose the same (their plans may differ): else every rank fails alike."""
    digest = zlib.crc32(json.dumps([record["algorithm"], record["settings"]],
                                   sort_keys=True).encode())
    both = torch.tensor([digest, -digest], dtype=torch.int64)
    dist.all_reduce(both, op=dist.ReduceOp.MAX)
    if both[0].item() != -both[1].item():
        raise ValueError("algorithm='auto': the ranks chose differently from their plans (is "
                         "plan= the same file on every rank?)")


def resolve(plan, world_size: int, ranks_per_node: int, timeout_s: float,
            given: dict) -> tuple[str, dict, dict]:
    """Probe (collective), choose, check agreement: (algorithm, settings, record)."""
    plan = load(plan)
    check(plan, world_size, ranks_per_node, given)
    probe = link_probe.probe_trusted(ranks_per_node, timeout_s)
    algorithm, settings, record = choose(plan, probe["goodput_Bps"])
    _agree(record)
    record["probe"] = probe
    return algorithm, settings, record
