"""`thinwire plan`'s ranking: every candidate's predicted time to target on a described cluster.

    time to target = steps to target (measured once per workload: thinwire.sim.steps)
                     x step time (the calibrated cost model at the cluster's link rate)

Candidates are the registry's (every per-step algorithm, PowerSGD at several ranks, the dense
all-reduces at each wire precision, the sparse ones at several densities, DiLoCo at several H)
plus every configuration the steps files measured. A candidate no race measured but which lies
between two measured values of its density, PowerSGD rank or DiLoCo H (the other settings
equal) is ranked with steps read between theirs (:mod:`thinwire.sim.steps_estimate`; its row's
``steps_source`` says so). Any other unmeasured candidate gets a step time and no time to
target: it is listed, never ranked on a guess, and its row (``--json``) carries the
command that would race it (``command.compare``).

The break-even rate is where the fastest compressed candidate (sparse, low-rank, DiLoCo) and the
fastest dense one (every gradient entry every step: DDP, the all-reduces at any wire precision)
reach the target at the same time: below it compression pays for this model.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from dataclasses import dataclass

from thinwire import collectives
from thinwire.sim import powersgd
from thinwire.sim.calibrate import (ALGORITHM_ALIASES, WIRE_BOUND_SHARE, Run, fit, mode_name,
                                    overlap_modes, predict, predict_diloco, rate_bps, read_runs,
                                    refit_step_extras, reindexed, scales_json,
                                    wire_bound_algorithms)
from thinwire.sim.diloco_fit import fit_extra, read_diloco_runs
from thinwire.sim.diloco_fit import warnings as diloco_warnings
from thinwire.sim.steps import candidate_of, entries_for, merged_spread, read_table
from thinwire.sim.probed_links import intra_from_probe
from thinwire.sim.repeats import check_repeats, median_of_repeats
from thinwire.sim.steps_estimate import interpolated
from thinwire.train import modes, settings as train_settings
from thinwire.train import race_config

DENSITIES = (0.01, 0.02, 0.05, 0.1)
DENSE_WIRES = ("none", "fp16", "bf16")
POWERSGD_RANKS = (1, 2, 4, 8)
DILOCO_H = (8, 32, 128)
DENSE = ("ddp", "ddp-fp16", "allreduce", "hier_allreduce")  # every entry, every step
BREAK_EVEN_RANGE_BPS = (1e6, 1e11)  # 1 Mbit/s .. 100 Gbit/s
# settings a run of `thinwire train` is given on the command line (the others are compare's
# per-run bookkeeping: metrics, summaries, targets, progress)
COMMAND_CONCERNS = ("model", "sync", "optim", "diloco", "waves")


@dataclass(frozen=True)
class Setting:
    """The described cluster and what the plan is for."""
    workload: str
    nodes: int
    ranks_per_node: int
    inter_bps: float | None  # None: unshaped (the emulator's loopback)
    compute_s: float         # forward + backward + step, per step, without communication


def ranked_algorithms() -> tuple[str, ...]:
    """The algorithms the plan ranks candidates of (what ``--algorithms`` of `thinwire plan`
    and ``--plan-algorithms`` of auto may name)."""
    return ("ddp", "ddp-fp16", "powersgd", "allreduce", "hier_allreduce") + \
        tuple(collectives.sparse_names()) + ("diloco",)


def check_algorithms(names, flag: str) -> tuple[str, ...] | None:
    """``names`` (an iterable of algorithm names; empty or None: every one) checked against
    :func:`ranked_algorithms`, named by ``flag`` in the error; None where every one is meant."""
    names = tuple(names or ())
    allowed = ranked_algorithms()
    unknown = [n for n in names if n not in allowed]
    if unknown:
        raise ValueError(f"{flag}: {', '.join(map(repr, unknown))} is not an algorithm the "
                         f"plan ranks; allowed: {', '.join(allowed)}")
    return names or None


def grid(workload: str, nodes: int, ranks_per_node: int, measured=(),
         algorithms: tuple | None = None) -> dict:
    """{Candidate: TrainConfig} for the registry's candidates and the ``measured`` ones;
    ``algorithms``: only candidates of these (None: every one)."""
    def config(algorithm, **train):
        cfg = race_config.run_config(workload, algorithm, train,
                                     ranks_per_node=ranks_per_node).validate()
        return candidate_of(cfg), cfg

    wanted = [("ddp", {}), ("ddp-fp16", {})]
    wanted += [("powersgd", {"powersgd_rank": r}) for r in POWERSGD_RANKS]
    wanted += [(name, {"wire": w}) for name in ("allreduce", "hier_allreduce")
               for w in DENSE_WIRES]
    wanted += [(name, {"density": d}) for name in collectives.sparse_names() for d in DENSITIES]
    wanted += [("diloco", {"sync_every": h}) for h in DILOCO_H]
    found = {}
    for algorithm, train in wanted:
        cand, cfg = config(algorithm, **train)
        found.setdefault(cand, cfg)
    for cand in measured:
        if cand not in found:
            found[cand] = config(cand.algorithm, **cand.settings)[1]
    if algorithms is not None:
        found = {c: cfg for c, cfg in found.items() if c.algorithm in algorithms}
    return found


def run_for(cfg, setting: Setting, layers_key: str, layers: list, index: int) -> Run:
    """The calibration's Run for a candidate's config on the described cluster."""
    modelled, wire = ALGORITHM_ALIASES.get(cfg.algorithm, (cfg.algorithm, cfg.wire))
    shapes = None
    if modelled == "powersgd":
        shapes = tuple(powersgd.parameter_shapes(cfg.model) or ()) or None
    sparse_wire = cfg.sparse_wire if cfg.algorithm in collectives.sparse_wire_names() else "fp32"
    return Run("plan", cfg.algorithm, modelled, setting.nodes, setting.ranks_per_node,
               setting.inter_bps, layers_key, layers, float(cfg.density),
               None if wire in (None, "none") else wire, 1.0, setting_index=index,
               shapes=shapes, powersgd_rank=int(cfg.powersgd_rank), sparse_wire=sparse_wire)


def step_time(cfg, setting: Setting, params: dict, layers_key: str, layers: list,
              overlap) -> dict:
    """The cost model's step of ``cfg`` on the described cluster."""
    extended = dict(params, compute_s=list(params["compute_s"]) + [setting.compute_s],
                    reference_compute_s=min(params["compute_s"]))
    run = run_for(cfg, setting, layers_key, layers, len(params["compute_s"]))
    if not modes.mode_of(cfg.algorithm).per_step:  # DiLoCo: an outer step every H
        return predict_diloco(run, extended, cfg.sync_every, cfg.outer_algorithm)
    return predict(run, extended, overlap)


