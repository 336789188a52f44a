"""``--algorithm auto``: the run probes its link, asks `thinwire plan`, and trains with its choice.

At the start, before the model is built, every rank takes part in a probe of the inter-node
link (:mod:`thinwire.link_probe`: the goodput and latency between the nodes' first ranks, with
the host watched meanwhile), and of the links inside the nodes (:mod:`thinwire.node_probe`:
recorded as ``probe.intra_node``; where it measured the link, not the host, the plan's
intra-node bandwidth is the probe's: :mod:`thinwire.sim.probed_links`). A probe the host bound,
not the link (saturated CPUs, a CPU quota, or under 80% of the emulator's configured rate) is
not trusted: a host-bound one is taken again, up to ``link_probe.PROBE_TRIES`` times (then the
fastest is used), and the choice says where it planned from a probe it did not trust.
Rank 0 then ranks the candidates with :func:`thinwire.sim.plan.make_plan` - calibrated on
``--plan-from`` (thinwire compare results of this workload: the cost model is fitted on them,
each run or, with ``--plan-repeats median``, the median of a sweep's repetitions, and steps to
target are read from them) - at the nominal rate the probe implies (goodput over
the calibration's fitted goodput/nominal ratio), and sends its choice to every rank as JSON.
The run then trains with that candidate's settings; the probe (every try), the choice and the
runners-up go into the summary (``auto``). While it trains, :mod:`thinwire.train.replan`
probes again and may switch.

The compute per step is the calibration's fit, scaled by this cluster's compute-only step over
the calibration runs' (:mod:`thinwire.train.auto_compute`: every rank times a few steps without
communication before the choice). A failure on rank 0 (no steps measured for this training, a
file that is not compare's results) reaches every rank as the same ValueError.
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import json
import logging
import statistics
import time
from pathlib import Path

import torch
import torch.distributed as dist

from thinwire import link_probe, node_probe
from thinwire.link_probe import PROBE_REPEATS
from thinwire.train import auto_compute, modes

log = logging.getLogger(__name__)

# how long the other ranks wait for the probe and rank 0's plan (its fit takes seconds to a
# minute), whatever --collective-timeout is
CHOOSING_TIMEOUT_S = 900.0
# ...and for rank 0's re-plan while training (the fit is cached: its ranking takes seconds), at
# least; a run's --collective-timeout above it is the wait (a stuck rank 0 holds every rank
# that long, not CHOOSING_TIMEOUT_S)
RECHOOSING_TIMEOUT_S = 120.0
RUNNERS_UP = 3


def plan_files(cfg) -> list[str]:
    return [p.strip() for p in cfg.plan_from.split(",") if p.strip()]


def steps_files(cfg) -> list[str]:
    """--plan-from's files and --plan-steps-from's: where the plan reads steps to target."""
    return plan_files(cfg) + [p.strip() for p in cfg.plan_steps_from.split(",") if p.strip()]


def plan_algorithms(cfg) -> list[str] | None:
    """--plan-algorithms' names; None: every algorithm the plan ranks."""
    return [n.strip() for n in cfg.plan_algorithms.split(",") if n.strip()] or None


def check_config(cfg) -> None:
    """What auto needs, checked before anything launches."""
    from thinwire.sim.plan import check_algorithms

    check_algorithms(plan_algorithms(cfg), "--plan-algorithms")
    files = plan_files(cfg)
    if not files:
        raise ValueError("--algorithm auto needs --plan-from RESULTS_JSON[,...]: thinwire "
                         "compare results of this workload (the plan is calibrated on them and "
                         "reads steps to target from them)")
    from thinwire.sim.calibrate import result_blocks

    given = [("--plan-from", path) for path in files] + \
        [("--plan-steps-from", path) for path in steps_files(cfg)[len(files):]]
    for flag, path in given:
        if not Path(path).is_file():
            raise ValueError(f"{flag}: {path} is not a file")
        result_blocks(path, f"{flag} file")  # compare's results, before the race's first run
    if cfg.waves != 1:
        raise ValueError(f"--algorithm auto trains one wave, got --waves {cfg.waves}")


