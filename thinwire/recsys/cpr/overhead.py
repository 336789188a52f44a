"""CPR's overhead model, the PLS target, the checkpoint interval and the full-or-partial choice.

Times in seconds (any unit works if all agree). With T_tot the failure-free training time,
T_fail the MTBF, T_save the checkpoint interval, N_emb the embedding shards, t_save / t_load the
time to save / load every shard, t_res the time to reschedule a failed node:

* full recovery:    ``(T_tot/T_save) t_save + (T_tot/T_fail) (t_load + t_res + T_save/2)``,
  smallest at ``T_save = sqrt(2 t_save T_fail)``;
* partial recovery: ``(T_tot/T_save) t_save + (T_tot/T_fail) (t_load/N_emb + t_res)``;
* PLS (portion of lost samples) of partial recovery: ``T_save / (2 N_emb T_fail)``, so a PLS
  target gives ``T_save = 2 N_emb T_fail PLS``.

Functions here return overheads as fractions of T_tot (T_tot cancels).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

MODES = ("full", "partial", "mfu", "ssu")


def check_positive(name: str, value: float, allow_zero: bool = False) -> float:
    ok = isinstance(value, (int, float)) and math.isfinite(value) and \
        (value >= 0 if allow_zero else value > 0)
    if not ok:
        allowed = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"{name} must be a finite number {allowed}, got {value!r}")
    return float(value)


def check_pls_target(value: float) -> float:
    if not (isinstance(value, (int, float)) and 0 < value < 1):
        raise ValueError(f"pls_target must be in the open interval (0, 1), got {value!r}")
    return float(value)


def check_mode(mode: str) -> str:
    if mode not in MODES:
        raise ValueError(f"mode must be one of {list(MODES)}, got {mode!r}")
    return mode


def check_n_emb(n_emb: int) -> int:
    if not isinstance(n_emb, int) or n_emb < 1:
        raise ValueError(f"n_emb must be an int >= 1, got {n_emb!r}")
    return n_emb


def full_overhead(t_save: float, t_load: float, t_res: float, mtbf: float,
                  interval: float) -> float:
    for name, value in (("t_save", t_save), ("t_load", t_load), ("t_res", t_res)):
        check_positive(name, value, allow_zero=True)
    mtbf, interval = check_positive("mtbf", mtbf), check_positive("interval", interval)
    return t_save / interval + (t_load + t_res + interval / 2) / mtbf


def partial_overhead(t_save: float, t_load: float, t_res: float, mtbf: float, interval: float,
                     n_emb: int) -> float:
    for name, value in (("t_save", t_save), ("t_load", t_load), ("t_res", t_res)):
        check_positive(name, value, allow_zero=True)
    mtbf, interval = check_positive("mtbf", mtbf), check_positive("interval", interval)
    return t_save / interval + (t_load / check_n_emb(n_emb) + t_res) / mtbf


def best_full_interval(t_save: float, mtbf: float) -> float:
    return math.sqrt(2 * check_positive("t_save", t_save) * check_positive("mtbf", mtbf))


def pls(interval: float, n_emb: int, mtbf: float) -> float:
    return check_positive("interval", interval) / (2 * check_n_emb(n_emb) *
                                                   check_positive("mtbf", mtbf))


def interval_for_pls(pls_target: float, n_emb: int, mtbf: float) -> float:
    return 2 * check_n_emb(n_emb) * check_positive("mtbf", mtbf) * check_pls_target(pls_target)


@dataclass
class Plan:
    mode: str                # "full" or "partial": whichever has the smaller predicted overhead
    interval: float          # T_save of the chosen mode
    full_interval: float
    full_overhead: float
    partial_interval: float
    partial_overhead: float
    pls: float               # PLS of the chosen mode (0 for full recovery)


def plan(t_save: float, t_load: float, t_res: float, mtbf: float, n_emb: int,
         pls_target: float) -> Plan:
    """Full recovery at its best interval against partial recovery at the PLS-target interval;
    partial recovery is chosen only where its predicted overhead is smaller."""
    check_pls_target(pls_target)
    t_full = best_full_interval(t_save, mtbf)
    o_full = full_overhead(t_save, t_load, t_res, mtbf, t_full)
    t_part = interval_for_pls(pls_target, n_emb, mtbf)
    o_part = partial_overhead(t_save, t_load, t_res, mtbf, t_part, n_emb)
    if o_part < o_full:
        return Plan("partial", t_part, t_full, o_full, t_part, o_part, pls(t_part, n_emb, mtbf))
    return Plan("full", t_full, t_full, o_full, t_part, o_part, 0.0)