def dense_warmup(cfg) -> tuple[int, object | None]:
    """(steps, the dense config they run as) before ``cfg`` compresses: PowerSGD all-reduces
    its first --powersgd-start-iter steps as DDP does; a sparse algorithm its first
    --dense-warmup-steps with its own wire. At 50 Mbit/s PowerSGD's 2 dense MNIST steps took
    7.4 of its 16.7 s to target."""
    if cfg.algorithm == "powersgd" and cfg.powersgd_start_iter:
        return cfg.powersgd_start_iter, dataclasses.replace(cfg, algorithm="ddp")
    if cfg.algorithm in collectives.sparse_names() and cfg.dense_warmup_steps:
        return cfg.dense_warmup_steps, dataclasses.replace(cfg, algorithm="allreduce")
    return 0, None


def time_to_target(cfg, steps: float, setting: Setting, params: dict, layers_key: str,
                   layers: list, overlap) -> tuple[float, float]:
    """(predicted seconds to target, the compressed step's seconds)."""
    step = step_time(cfg, setting, params, layers_key, layers, overlap)["iteration_s"]
    warm, dense = dense_warmup(cfg)
    warm = min(warm, steps)
    dense_s = step_time(dense, setting, params, layers_key, layers, overlap)["iteration_s"] \
        if warm else 0.0
    return warm * dense_s + (steps - warm) * step, step