def probe_inter_node(ranks_per_node: int, timeout_s: float = CHOOSING_TIMEOUT_S,
                     sizes: tuple | None = None, repeats: int = PROBE_REPEATS,
                     leaders_group: tuple | None = None, world_group=None) -> dict:
    """:func:`thinwire.link_probe.probe_inter_node` (a name of this module, so tests can
    script the link)."""
    return link_probe.probe_inter_node(ranks_per_node, timeout_s, sizes, repeats, leaders_group,
                                       world_group=world_group)


def probe_trusted(ranks_per_node: int, timeout_s: float = CHOOSING_TIMEOUT_S,
                  tries: int = link_probe.PROBE_TRIES,
                  pause_s: float = link_probe.PROBE_PAUSE_S, world_group=None) -> dict:
    """:func:`thinwire.link_probe.probe_trusted` with this module's :func:`probe_inter_node`;
    ``world_group``: every rank's group whose timeout the ranks that do not probe wait by."""
    return link_probe.probe_trusted(
        ranks_per_node, timeout_s, tries, pause_s,
        probe=lambda *args: probe_inter_node(*args, world_group=world_group))


@functools.lru_cache(maxsize=4)
def _calibrated(files: tuple, repeats: str = "each"):
    """The cost model fitted on ``files`` (seconds to a minute), once per process: re-planning
    reuses the fit of the first choice. ``repeats``: --plan-repeats (each run, or the median
    of a sweep's repetitions)."""
    from thinwire.sim.plan import calibrated

    return calibrated(list(files), None, "max", repeats=repeats)


def choose(cfg, nodes: int, probe: dict, per_step_only: bool = False,
           current: str | None = None, compute_ms: float | None = None) -> tuple[dict, dict]:
    """(settings to apply to ``cfg``, what the summary records), on rank 0.
    ``per_step_only``: DiLoCo candidates left out (a running per-step loop switches only to
    another per-step synchronisation); ``current``: a candidate whose predicted time to
    target is recorded too (``current_time_to_target_s``; None where it is not ranked);
    ``compute_ms``: this cluster's compute-only step (:mod:`auto_compute`), None: the fit's."""
    from thinwire.sim.plan import make_plan, with_probed_intra
    from thinwire.sim.steps import WORKLOAD_FIELDS, entries_for, read_table

    if probe["goodput_Bps"] is None:
        raise ValueError("--algorithm auto needs at least 2 nodes (one node has no "
                         "inter-node link to choose for)")
    files = plan_files(cfg)
    # the link inside this run's nodes, where its probe measured it (not the calibration's)
    fitted, intra_link = with_probed_intra(files, _calibrated(tuple(files), cfg.plan_repeats),
                                           probe.get("intra_node"))
    bps = probe["goodput_Bps"] * 8 / fitted[0]["inter_efficiency"]
    table, _ = read_table(steps_files(cfg))
    found = sorted({w.workload for w in table})
    if len(found) != 1:
        raise ValueError(f"--plan-from must hold races of one workload, got {found}")
    work, _ = entries_for(table, found[0], nodes, cfg.ranks_per_node)
    mine = {name: getattr(cfg, name) for name in WORKLOAD_FIELDS}
    differ = {k: (v, mine[k]) for k, v in work.training if mine[k] != v}
    if differ:
        raise ValueError("--plan-from measured another training than this run's: " + ", ".join(
            f"{k} {a!r} there, {b!r} here" for k, (a, b) in sorted(differ.items())))
    compute = auto_compute.scale(compute_ms, auto_compute.calibration_ms(
        files, nodes, cfg.ranks_per_node, cfg.model))
    plan = make_plan(files, steps_files(cfg), found[0], nodes, cfg.ranks_per_node, [bps],
                     fitted=fitted, compute_scale=compute["scale"],
                     with_break_even=not per_step_only,  # re-planning needs the ranking only
                     algorithms=plan_algorithms(cfg), repeats=cfg.plan_repeats)
    rows = [r for r in plan["plans"][0]["rows"] if r["time_to_target_s"] is not None
            and (not per_step_only or modes.mode_of(r["algorithm"]).per_step)]
    if not rows:
        among = "" if plan_algorithms(cfg) is None else \
            f" of --plan-algorithms {cfg.plan_algorithms}"
        raise ValueError(f"--plan-from holds no candidate{among} that reached the target")
    if current is not None:  # mid-run: a switch does not run a warm-up again
        rows = sorted(rows, key=mid_run_s)
    best = rows[0]
    info = {"probe": probe, "planned_at_bps": bps, "choice": best["candidate"],
            "settings": {"algorithm": best["algorithm"], **best["settings"]},
            "compute": dict(compute, planned_ms=1e3 * plan["compute_s"]),
            "intra_node_link": intra_link,
            "predicted_time_to_target_s": best["time_to_target_s"],
            # "measured", or the two measured candidates its steps were read between
            "steps_source": best.get("steps_source"),
            "among": plan["algorithms"],  # --plan-algorithms, or every one the plan ranks
            "repeats": plan["repeats"],  # --plan-repeats: the calibration fitted run by run?
            "runners_up": [{"candidate": r["candidate"], "vs_choice": r["vs_best"]}
                           for r in rows[1:1 + RUNNERS_UP]],
            "break_even_bps": plan["break_even"].get("bps"),
            "reason": f"fastest predicted time to target at the probed {bps / 1e6:.0f} Mbit/s"
                      + ("" if probe.get("trusted", True) else
                         f" (a probe not trusted, {probe.get('bound_by')}-bound: "
                         f"{probe.get('why')})")}
    if current is not None:
        now = next((r for r in rows if r["candidate"] == current), None)
        info["predicted_time_to_target_s"] = mid_run_s(best)
        info["current_time_to_target_s"] = None if now is None else mid_run_s(now)
        info["switch"] = {"current": None if now is None else switch_figures(now),
                          "best": switch_figures(best)}
    return {"algorithm": best["algorithm"], **best["settings"]}, info