def rank(setting: Setting, params: dict, overlap, layers_key: str, layers: list,
         entries: dict, candidates: dict) -> list[dict]:
    """One row per candidate (``candidates``: :func:`grid`'s), those with steps (measured, or
    read between two measured ones: :mod:`thinwire.sim.steps_estimate`) first by predicted
    time to target."""
    measured = {cand: entry.estimate for cand, entry in entries.items()}
    rows = []
    for cand, cfg in candidates.items():
        row = step_time(cfg, setting, params, layers_key, layers, overlap)
        entry = entries.get(cand)
        steps = entry.estimate if entry is not None else None
        # a candidate no race ran (a race that missed the target is an answer: not guessed)
        guess = interpolated(cand, measured) if entry is None else None
        if guess is not None:
            steps = guess.steps
        ttt = None if steps is None else \
            time_to_target(cfg, steps, setting, params, layers_key, layers, overlap)[0]
        rows.append({
            "candidate": cand.label(), "algorithm": cand.algorithm,
            "settings": cand.settings,
            "kind": "dense" if cand.algorithm in DENSE else "compressed",
            "step_s": row["iteration_s"], "inter_node_mb_per_step": row["inter_node_mb_per_iter"],
            # the step held at the host's measured CPU a step (calibrate.cpu_floors), where
            # that is longer than its phases: the cores, not the link, set its pace
            "cpu_floor_s": row.get("cpu_floor_s"),
            "steps": steps, "steps_spread": entry.spread if entry is not None else None,
            "steps_source": "measured" if entry is not None else (
                None if guess is None else
                "between " + " and ".join(label for label, _ in guess.between)),
            "time_to_target_s": ttt, "dense_warmup_steps": dense_warmup(cfg)[0],
            "measured_missed_at": entry.missed if entry is not None and steps is None else None,
            "command": command(cfg, setting),
        })
    rows.sort(key=lambda r: (r["time_to_target_s"] is None,
                             r["time_to_target_s"] or r["step_s"]))
    best = rows[0]["time_to_target_s"] if rows else None
    for r in rows:
        r["vs_best"] = (r["time_to_target_s"] / best
                        if best and r["time_to_target_s"] is not None else None)
    return rows


def command(cfg, setting: Setting) -> dict:
    """How to run a candidate: on the emulated cluster (compare) and on a real one (torchrun,
    with the settings that differ from thinwire train's defaults)."""
    flags = _flags(cfg, COMMAND_CONCERNS, with_algorithm=True)
    rate = "none" if setting.inter_bps is None else rate_text(setting.inter_bps)
    # against compare's own defaults for the workload (its density is not train's): a value
    # equal to train's default but not to the workload's must be given, or compare races
    # another candidate than the one ranked
    raced = race_config.run_config(setting.workload, cfg.algorithm, {},
                                   ranks_per_node=setting.ranks_per_node)
    own = _flags(cfg, ("sync", "diloco"), with_algorithm=False,  # compare names it itself
                 defaults=raced)
    compare = (f"thinwire compare --workload {setting.workload} --algorithms {cfg.algorithm} "
               f"--nodes {setting.nodes} --ranks-per-node {setting.ranks_per_node} "
               f"--inter-node-bandwidth {rate} " + " ".join(own) + " --out results/plan")
    train = (f"torchrun --nnodes {setting.nodes} --nproc-per-node {setting.ranks_per_node} "
             f"--rdzv-backend c10d --rdzv-endpoint HOST:29500 -m thinwire.train "
             + " ".join(flags) + f" --ranks-per-node {setting.ranks_per_node}")
    return {"compare": " ".join(compare.split()), "train": " ".join(train.split())}


def _flags(cfg, concerns: tuple, with_algorithm: bool, defaults=None) -> list[str]:
    """The command-line flags of ``cfg``'s settings of ``concerns`` that differ from their
    defaults (``defaults``: a config whose values are the command's defaults; None: thinwire
    train's) and apply to its run (a bool as its bare flag)."""
    flags = []
    for s in train_settings.SETTINGS:
        value = getattr(cfg, s.name)
        if s.concern not in concerns or value is None or (s.applies and not s.applies(cfg)):
            continue
        if s.name == "algorithm" and not with_algorithm:
            continue
        default = s.default if defaults is None else getattr(defaults, s.name)
        if value == default and s.name != "algorithm":
            continue
        flags += [s.cli_flag] if s.type is bool else [s.cli_flag, str(value)]
    return flags


def rate_text(bps: float) -> str:
    """A rate as the emulator's options spell it (1e9 -> 1gbit, 2.5e8 -> 250mbit)."""
    return f"{bps / 1e9:g}gbit" if bps >= 1e9 and bps % 1e9 == 0 else f"{bps / 1e6:g}mbit"


def break_even(setting: Setting, params: dict, overlap, layers_key: str, layers: list,
               entries: dict, candidates: dict) -> dict:
    """The link rate below which the fastest compressed candidate with measured steps reaches
    the target before the fastest dense one (bisection on a log scale)."""
    configs = {c: cfg for c, cfg in candidates.items()
               if c in entries and entries[c].estimate is not None}
    dense = {c: cfg for c, cfg in configs.items() if c.algorithm in DENSE}
    compressed = {c: cfg for c, cfg in configs.items() if c not in dense}
    if not dense or not compressed:
        return {"bps": None, "note": "needs measured steps of a dense and a compressed "
                                     "candidate"}

    def best(group, bps):
        at = dataclasses.replace(setting, inter_bps=bps)
        return min(time_to_target(cfg, entries[c].estimate, at, params, layers_key, layers,
                                  overlap)[0] for c, cfg in group.items())

    def gap(bps):  # > 0: compression wins
        return math.log(best(dense, bps) / best(compressed, bps))

    lo, hi = (math.log(b) for b in BREAK_EVEN_RANGE_BPS)
    points = [lo + (hi - lo) * i / 24 for i in range(25)]
    signs = [gap(math.exp(p)) > 0 for p in points]
    # an unshaped ranking ('none': the nodes joined as the host's loopback joins them) is
    # not a rate on this scale: it may rank otherwise, and the note says so
    searched = "1 Mbit/s to 100 Gbit/s (shaped links; an unshaped ranking stands apart)"
    if all(signs):
        return {"bps": None, "note": f"compression is predicted faster at every rate from "
                                     f"{searched}"}
    if not any(signs):
        return {"bps": None, "note": f"a dense all-reduce is predicted faster at every rate "
                                     f"from {searched}"}
    i = next(i for i in range(len(signs) - 1) if signs[i] != signs[i + 1])
    a, b = points[i], points[i + 1]
    for _ in range(30):
        mid = (a + b) / 2
        if (gap(math.exp(mid)) > 0) == signs[i]:
            a = mid
        else:
            b = mid
    bps = math.exp((a + b) / 2)
    below = "compressed" if signs[i] else "dense"
    above = "dense" if below == "compressed" else "compressed"
    return {"bps": bps, "below": below, "note": f"below {bps / 1e6:.0f} Mbit/s the fastest "
                                                f"candidate is {below}, above it {above}"}


def calibrated(paths, calibrate_at: str | None, form: str, overlap: str = "hooks",
               repeats: str = "each") -> tuple:
    """(params, overlap mode, the calibration runs) fitted on ``paths`` (at one rate);
    ``repeats``: fit each run, or the "median" of each setting's repetitions (the per-step
    runs; DiLoCo's own cost is fitted on each of its runs)."""
    return fitted_on(paths, calibration_runs(paths, calibrate_at, repeats), calibrate_at,
                     form, overlap)


def calibration_runs(paths, calibrate_at: str | None, repeats: str = "each") -> list:
    """The runs of ``paths`` :func:`calibrated` fits (read, by their median where asked, at one
    rate): quick, so a plan checks its inputs against them before the fit."""
    check_repeats(repeats)
    runs, _ = read_runs(paths)
    if repeats == "median":
        runs = reindexed(median_of_repeats(runs))
    if calibrate_at is not None:
        try:
            rate = rate_bps(calibrate_at)
        except ValueError as exc:
            raise ValueError(f"--calibrate-at {calibrate_at!r}: {exc}") from None
        runs = [r for r in runs if r.inter_bps == rate]
        if not runs:
            raise ValueError(f"--calibrate-at {calibrate_at}: no calibration run at that rate")
        runs = reindexed(runs)
    return runs


def fitted_on(paths, runs: list, calibrate_at: str | None, form: str,
              overlap: str = "hooks") -> tuple:
    """:func:`calibrated`'s fit of :func:`calibration_runs`' ``runs`` (of ``paths``)."""
    fits = [(fit(runs, mode, form), mode) for mode in overlap_modes(overlap)]
    (params, _), mode = min(fits, key=lambda item: item[0][1])
    # DiLoCo's own cost, from the DiLoCo runs among them (after the shared fit, which it
    # leaves as it is): none there, and DiLoCo is predicted from the per-step fit alone
    diloco_runs, _ = read_diloco_runs(paths, calibrate_at)
    extra = fit_extra(diloco_runs, runs, params)
    if extra:
        params = dict(params, diloco_extra=extra)
    return params, mode, runs