def mid_run_s(row: dict) -> float:
    """A candidate's predicted time to target without its warm-up steps: what ranks it for a
    run already under way (a switch continues the run's step count: PowerSGD's dense first
    steps, which at 25 Mbit/s cost 7 s each for compare's MNIST model, are not run again)."""
    return row["steps"] * row["step_s"]


def switch_figures(row: dict) -> dict:
    """What a switch weighs of a candidate at the plan's rate
    (:func:`thinwire.train.replan.weigh_switch`): its steps to target and step time."""
    return {"steps": row["steps"], "step_s": row["step_s"]}


def gather_json(payload, group) -> list:
    """Every rank's ``payload``, in rank order, on every rank (JSON bytes over ``group``, a
    gloo group, as :func:`broadcast_json`)."""
    data = json.dumps(payload).encode()
    world = dist.get_world_size(group)
    lengths = [torch.zeros(1, dtype=torch.int64) for _ in range(world)]
    dist.all_gather(lengths, torch.tensor([len(data)], dtype=torch.int64), group=group)
    size = max(int(n.item()) for n in lengths)
    mine = torch.zeros(size, dtype=torch.uint8)
    mine[:len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    buffers = [torch.zeros(size, dtype=torch.uint8) for _ in range(world)]
    dist.all_gather(buffers, mine, group=group)
    return [json.loads(bytes(b[:int(n.item())].tolist()).decode())
            for b, n in zip(buffers, lengths)]


def broadcast_json(payload: dict | None, group) -> dict:
    """Rank 0's ``payload`` on every rank (JSON bytes over ``group``, a gloo group: never a
    pickle, and CPU tensors whatever the run's backend)."""
    data = json.dumps(payload).encode() if dist.get_rank() == 0 else b""
    length = torch.tensor([len(data)], dtype=torch.int64)
    dist.broadcast(length, src=0, group=group)
    buffer = torch.zeros(int(length.item()), dtype=torch.uint8)
    if dist.get_rank() == 0:
        buffer.copy_(torch.frombuffer(bytearray(data), dtype=torch.uint8))
    dist.broadcast(buffer, src=0, group=group)
    return json.loads(bytes(buffer.tolist()).decode())


def _never_built(cfg, module, device_ids):
    raise RuntimeError("--algorithm auto is resolved to a chosen algorithm before the run "
                       "builds its synchronisation (thinwire.train.auto.resolve)")


def _no_hook_state(saved, algorithm: str, shapes: list) -> None:
    # a ValueError: raised inside checkpoint.load's check, it still reaches the ranks' agreement
    raise ValueError("--algorithm auto resumes as the algorithm its checkpoint was written "
                     "under (thinwire.train.auto.resolve), whose hook state is checked: never "
                     "as 'auto' itself")


def _compute_band(cfg, nodes: int) -> tuple | None:
    """On rank 0, the calibration's compute-only steps (:func:`auto_compute.calibration_ms`)
    that decide whether the compute probe is taken again; None elsewhere, and where the files
    cannot be read (the plan reads them next and names the error on every rank)."""
    if dist.get_rank() != 0:
        return None
    try:
        return auto_compute.calibration_ms(plan_files(cfg), nodes, cfg.ranks_per_node,
                                           cfg.model)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def resolve(cfg, measure_compute=None):
    """``cfg`` with auto's choice applied (collective: every rank calls it), and the record.
    ``measure_compute()``: this rank's compute-only step in ms (the training loop's timing,
    collective), or None: the plan's compute is the calibration's."""
    from thinwire.topology import ranks_per_node_of
    from thinwire.train import checkpoint

    # unset: the launcher's (torchrun's LOCAL_WORLD_SIZE), as the run's topology takes it
    cfg = dataclasses.replace(cfg, ranks_per_node=ranks_per_node_of(cfg.ranks_per_node,
                                                                     dist.get_world_size()))
    nodes = dist.get_world_size() // cfg.ranks_per_node
    timeout_s = max(CHOOSING_TIMEOUT_S, cfg.collective_timeout_s)
    # the other ranks wait while rank 0 fits the cost model (seconds to a minute): on a group
    # of their own with room for that, not under the run's collective timeout
    waiting = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=timeout_s))
    began = time.perf_counter()
    try:
        probe = probe_trusted(cfg.ranks_per_node, timeout_s, world_group=waiting)
        probe["intra_node"] = node_probe.probe_intra_node(cfg.ranks_per_node, timeout_s,
                                                          world_group=waiting)
        probe["seconds"] = time.perf_counter() - began
        tries = auto_compute.probe_tries(cfg, waiting, measure_compute,
                                         _compute_band(cfg, nodes))
        compute_ms = statistics.median(tries) if tries else None
        directory = checkpoint.agreed_resume_directory(cfg)
        files = gather_json(checkpoint.saved_choices(directory, dist.get_rank())
                            if directory else [], waiting)
        message = None
        if dist.get_rank() == 0:
            try:
                try:
                    chosen, info = choose(cfg, nodes, probe, compute_ms=compute_ms)
                    info["compute"]["tries_ms"] = tries
                except ValueError as exc:
                    if not directory:
                        raise
                    # resuming on a cluster the plan cannot choose for (a spot node lost:
                    # another shape, one node): the checkpoint's choice may still go on
                    chosen, info = None, {"probe": probe, "plan_error": str(exc)}
                chosen, info = _resumed(cfg, chosen, info, directory, files)
                message = {"chosen": chosen, "info": info}
            except Exception as exc:  # every rank ends with rank 0's error, none waits on
                message = {"error": f"{exc}" if isinstance(exc, (ValueError, OSError))
                           else f"{type(exc).__name__}: {exc}"}
        message = broadcast_json(message, waiting)
    finally:
        dist.destroy_process_group(waiting)
    if "error" in message:
        raise ValueError(message["error"])
    # before training starts: like the compute probe, not in the run's time to target
    message["info"]["choosing_s"] = time.perf_counter() - began
    log.info("auto: %s (%s)", message["info"]["choice"], message["info"]["reason"])
    return applied(cfg, message["chosen"]), message["info"]