def with_probed_intra(paths, fitted: tuple, intra: dict | None) -> tuple[tuple, dict]:
    """``fitted`` (:func:`calibrated`'s result on ``paths``) planning with the intra-node rate
    a probe measured (:mod:`thinwire.sim.probed_links`), and what was fitted against the fit's
    rate fitted again against it, the shared parameters held: each algorithm's fixed cost per
    step and DiLoCo's cost. (the fitted tuple, the record of the rate planned from)."""
    params, mode, runs = fitted
    probed, record = intra_from_probe(params, intra)
    if probed is params:  # the fit's rate stays, and all fitted against it
        return fitted, record
    probed = refit_step_extras(runs, probed, mode)
    probed.pop("diloco_extra", None)
    diloco_runs, _ = read_diloco_runs(paths, None)
    extra = fit_extra(diloco_runs, runs, probed)
    if extra:
        probed["diloco_extra"] = extra
    return (probed, mode, runs), record


def fitted_compute(params: dict, runs: list, nodes: int, ranks_per_node: int) -> float | None:
    """The calibration's compute per step on this cluster (the median over its rates)."""
    values = sorted(params["compute_s"][r.setting_index] for r in runs
                    if (r.nodes, r.ranks_per_node) == (nodes, ranks_per_node))
    return values[len(values) // 2] if values else None


def make_plan(calibration, steps_files, workload: str | None, nodes: int | None,
              ranks_per_node: int | None, rates: list, compute_ms: float | None = None,
              calibrate_at: str | None = None, form: str = "max", fitted=None,
              with_break_even: bool = True, compute_scale: float = 1.0,
              steps_to: float | None = None, algorithms=None, repeats: str = "each") -> dict:
    """``fitted``: :func:`calibrated`'s result, where the caller has it already;
    ``compute_scale``: the fitted compute per step times this (auto's compute probe: this
    cluster's compute-only step over the calibration runs');
    ``with_break_even``: False skips the break-even search (nine tenths of a plan's time: auto's
    re-planning needs only the ranking); ``steps_to``: steps read to this quality instead of
    the races' target (:func:`thinwire.sim.steps.read_table`); ``algorithms``: rank only
    candidates of these (:func:`check_algorithms`; None: every one); ``repeats``: as
    :func:`calibrated`'s."""
    # the inputs first: the fit takes up to a minute
    algorithms = check_algorithms(algorithms, "algorithms")
    table, notes = read_table(steps_files, steps_to)
    workloads_seen = sorted({w.workload for w in table})
    if workload is not None and workload not in workloads_seen:
        raise ValueError(f"--workload {workload!r}: the steps files hold only "
                         f"{workloads_seen or 'no usable runs'}; name one of them, or give "
                         f"--steps-from races of {workload!r}")
    workload = workload or (workloads_seen[0] if len(workloads_seen) == 1 else None)
    if workload is None:
        raise ValueError(f"--workload: the steps files hold {workloads_seen or 'no runs'}; "
                         f"name one")
    for name, value, least in (("nodes", nodes, 2), ("ranks_per_node", ranks_per_node, 1)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                  or value < least):
            raise ValueError(f"{name} must be an integer >= {least} (None: the "
                             f"calibration's), got {value!r}")
    # every check that needs only the runs comes before the fit (seconds to a minute)
    runs = fitted[2] if fitted else calibration_runs(calibration, calibrate_at, repeats)
    nodes = nodes or runs[0].nodes
    ranks_per_node = ranks_per_node or runs[0].ranks_per_node
    work, entries = entries_for(table, workload, nodes, ranks_per_node)
    if steps_to is not None:
        from thinwire.train import quality
        quality.check_target(work.metric, steps_to, "--steps-to")
    model = dict(work.training)["model"]
    layers = next((r for r in runs if r.layers_key == model), None)
    if layers is None:
        raise ValueError(f"the calibration runs hold no run of model {model!r} (the steps "
                         f"files' {workload}); calibrate on a race of that workload")
    params, mode, runs = fitted or fitted_on(calibration, runs, calibrate_at, form)
    if compute_ms is not None:
        compute_s = compute_ms / 1e3
    else:
        compute_s = fitted_compute(params, [r for r in runs if r.layers_key == model], nodes,
                                   ranks_per_node)
        if compute_s is None:
            raise ValueError(f"--compute-ms: the calibration has no run on {nodes} x "
                             f"{ranks_per_node}; give the compute time per step measured there")
        compute_s *= compute_scale
    candidates = grid(workload, nodes, ranks_per_node, entries,  # the same at every rate
                      algorithms)
    plans = []
    for rate in rates:
        setting = Setting(workload, nodes, ranks_per_node, rate_bps(rate), compute_s)
        rows = rank(setting, params, mode, model, layers.layers, entries, candidates)
        plans.append({"rate": rate, "inter_node_bps": setting.inter_bps, "rows": rows,
                      "best": next((r for r in rows if r["time_to_target_s"] is not None),
                                   None)})
    setting = Setting(workload, nodes, ranks_per_node, None, compute_s)
    return {
        "workload": work.describe(), "training": dict(work.training),
        "nodes": nodes, "ranks_per_node": ranks_per_node, "compute_s": compute_s,
        "phase_form": form, "overlap": mode_name(mode), "calibrate_at": calibrate_at,
        "repeats": repeats,
        # the probe's goodput over this is the nominal rate (thinwire.plan_choice reads it)
        "inter_efficiency": params.get("inter_efficiency"),
        # the host's seconds per inter-node byte beside the wire's (~0 where every calibration
        # run's pace was its link's: then it is held at its floor, not fitted)
        "inter_host_s_per_byte": params.get("inter_host_s_per_byte", 0.0),
        # each measured setting's CPU floor, x its compute (calibrate.cpu_floors; none where
        # the calibration runs did not record their CPU)
        "cpu_floor": scales_json(params.get("cpu_floor", {}), "floor_x_compute"),
        # DiLoCo's fitted cost beyond its phases (None: the calibration held no DiLoCo run)
        "diloco_extra": params.get("diloco_extra"),
        "calibration": [str(p) for p in calibration], "steps_from": [str(p) for p in steps_files],
        "algorithms": list(algorithms or ranked_algorithms()),
        "steps_spread_over_seeds": merged_spread(entries.values()),
        "steps_table": [e.row() for e in entries.values()],
        "break_even": break_even(setting, params, mode, model, layers.layers, entries,
                                 candidates) if with_break_even else {"bps": None,
                                                                      "note": "not searched"},
        "plans": plans, "notes": notes,
        "warnings": host_bound_note(runs) + wire_bound_note(runs, params, mode, algorithms)
        + diloco_warnings(params, sorted({
            r["settings"]["sync_every"] for one in plans for r in one["rows"]  # outer steps
            if not modes.mode_of(r["algorithm"]).per_step and r["time_to_target_s"] is not None
            and "sync_every" in r["settings"]})),
    }


def host_bound_note(runs: list) -> list[str]:
    """A note where calibration runs were paced by the host, not their link (the fidelity
    monitor's verdict): their step times measure CPU contention. The fit gives it the host's
    time per byte (without that term it read it as a slow link: on the LM at 1 Gbit/s, 6 of 10
    runs, the model then missed by up to 85%; with it, 8 of 10 algorithms within 20%), but a
    host's contention is the emulator's, not a cluster's: the warning stays."""
    host = [r for r in runs if r.extra.get("fidelity") == "host"]
    if not host:
        return []
    names = ", ".join(f"{r.algorithm}@{(r.inter_bps or 0) / 1e6:g}mbit" for r in host)
    return [f"{len(host)} of {len(runs)} calibration runs were paced by the host, not their "
            f"link (fidelity monitor): {names}; predictions lean on them at your risk"]


def wire_bound_note(runs: list, params: dict, mode, algorithms=None) -> list[str]:
    """A note naming the algorithms (of ``algorithms``, None: all) whose every calibration run
    was wire-bound (:func:`thinwire.sim.calibrate.wire_bound_algorithms`): a fixed cost per
    step of theirs is not fitted from such runs (a constant and the goodput cannot be told
    apart there), so where they have one (ddp-fp16's 43 ms a step on the LM, dlcp's datagram
    handling), their steps on a faster link come out short. Held out on the recorded sweeps
    without CPU times, 12 of the 16 (algorithm, calibration rate) pairs that missed by over 20%
    were calibrated at 50 Mbit/s, where every step is mostly wire. Runs that measured their
    CPU time carry some of that work in a floor (calibrate.cpu_floors), but are still named:
    with the floor, misses of 21-28% remained on the recorded sweeps."""
    bound = wire_bound_algorithms(runs, params, mode, algorithms)
    if not bound:
        return []
    return [f"{', '.join(bound)}: every calibration run of theirs spent at least "
            f"{WIRE_BOUND_SHARE:.0%} of its step on the wire, where a fixed cost per step of "
            f"theirs, if they have one, cannot be told from the goodput: their steps on faster "
            f"links may come out short by it; calibrate with runs at a faster rate too (or "
            f"unshaped)"]


def measured_times(paths) -> dict:
    """{(rate in bit/s or None, candidate label): measured seconds to target} of compare
    results: the median over the runs that reached it (several seeds, repeated races); None
    where none did. Runs that chose their algorithm (auto) are not candidates."""
    from thinwire.sim.calibrate import result_blocks
    from thinwire.sim.steps import candidate_of, chooses, run_config

    found = {}
    for path in paths:
        for b, block in enumerate(result_blocks(path, "measured results (thinwire compare)")):
            setting = block.get("setting") if isinstance(block.get("setting"), dict) else {}
            for r, raw in enumerate(block["runs"]):
                if raw.get("status") != "ok" or chooses(raw.get("algorithm")):
                    continue
                try:
                    _, _, cfg = run_config(setting, raw)
                except (ValueError, TypeError) as exc:  # a run its time cannot be placed by
                    raise ValueError(f"{path}: result {b} run {r}: {exc}") from None
                rate = (raw.get("setting") or {}).get("inter_node_bandwidth",
                                                      raw.get("inter_node_bandwidth"))
                found.setdefault((rate_bps(rate), candidate_of(cfg).label()), []).append(
                    raw.get("time_to_target_s"))
    return {key: (statistics.median(reached) if (reached := [t for t in times if t is not None])
                  else None) for key, times in found.items()}


def check_against(plan: dict, paths, measured: dict | None = None) -> dict:
    """The plan beside measured races at its rates: per rate, each ranked candidate's predicted
    and measured time to target, the measured time of the plan's choice against the measured
    fastest (its regret), and the measured crossover beside the predicted break-even.
    ``measured``: :func:`measured_times` of ``paths``, where the caller has read them."""
    measured = measured_times(paths) if measured is None else measured
    rows, summary = [], []
    for one in plan["plans"]:
        bps = one["inter_node_bps"]
        here = {label: t for (rate, label), t in measured.items() if rate == bps}
        if not here:
            continue
        reached = {label: t for label, t in here.items() if t is not None}
        for r in one["rows"]:
            if r["time_to_target_s"] is None or r["candidate"] not in here:
                continue
            got = here[r["candidate"]]
            rows.append({"rate": one["rate"], "candidate": r["candidate"],
                         "predicted_s": r["time_to_target_s"], "measured_s": got,
                         "error": None if got is None else r["time_to_target_s"] / got - 1})
        best = one["best"]["candidate"] if one["best"] else None
        fastest = min(reached, key=reached.get) if reached else None
        chosen = reached.get(best)
        summary.append({"rate": one["rate"], "plan_choice": best, "measured_fastest": fastest,
                        "choice_measured_s": chosen,
                        "fastest_measured_s": reached.get(fastest),
                        "regret": None if chosen is None or fastest is None
                        else chosen / reached[fastest] - 1,
                        "fastest_kind": None if fastest is None else
                        ("dense" if fastest.split()[0] in DENSE else "compressed")})
    errors = {}
    for row in rows:
        if row["error"] is not None:
            errors[row["rate"]] = max(errors.get(row["rate"], 0.0), abs(row["error"]))
    predicted = plan["break_even"].get("bps")
    for s in summary:
        s["max_abs_error"] = errors.get(s["rate"])
        s["break_even_mbit"] = None if predicted is None else predicted / 1e6
    return {"rows": rows, "summary": summary,
            "crossover": crossover(summary, plan["plans"], plan["break_even"].get("bps"))}


def crossover(summary: list, plans: list, predicted_bps: float | None) -> dict | None:
    """Where the measured fastest changes kind (dense / compressed) between neighbouring
    measured rates, and whether the predicted break-even lies between those two rates."""
    rates = {p["rate"]: p["inter_node_bps"] for p in plans}
    shaped = sorted((rates[s["rate"]], s["fastest_kind"]) for s in summary
                    if rates[s["rate"]] is not None and s["fastest_kind"] is not None)
    for (low, kind_low), (high, kind_high) in zip(shaped, shaped[1:]):
        if kind_low != kind_high:
            inside = predicted_bps is not None and low <= predicted_bps <= high
            return {"measured_between_bps": [low, high], "predicted_bps": predicted_bps,
                    "predicted_between": inside}
    return None