def applied(original, chosen: dict):
    """The run's configuration as given (``original``: --algorithm auto) with a plan's
    ``chosen`` settings, validated: a candidate names only the settings it sets, so nothing of
    an earlier choice may linger (its wire, values' dtype, selector)."""
    from thinwire.train import settings

    new_cfg = dataclasses.replace(original, plan_from="", plan_steps_from="",
                                  plan_algorithms="", plan_repeats="each", **chosen)
    while reset := settings.inapplicable(new_cfg):
        new_cfg = dataclasses.replace(new_cfg, **reset)
    return new_cfg.validate()


def resumable_choice(per_rank: list[list[dict]]) -> dict | None:
    """Of every rank's files (:func:`thinwire.train.checkpoint.saved_choices`), the newest
    step every rank holds under one recorded choice: ``{"step", "auto", "algorithm"}``; None
    where the ranks share no step (the load then says why, naming each rank's steps)."""
    def key(entry):
        return json.dumps(entry["auto"], sort_keys=True)
    common = None
    for files in per_rank:
        mine = {(f["step"], key(f)) for f in files}
        common = mine if common is None else common & mine
    if not common:
        return None
    step, _ = max(common)
    return next(f for f in per_rank[0] if f["step"] == step)


def _resumed(cfg, chosen: dict, info: dict, directory: str | None,
             per_rank: list[list[dict]]) -> tuple[dict, dict]:
    """On rank 0, resuming (``per_rank``: every rank's files in ``directory``): the choice the
    checkpoint every rank resumes from was written under replaces the plan's (the residuals,
    velocities and hook state in it are that algorithm's; switching now would drop them), the
    plan's own choice at the probed rate kept in the record; re-planning goes on from there.
    Not resuming, or no step shared by every rank: (``chosen``, ``info``) as they are.
    ``chosen`` None: the plan failed here (``info["plan_error"]``): the checkpoint's choice
    goes on without re-planning, and where there is none the plan's error is raised."""
    saved = resumable_choice(per_rank) if directory else None
    if saved is None:  # no file (a new run under --resume-if-present), or none shared: the
        if chosen is None:  # load says so, naming each rank's steps
            raise ValueError(info["plan_error"])  # nothing to go on with: the plan's error
        return chosen, info
    entry = saved["auto"]
    if not (isinstance(entry, dict) and isinstance(entry.get("settings"), dict)
            and isinstance(entry["settings"].get("algorithm"), str)
            and isinstance(entry.get("choice"), str)):
        raise ValueError(f"--resume {directory}: its checkpoint (step {saved['step']}) was not "
                         f"written by --algorithm auto (no choice recorded); resume it with "
                         f"--algorithm {saved.get('algorithm') or '?'} and its settings")
    settings = dict(entry["settings"])
    try:  # a key no configuration has, or a value it refuses: named before anything loads
        applied(cfg, settings)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"--resume {directory}: the choice recorded in its checkpoint "
                         f"({entry['choice']!r}) does not apply to this run: {exc}") from None
    if chosen is None:
        why = (f"resumed with the choice its checkpoint was written under; the plan cannot "
               f"choose on this cluster ({info['plan_error']}), so no re-planning")
    else:
        why = (f"resumed with the choice its checkpoint was written under (the plan at the "
               f"probed rate: {info['choice']})")
    info = dict(info, choice=entry["choice"], settings=settings,
                resumed={"from": directory, "step": saved["step"],
                         "plan_now": info.get("choice")}, reason=why)
    return settings, info


# probes the link, asks the plan, then runs its choice
AUTO = modes.register(modes.Mode("auto", lambda: ("auto",), check_config, _never_built,
                                 _no_hook_state, per_step=True, in_default_race=False,
                                 resolve=resolve))
