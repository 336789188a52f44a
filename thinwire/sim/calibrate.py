"""Fit the simulator to measured runs, then predict each run and compare.

Input: one or more ``thinwire compare`` result files, read tolerantly (the accepted spellings are
in ``SETTING_KEYS``, ``ITERATION_KEYS`` and ``ALGORITHM_ALIASES``; unknown keys are ignored)::

    {"setting": {"nodes": 2, "ranks_per_node": 2, "model": "widecnn", "batch_size": 32, ...},
     "runs": [{"algorithm": "hitopk", "inter_node_bandwidth": "100mbit", "status": "ok",
               "parameters": 1200000, "iter_ms": 410.0, "compute_ms_per_iter": 250.0,
               "sync_ms_per_iter": 160.0, "hook": {"comm_ms_per_iter": 300.0,
               "select_ms_per_iter": 20.0}, "inter_node_mb_per_iter": 0.9, ...}, ...]}

A file may also hold a list of such objects (or ``{"results": [...]}``). Each run sees the
file's ``setting``, then its own ``setting`` object, then its own keys (later wins).
* Size: ``nodes`` and ``ranks_per_node`` (spellings in SETTING_KEYS) are required.
* Iteration time: ``iteration_s`` / ``iter_ms`` (spellings in ITERATION_KEYS), or else
  ``samples_per_s`` and the global batch (``global_batch_size``, or per-rank ``batch_size`` x
  world size). A run without one, or with a ``status`` other than "ok", is skipped.
* Model: a simulator model (resnet50, bert-base), a model of ``thinwire.train.models`` (its table
  is traced from the module), or else a size: ``parameters`` gradient elements.
* ``inter_node_bandwidth``: a rate string ("1gbit") or bits/s; "none"/null means an unshaped
  run, whose inter-node links are the same loopback as the intra-node ones.
* Optional measurements, each used as one more residual: ``compute_ms_per_iter`` (the step
  without communication; else ``iter_ms - sync_ms_per_iter``, thinwire compare's definition of
  the exposed synchronisation) and the hook's total ``comm_ms_per_iter + select_ms_per_iter``
  (top level or under ``hook``). ``cpu_ms_per_iter`` with ``host_cores`` (the ranks' CPU a
  step and the cores they shared) gives the setting's CPU floor (below).
* Algorithms: thinwire's registered ones, plus ``ddp`` (modelled as allreduce), ``ddp-fp16``
  (allreduce with an fp16 wire) and ``powersgd`` (PyTorch's hook, :mod:`thinwire.sim.powersgd`:
  needs a model of ``thinwire.train`` for its shapes, and ``powersgd_rank``, default 4); others
  are skipped and listed.

Fitted (log-space least squares within physical bounds, scipy): inter-node latency and
goodput/nominal ratio, the host's time per inter-node byte (CPU work of sending, paid in series
with the wire: on the emulator's 2 cores it set the LM's pace at 1 Gbit/s, where a fit without
it read the host as a link at half its rate), intra-node latency and bandwidth, one rate for
selection and index_add plus a fixed cost per selection call, the rate of PowerSGD's
memory-bound passes over a bucket (identified only where a powersgd run is among the data),
and one compute time (forward + backward + step) per setting - on the emulated cluster every
rank shares the host's cores, so compute time depends on the setting, and selection (work of
the same cores) is slowed by the same factor as compute relative to the fastest setting.
Residuals, all relative to the run's iteration time: iteration time, compute time and total
hook time (where measured).

Two terms are each algorithm's own, learned from the calibration runs and carried to any rate:

* its measured over modelled inter-node bytes per step (``inter_node_mb_per_iter``, which
  compare reads from the node interfaces): framing, headers and resends the model's volumes
  leave out cost wire time in proportion (DLCP: 1.89x on MNIST);
* a fixed cost per step the shared fit leaves unexplained (Ok-Topk's threshold work: ~280 ms
  on MNIST), fitted after the shared parameters, which use a robust loss so that one
  algorithm's missing cost does not bend them, and only from runs whose wire takes under half
  the step (where the wire is most of it, a constant and the goodput cannot be told apart).

And one each setting measured, not fitted: a floor under its step, the ranks' CPU seconds a
step (``cpu_ms_per_iter``) over the cores they share (``host_cores``). Where a slow wire hides
the host's work, the step time cannot show it but the CPU time does (:func:`cpu_floors`).
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np

from thinwire.collectives import sparse_wire_names
from thinwire.output import read_json
from thinwire.sim import powersgd
from thinwire.sim.collectives import AlgorithmConfig, Cluster, SparseRates, names
from thinwire.sim.compute import MODELS, TimedLayer, model, own_model, uniform
from thinwire.sim.iteration import simulate
from thinwire.sim.network import PHASE_FORMS, Link, Network


SETTING_KEYS = {
    "nodes": ("nodes", "num_nodes", "n_nodes", "nnodes"),
    "ranks_per_node": ("ranks_per_node", "gpus_per_node", "nproc_per_node", "local_world_size",
                       "procs_per_node"),
    "inter_node_bandwidth": ("inter_node_bandwidth", "inter_node_bandwidth_bps", "bandwidth",
                             "inter_bandwidth"),
    "model": ("model", "model_name"),
    "parameters": ("parameters", "model_parameters", "num_parameters", "n_parameters", "params"),
    "batch_size": ("batch_size", "per_rank_batch_size", "local_batch_size", "batch_per_rank"),
    "global_batch_size": ("global_batch_size", "total_batch_size"),
    "density": ("density",),
    "wire": ("wire", "wire_dtype"),
}
ITERATION_KEYS = {1.0: ("iteration_s", "s_per_iter", "sec_per_iter", "seconds_per_iter"),
                  1e-3: ("iter_ms", "iteration_ms", "ms_per_iter")}
# compare's names for PyTorch's own DDP hooks -> (simulated algorithm, wire dtype)
ALGORITHM_ALIASES = {"ddp": ("allreduce", None), "ddp-fp16": ("allreduce", "fp16")}
PEERS = ("powersgd",)  # modelled outside the registry (thinwire.sim.powersgd)
FIT_NAMES = ("inter_alpha_s", "inter_efficiency", "intra_alpha_s", "intra_bandwidth_Bps",
             "sparse_rate", "sparse_alpha_s", "inter_host_s_per_byte", "pass_rate")
START = (1e-4, 0.9, 5e-5, 1e9, 1e8, 1e-4, 1e-9, 1e9)
MAX_FORM_ALPHA_STARTS = (1e-4, 3e-3, 3e-2)  # inter-node fixed cost per step, seconds
# Physical ranges (a fit outside them trades one term for another): latencies 1 us - 0.1 s, at
# most the nominal inter-node rate, 1 MB/s - 1 TB/s inside a node, 1e5 - 1e13 elements/s.
LOWER = (1e-6, 0.05, 1e-6, 1e6, 1e5, 1e-7, 1e-12, 1e6)
UPPER = (0.1, 1.0, 0.1, 1e12, 1e13, 1.0, 1e-6, 1e12)
COMPUTE_RANGE = (1e-5, 1e4)  # seconds per iteration
# Measured over modelled inter-node bytes: beyond these a run's counters measured something else
# (another job's traffic, a model the simulator traced wrongly), not an algorithm's framing.
BYTES_SCALE_RANGE = (0.5, 4.0)
COUNTED = "interface counters"
# read_runs' note for a DiLoCo run (the holdout, which holds them out, drops it)
DILOCO_APART = "DiLoCo, not a per-step run (thinwire.sim.diloco_fit fits it apart)"  # compare's inter_node_mb_source for measured bytes
# The most an algorithm's unexplained fixed cost per step may be (seconds).
STEP_EXTRA_MAX_S = 5.0
# The shared parameters are fitted with a robust loss (errors beyond ~5% count less and less):
# one algorithm with a cost its model lacks must not bend what every algorithm shares; its
# constant takes that cost afterwards. (Linear loss: Ok-Topk's ~250 ms a step went into the
# shared per-selection cost and moved hier_allreduce's prediction by 27% in a synthetic test.)
SHARED_LOSS, SHARED_LOSS_SCALE = "cauchy", 0.05
EXTRA_ROUNDS = 3  # alternations of the shared fit and the per-algorithm constants
REFIT_EVALUATIONS = 5  # per parameter, in each later round (it starts from the last fit)
WIRE_BOUND_SHARE = 0.5  # ... fitted only from runs whose wire takes less of the step than this
# A weak pull of the inter-node goodput/nominal ratio towards 0.9 (TCP over an HTB-shaped link;
# 0.88 fitted at 50 Mbit/s on the emulator, docs/benchmarks.md): negligible where the runs
# determine the ratio, it decides only where they do not (communication hidden behind the
# backward pass at the calibration rate) instead of leaving it wherever the optimiser stopped.
# It also splits a byte's time between the wire and the host where the runs share one link
# rate: there both scale with the bytes alike, and only two or more rates tell them apart.
PRIOR_EFFICIENCY, PRIOR_WEIGHT = 0.9, 0.005
# A weaker pull of the intra-node latency towards 50 us (a message over loopback TCP):
# shaped runs hardly see it (their intra-node phases hide behind the inter-node ones), so it
# wandered where the optimiser stopped - 3 us in one fit, 12 ms in the next with the same
# residuals to 0.5% - and an unshaped plan, whose nodes talk over that link too, inherited it
# (PowerSGD's many small all-reduces predicted 2.7x too slow on the LM).
PRIOR_INTRA_ALPHA_S, PRIOR_INTRA_WEIGHT = 5e-5, 0.0005
PRIORS = 2  # residuals the priors append after the runs' own
# The node-local link where no calibration run uses it (:func:`intra_node_seen`): the
# latency's prior, and the rate the 2 x 2 sweeps fit where their intra-node phases show
# (1.9-2.7e8 B/s: a rank-to-rank TCP message through the emulator's host). A plan for real
# nodes takes that link from its probe instead (refit_step_extras).
UNSEEN_INTRA = {"intra_alpha_s": PRIOR_INTRA_ALPHA_S, "intra_bandwidth_Bps": 2e8}
# Overlap of communication with the backward pass. "hooks" (the default) follows how each run's
# hook runs instead of fitting it: DDP's own all-reduce and the fp16 hook return a future at
# once, so their buckets run behind the rest of the backward pass on DDP's bucket schedule;
# PowerSGD's hook waits for each bucket (thinwire.train.grad_sync), and thinwire's hooks spend
# their time in selection and collectives that, on the emulator's shared cores, take the same
# CPU as the backward pass (measured: their phases add up to the step, "idle" ~0), so both are
# costed after the backward pass. "ddp"/"none": every algorithm overlaps / none does;
# "auto": the better fitting of those two.
OVERLAP_MODES = {"hooks": ["hooks"], "ddp": [True], "none": [False], "auto": [True, False]}


def overlap_modes(overlap: str) -> list:
    if overlap not in OVERLAP_MODES:
        raise ValueError(f"overlap must be one of {', '.join(OVERLAP_MODES)}, got {overlap!r}")
    return OVERLAP_MODES[overlap]


def mode_name(mode) -> str:
    return mode if isinstance(mode, str) else ("ddp" if mode else "none")


@dataclass
class Run:
    source: str
    algorithm: str               # as measured (e.g. "ddp")
    modelled_as: str             # the simulated algorithm
    nodes: int
    ranks_per_node: int
    inter_bps: float | None      # nominal bits/s; None: unshaped
    layers_key: str              # the model (name or parameter count), for the compute share
    layers: list
    density: float
    wire: str | None
    iteration_s: float
    compute_s: float | None = None   # measured step without communication
    hook_s: float | None = None      # measured time inside the hook (selection + collectives)
    setting_index: int = 0
    extra: dict = field(default_factory=dict)
    shapes: tuple | None = None      # parameter shapes (powersgd only)
    powersgd_rank: int = 4
    sparse_wire: str = "fp32"        # the selected values' dtype (sparse_wire algorithms)
    cpu_s: float | None = None       # measured CPU seconds a step, all ranks together
    cores: float | None = None       # the cores those ranks shared (the emulator's host)


def _pick(mapping: dict, key: str, default=None):
    for alias in SETTING_KEYS[key]:
        if alias in mapping and mapping[alias] is not None:
            return mapping[alias]
    return default


def rate_bps(value) -> float | None:
    """A run's inter-node rate in bit/s ("200mbit" or a number); None where unshaped."""
    if value is None or (isinstance(value, str) and value.lower() in ("none", "unshaped", "")):
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if value <= 0:
            raise ValueError(f"inter_node_bandwidth must be > 0 bits/s, got {value}")
        return None if math.isinf(value) else float(value)
    from thinwire.cluster.spec import parse_rate
    return float(parse_rate(str(value), "inter_node_bandwidth"))


def _number(value) -> float | None:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) \
            and value > 0:
        return float(value)
    return None


def _iteration_s(merged: dict, world: int) -> float | None:
    for scale, keys in ITERATION_KEYS.items():
        for key in keys:
            if _number(merged.get(key)):
                return _number(merged[key]) * scale
    rate = _number(merged.get("samples_per_s"))
    global_batch = _pick(merged, "global_batch_size")
    if global_batch is None and _pick(merged, "batch_size") is not None:
        global_batch = int(_pick(merged, "batch_size")) * world
    return float(global_batch) / rate if rate and global_batch else None


def _measured_parts(merged: dict, iteration_s: float) -> tuple[float | None, float | None]:
    """(compute seconds, hook seconds) where the run measured them."""
    compute_s = _number(merged.get("compute_ms_per_iter"))
    if compute_s is not None:
        compute_s /= 1e3
    elif merged.get("sync_ms_per_iter") is not None:
        compute_s = _number(iteration_s - float(merged["sync_ms_per_iter"]) / 1e3)
    hook = merged.get("hook") if isinstance(merged.get("hook"), dict) else merged
    parts = [hook.get("comm_ms_per_iter"), hook.get("select_ms_per_iter")]
    hook_s = sum(float(p) for p in parts if p is not None) / 1e3 \
        if parts[0] is not None else None
    return compute_s, hook_s


def _layers_for(merged: dict, where: str) -> tuple[str, list]:
    name, parameters = _pick(merged, "model"), _pick(merged, "parameters")
    if name in MODELS:
        return name, model(name)
    traced = own_model(name) if isinstance(name, str) else None
    if traced:
        return name, traced
    if parameters is not None:
        return f"{name or 'model'}:{int(parameters)}", uniform(int(parameters))
    raise ValueError(f"{where}: the model's size is unknown: give setting.model as one of "
                     f"{', '.join(MODELS)} or a model of thinwire.train, or its gradient "
                     f"element count as one of {', '.join(SETTING_KEYS['parameters'])} "
                     f"(model was {name!r})")


def result_blocks(path, what: str = "results file") -> list[dict]:
    """The result blocks of a results file (thinwire compare's ``{"setting": ..., "runs":
    [...]}``, a list of them, or ``{"results": [...]}``), each run an object; else a
    ValueError naming the file (``what``: what the caller reads it as)."""
    data = read_json(path, what)
    blocks = data.get("results", data) if isinstance(data, dict) else data
    blocks = [blocks] if isinstance(blocks, dict) else blocks
    if not isinstance(blocks, list):
        raise ValueError(f"{path}: expected {{'setting': ..., 'runs': [...]}} or a list of "
                         f"them (thinwire compare's results.json), got {type(data).__name__}")
    for b, block in enumerate(blocks):
        if not isinstance(block, dict) or not isinstance(block.get("runs"), list):
            raise ValueError(f"{path}: result {b} has no 'runs' list (not thinwire compare's "
                             f"results.json?)")
        for r, run in enumerate(block["runs"]):
            if not isinstance(run, dict):
                raise ValueError(f"{path}: result {b} run {r} is not an object (a run of "
                                 f"thinwire compare), got {type(run).__name__}")
    return blocks


def _steps_outer(algorithm) -> bool:
    """A mode that steps an outer optimizer every H steps, not every step (DiLoCo)."""
    from thinwire.train import modes

    try:
        return not modes.mode_of(algorithm).per_step
    except ValueError:  # not a mode of thinwire train (ddp, powersgd, another tool's name)
        return False


def read_run(raw: dict, setting: dict, where: str, source: str) -> Run | str:
    """A Run, or why the run is skipped."""
    nested = raw.get("setting") if isinstance(raw.get("setting"), dict) else {}
    merged = {**setting, **nested, **raw}
    measured = raw.get("algorithm")
    modelled, wire = ALGORITHM_ALIASES.get(measured, (measured, _pick(merged, "wire")))
    if _steps_outer(measured):  # DiLoCo: its own cost is fitted apart, after the per-step fit
        return f"{where}: {DILOCO_APART}"
    if modelled not in names() + PEERS:
        return (f"{where}: algorithm {measured!r} is not simulated (simulated: "
                f"{', '.join(list(names()) + list(ALGORITHM_ALIASES) + list(PEERS))})")
    if raw.get("status", "ok") != "ok":
        return f"{where}: status {raw['status']!r}"
    nodes, per_node = _pick(merged, "nodes"), _pick(merged, "ranks_per_node")
    if nodes is None or per_node is None:
        raise ValueError(f"{where}: needs nodes ({'/'.join(SETTING_KEYS['nodes'])}) and "
                         f"ranks_per_node ({'/'.join(SETTING_KEYS['ranks_per_node'])})")
    cluster = Cluster(int(nodes), int(per_node))
    seconds = _iteration_s(merged, cluster.world_size)
    if seconds is None:
        return (f"{where}: no iteration time (needs iteration_s, iter_ms or samples_per_s with "
                f"batch_size/global_batch_size)")
    compute_s, hook_s = _measured_parts(merged, seconds)
    key, layers = _layers_for(merged, where)
    wire = None if wire in (None, "none") else wire
    shapes, rank = None, 4
    if modelled == "powersgd":
        shapes = powersgd.parameter_shapes(_pick(merged, "model"))
        if shapes is None:
            return (f"{where}: powersgd needs the parameter shapes of a thinwire.train model "
                    f"(model was {_pick(merged, 'model')!r})")
        rank = powersgd.check_rank(int(merged.get("powersgd_rank") or 4))
        wire = None
    # compare records the race's --sparse-wire for every run; only these algorithms apply it
    sparse_wire = str(merged.get("sparse_wire") or "fp32") \
        if modelled in sparse_wire_names() else "fp32"
    return Run(source, measured, modelled, cluster.nodes, cluster.ranks_per_node,
               rate_bps(_pick(merged, "inter_node_bandwidth")), key, layers,
               float(_pick(merged, "density", 0.01)), wire, seconds, compute_s, hook_s,
               # bytes counted at the node interfaces, not estimated from the traffic model
               extra={**{k: raw[k] for k in ("inter_node_mb_per_iter",)
                         if raw.get(k) is not None
                         and raw.get("inter_node_mb_source", COUNTED) == COUNTED},
                      # the fidelity monitor's verdict: "host" where the host set the pace
                      **({"fidelity": raw["fidelity"].get("verdict")}
                         if isinstance(raw.get("fidelity"), dict) else {})},
               shapes=None if shapes is None else tuple(shapes), powersgd_rank=rank,
               sparse_wire=sparse_wire, cpu_s=_cpu_s(merged),
               cores=_number(merged.get("host_cores")))


def _cpu_s(merged: dict) -> float | None:
    ms = _number(merged.get("cpu_ms_per_iter"))
    return None if ms is None else ms / 1e3


def read_runs(paths) -> tuple[list[Run], list[str]]:
    """The usable runs of all ``paths`` and a note per skipped run."""
    runs, skipped = [], []
    for path in paths:
        for b, block in enumerate(result_blocks(path)):
            setting = block.get("setting") if isinstance(block.get("setting"), dict) else {}
            for r, raw in enumerate(block["runs"]):
                got = read_run(raw, setting, f"{path} result {b} run {r}", str(path))
                (runs if isinstance(got, Run) else skipped).append(got)
    if not runs:
        raise ValueError("no usable runs to calibrate on" +
                         (": " + "; ".join(skipped) if skipped else ""))
    keys = sorted({setting_key(r) for r in runs})
    for run in runs:
        run.setting_index = keys.index(setting_key(run))
    return runs, skipped


def reindexed(runs: list[Run]) -> list[Run]:
    """``runs`` with their setting indices renumbered among themselves (a subset to fit)."""
    keys = sorted({setting_key(r) for r in runs})
    return [dataclasses.replace(r, setting_index=keys.index(setting_key(r))) for r in runs]


def setting_key(run: Run) -> tuple:
    """What makes two runs the same setting (cluster shape, rate, model): they share a fit."""
    return (run.nodes, run.ranks_per_node, run.inter_bps or 0.0, run.layers_key)


def _timed(layers: list, compute_s: float) -> list[TimedLayer]:
    """The setting's compute time spread over the layers by FLOPs (1/3 forward, 2/3 backward)."""
    weights = [l.flops for l in layers]
    if not sum(weights):
        weights = [l.params for l in layers]
    total = sum(weights)
    return [TimedLayer(l.name, l.params, compute_s / 3 * w / total, 2 * compute_s / 3 * w / total)
            for l, w in zip(layers, weights)]


def network_for(params: dict, inter_bps: float | None, bytes_scale: float = 1.0,
                nominal_rate: bool = False) -> Network:
    """The fitted links at ``inter_bps``; ``bytes_scale``: the algorithm's measured inter-node
    bytes over the modelled ones (its wire carries that much more per modelled byte);
    ``nominal_rate``: its bytes take the nominal rate, not the fitted goodput (an algorithm
    that paces its own datagrams: :func:`paced`)."""
    form = params.get("phase_form", "sum")
    intra = Link(params["intra_alpha_s"], params["intra_bandwidth_Bps"], form)
    if inter_bps is None:
        return Network(intra, intra, "unshaped")
    inter = Link(params["inter_alpha_s"],
                 1.0 / inter_s_per_byte(params, inter_bps, bytes_scale, nominal_rate), form)
    return Network(intra, inter)


def inter_s_per_byte(params: dict, inter_bps: float, bytes_scale: float = 1.0,
                     nominal_rate: bool = False) -> float:
    """Seconds a modelled inter-node byte costs at ``inter_bps``: its wire time at the fitted
    goodput (at the nominal rate where ``nominal_rate``) plus the host's CPU time per byte
    sent (``inter_host_s_per_byte``: copies, the TCP stack, gloo's reduction - paid in series
    with the wire where the ranks' compute already holds the cores), both times
    ``bytes_scale``. Calibrations fitted before the host term existed lack it and read as 0."""
    return bytes_scale * (_wire_s_per_byte(params, inter_bps, nominal_rate)
                          + params.get("inter_host_s_per_byte", 0.0))


def _wire_s_per_byte(params: dict, inter_bps: float, nominal_rate: bool = False) -> float:
    """A byte's time on the wire at the fitted goodput (the host's time per byte left out);
    ``nominal_rate``: at the nominal rate (datagrams the sender paces fill the shaped link; the
    goodput/nominal ratio is TCP's)."""
    return 8 / ((1.0 if nominal_rate else params["inter_efficiency"]) * inter_bps)


def paces_datagrams(algorithm: str) -> bool:
    """Whether the algorithm ``algorithm`` sends datagrams paced at the link's rate (the
    registry's ``paced_datagrams``: dlcp): its bytes cost the nominal rate, not TCP's goodput.
    False for what the registry does not hold (PyTorch's hooks, DiLoCo)."""
    from thinwire import collectives

    return algorithm in collectives.names() and collectives.get(algorithm).paced_datagrams


def paced(run: Run) -> bool:
    """:func:`paces_datagrams` for the algorithm ``run`` is modelled as."""
    return paces_datagrams(run.modelled_as)


def wire_s(run: Run, row: dict, params: dict) -> float:
    """The time ``run``'s inter-node bytes per step (``row``: its prediction) take on the wire
    alone; 0 unshaped."""
    if run.inter_bps is None:
        return 0.0
    return row["inter_node_mb_per_iter"] * 1e6 * bytes_scale_of(params, run) \
        * _wire_s_per_byte(params, run.inter_bps, paced(run))


# the parts of a setting's key (bytes_key's tuple, in order), named as scales_json writes them
SETTING_NAMES = ("algorithm", "density", "wire", "sparse_wire", "powersgd_rank", "nodes",
                 "ranks_per_node", "model")


def bytes_key(run: Run) -> tuple:
    """What fixes a run's bytes per step (not its link rate): runs sharing it share a scale."""
    return (run.algorithm, run.density, run.wire, run.sparse_wire, run.powersgd_rank,
            run.nodes, run.ranks_per_node, run.layers_key)


def bytes_scales(runs: list[Run]) -> dict:
    """{bytes_key: median of measured / modelled inter-node bytes per step} over the shaped
    runs that counted their bytes (compare reads the node interfaces). What the model's volumes
    leave out - datagram headers, retransmissions, a wire format's own framing - then costs
    wire time at every rate, and a held-out rate inherits it from the calibration runs."""
    ratios = defaultdict(list)
    for run in runs:
        measured = run.extra.get("inter_node_mb_per_iter")
        if run.inter_bps is None or not measured:
            continue
        modelled = _modelled_inter_mb(run)
        if modelled > 0:
            ratios[bytes_key(run)].append(float(measured) / modelled)
    return {key: min(max(statistics.median(values), BYTES_SCALE_RANGE[0]), BYTES_SCALE_RANGE[1])
            for key, values in ratios.items()}


def cpu_floors(runs: list[Run], compute_s: list[float]) -> dict:
    """{bytes_key: median over the runs of their CPU seconds a step over the cores they shared,
    in units of their setting's compute time (``compute_s``, the fit's, by setting index)}:
    where the ranks share a host's cores (the emulator), a step cannot take less than its host
    work spread over them, at any link rate. On a slow link that work hides behind the wire -
    the step time cannot show it, a fixed cost per step cannot be fitted from it
    (:func:`_step_extras`) - but the ranks' CPU time still counts it (the fp16 hook's casts,
    gloo's copies and reductions), so a run calibrated there carries it to the faster links.
    In units of compute, as the selection and the fixed costs per step scale: a plan for a
    faster device scales it down with the compute (it is the host work of the emulator's ranks,
    not of a GPU cluster's). Runs without the measurement (``cpu_ms_per_iter``) give none.
    DiLoCo's step gets none (its inner steps' CPU is not measured apart from its outer
    exchanges): a plan ranks it without a floor beside floored per-step candidates.

    An algorithm that paces its own datagrams (:func:`paced`: DLCP) takes its floor too,
    though its CPU a step grows as the link slows (1.2-1.4x at 50 Mbit/s what it is at
    1 Gbit/s on the four recorded setups): taken at a slow rate the floor overstates its host
    work at a fast one, and the holdout over-predicts its 1 Gbit/s step by 18-26%. Without
    the floor the same steps were predicted 37-58% short (the host work hides behind the wire
    at 50 Mbit/s), so the floor is the smaller error (`thinwire bench phase-forms`)."""
    floors = defaultdict(list)
    for run in runs:
        if run.cpu_s is not None and run.cores:
            floors[bytes_key(run)].append(run.cpu_s / run.cores / compute_s[run.setting_index])
    return {key: float(statistics.median(values)) for key, values in floors.items()}


def cpu_floor_of(params: dict, run: Run) -> float | None:
    """``run``'s CPU floor in seconds at its setting's compute time: its own setting's, else
    the median of its algorithm's other settings on the same cluster and model (another
    density or rank: the selection, the casts and the collectives' host work hardly move with
    it), else none. Without the fallback a candidate the calibration did not run would escape
    the floor its measured neighbour carries, and the plan would prefer it for that alone."""
    floors = params.get("cpu_floor", {})
    key = bytes_key(run)
    if key in floors:
        share = floors[key]
    else:
        same = [value for other, value in floors.items()
                if other[0] == key[0] and other[-3:] == key[-3:]]
        if not same:
            return None
        share = float(statistics.median(same))
    return share * params["compute_s"][run.setting_index]


def bytes_scale_of(params: dict, run: Run) -> float:
    """``run``'s measured/modelled bytes: its own setting's, else the median of its
    algorithm's other settings' (another density or cluster frames its bytes alike), else 1."""
    scales = params.get("bytes_scale", {})
    if bytes_key(run) in scales:
        return scales[bytes_key(run)]
    same = [value for key, value in scales.items() if key[0] == run.algorithm]
    return float(statistics.median(same)) if same else 1.0


def predict_diloco(run: Run, params: dict, sync_every: int, outer: str,
                   with_extra: bool = True) -> dict:
    """DiLoCo's mean inner step for ``run``'s cluster, model and link under the fitted
    parameters: DDP inside each node every step, ``outer`` across nodes every ``sync_every``
    steps (:func:`thinwire.sim.diloco.simulate_diloco`), plus DiLoCo's own cost where the
    calibration's DiLoCo runs fitted one (``params["diloco_extra"]``,
    :mod:`thinwire.sim.diloco_fit`; ``with_extra=False``: without it)."""
    from thinwire.sim.diloco import simulate_diloco

    compute_s = params["compute_s"][run.setting_index]
    slowdown = compute_s / params.get("reference_compute_s", min(params["compute_s"]))
    rate = params["sparse_rate"] / slowdown
    rates = SparseRates(rate, rate, params["sparse_alpha_s"] * slowdown)
    cfg = AlgorithmConfig(outer, density=run.density, wire=run.wire)
    row = simulate_diloco(_timed(run.layers, compute_s), Cluster(run.nodes, run.ranks_per_node),
                          network_for(params, run.inter_bps,
                                      nominal_rate=paces_datagrams(outer)), cfg, rates,
                          sync_every=sync_every)
    extra_s = diloco_extra_s(params, slowdown, 1.0 / sync_every) if with_extra else 0.0
    return _with_step_extra(row, extra_s) if extra_s else row


def diloco_extra_s(params: dict, slowdown: float, outer_share: float) -> float:
    """DiLoCo's fitted cost per inner step at ``outer_share`` outer steps a step (1/H over a
    long run): ``slowdown * (per_step_s + per_outer_step_s * outer_share)``; 0 unfitted."""
    extra = params.get("diloco_extra")
    if not extra:
        return 0.0
    return slowdown * (extra["per_step_s"] + extra["per_outer_step_s"] * outer_share)


def _modelled_inter_mb(run: Run) -> float:
    """The model's inter-node MB per step of ``run`` (volumes do not depend on the fit)."""
    params = dict(zip(FIT_NAMES, START), compute_s=[1.0], phase_form="sum")
    placed = dataclasses.replace(run, setting_index=0)
    return predict(placed, params, overlap=False)["inter_node_mb_per_iter"]


def predict(run: Run, params: dict, overlap: bool | str = True) -> dict:
    compute_s = params["compute_s"][run.setting_index]
    # Selection is CPU/GPU work of the rank: it slows down with compute where ranks share the
    # host's cores (the emulator). The fitted rate is that of the fastest setting.
    slowdown = compute_s / params.get("reference_compute_s", min(params["compute_s"]))
    rate = params["sparse_rate"] / slowdown
    rates = SparseRates(rate, rate, params["sparse_alpha_s"] * slowdown)
    layers = _timed(run.layers, compute_s)
    net = network_for(params, run.inter_bps, bytes_scale_of(params, run), paced(run))
    if run.modelled_as == "powersgd":  # never overlaps: the hook waits for each bucket on gloo
        row = powersgd.simulate(layers, run.shapes, Cluster(run.nodes, run.ranks_per_node),
                                net, run.powersgd_rank,
                                params.get("pass_rate", START[-1]) / slowdown)
        return _floored(_with_step_extra(
            row, params.get("step_extra_s", {}).get(run.algorithm, 0.0) * slowdown),
            params, run)
    if overlap == "hooks":
        overlap = run.algorithm in ALGORITHM_ALIASES  # DDP's own all-reduce, the fp16 hook
    cfg = AlgorithmConfig(run.modelled_as, density=run.density, wire=run.wire,
                          sparse_wire=run.sparse_wire)
    row = simulate(layers, Cluster(run.nodes, run.ranks_per_node), net, cfg, rates,
                   overlap=overlap)
    return _floored(_with_step_extra(row, params.get("step_extra_s", {}).get(run.algorithm, 0.0)
                                     * slowdown), params, run)


def _floored(row: dict, params: dict, run: Run) -> dict:
    """``row`` with its step no shorter than the setting's measured host CPU floor
    (:func:`cpu_floors`), the extra time counted as synchronisation."""
    floor = cpu_floor_of(params, run)
    if floor is None or floor <= row["iteration_s"]:
        return row
    row = dict(row, sync_s=row["sync_s"] + floor - row["iteration_s"], iteration_s=floor,
               cpu_floor_s=floor)
    row["scaling_efficiency"] = row["compute_s"] / row["iteration_s"]
    return row


def _with_step_extra(row: dict, extra_s: float) -> dict:
    """``row`` with the algorithm's fitted fixed cost per step added: work of its hook that
    the phases do not model (Ok-Topk's threshold estimation, DLCP's datagram handling), paid
    once a step at any link rate (CPU work: it slows with compute on shared cores)."""
    if extra_s:
        row = dict(row, iteration_s=row["iteration_s"] + extra_s,
                   sync_s=row["sync_s"] + extra_s, step_extra_s=extra_s)
        row["scaling_efficiency"] = row["compute_s"] / row["iteration_s"]
    return row


def _unpack(x: np.ndarray, form: str = "sum", measured: dict | None = None,
            extras: dict | None = None) -> dict:
    """The parameters ``x`` holds (logs), with what the runs measured directly
    (MEASURED_TERMS) and the algorithms' fitted constants."""
    values = np.exp(x)
    params = dict(zip(FIT_NAMES, values[:len(FIT_NAMES)]))
    params["compute_s"] = list(values[len(FIT_NAMES):])
    params["phase_form"] = form
    for name in MEASURED_TERMS:
        params[name] = dict((measured or {}).get(name, {}))
    params["step_extra_s"] = dict(extras or {})
    return params


# terms each setting's runs measured, not fitted: its bytes' framing (:func:`bytes_scales`)
# and its host CPU floor (:func:`cpu_floors`, in units of compute: set after the fit)
MEASURED_TERMS = ("bytes_scale", "cpu_floor")


def _residuals(x, runs, overlap, form="sum", measured=None, extras=None):
    params = _unpack(x, form, measured, extras)
    out = list(_residuals_of(runs, params, overlap))
    out.append(PRIOR_WEIGHT * math.log(params["inter_efficiency"] / PRIOR_EFFICIENCY))
    out.append(PRIOR_INTRA_WEIGHT * math.log(params["intra_alpha_s"] / PRIOR_INTRA_ALPHA_S))
    return np.array(out)


def fit(runs: list[Run], overlap: bool = True, form: str = "sum",
        step_extra: bool = True, cpu_floor: bool = True) -> tuple[dict, float]:
    """Least-squares parameters for ``runs`` and the final sum of squared residuals.
    ``form``: how a phase's fixed cost and wire time combine (``thinwire.sim.network``);
    ``step_extra``: then fit each algorithm's unexplained fixed cost per step;
    ``cpu_floor``: then take each setting's measured CPU floor (off: to measure what it adds).
    The sum of squares returned is the fit's, before the floors join."""
    if form not in PHASE_FORMS:
        raise ValueError(f"form must be one of {', '.join(PHASE_FORMS)}, got {form!r}")

    settings = max(r.setting_index for r in runs) + 1
    measured = {"bytes_scale": bytes_scales(runs)}
    compute0 = [0.8 * min(r.iteration_s for r in runs if r.setting_index == s)
                for s in range(settings)]
    lower = np.log(np.array(list(LOWER) + [COMPUTE_RANGE[0]] * settings))
    upper = np.log(np.array(list(UPPER) + [COMPUTE_RANGE[1]] * settings))
    if not host_may_pace(runs):  # hold the host's time per byte at its floor (~0)
        host = FIT_NAMES.index("inter_host_s_per_byte")
        upper[host] = lower[host] + 1e-6
    best = None
    # Under the max form a fixed cost hidden behind the wire has no gradient (the larger term
    # alone sets the time), so a fit that starts below it never finds it: start it from a
    # few magnitudes, keep the best.
    for inter_alpha in (START[0],) if form == "sum" else MAX_FORM_ALPHA_STARTS:
        start = list(START)
        start[FIT_NAMES.index("inter_alpha_s")] = inter_alpha
        x0 = np.clip(np.log(np.array(start + compute0)), lower + 1e-9, upper - 1e-9)
        x, sse = _fit_shared(x0, runs, overlap, form, measured, {}, (lower, upper), 400)
        if best is None or sse < best[1]:
            best = (x, sse)
    x, sse = best
    extras = {}
    # then each algorithm's unexplained constant, and the shared parameters again with those
    # constants in place (a constant one algorithm needs must not bend what all share)
    for _ in range(EXTRA_ROUNDS if step_extra else 0):
        # against the shared parameters alone: the constants are refitted whole each round
        # (against predictions that held last round's, they would come out as the change)
        extras = _step_extras(runs, _unpack(x, form, measured, {}), overlap)
        x, sse = _fit_shared(x, runs, overlap, form, measured, extras, (lower, upper),
                             REFIT_EVALUATIONS)
    # The CPU floors, in units of the compute just fitted, join only now: fitted beside the
    # constants, a floor took the place of a constant paid in series with the wire (Ok-Topk's
    # threshold work: at 1 Gbit/s its step is CPU-bound either way), and the slower rates,
    # where the wire adds to that work instead of hiding it, came out up to 33% short.
    measured = dict(measured, cpu_floor=cpu_floors(runs, _unpack(x, form)["compute_s"])
                    if cpu_floor else {})
    params = _unpack(x, form, measured, extras)
    if not intra_node_seen(runs):  # no run depended on the node-local link: set it, not fitted
        params.update(UNSEEN_INTRA)
    return params, sse


def intra_node_seen(runs: list[Run]) -> bool:
    """Whether any of ``runs`` sends over the node-local link: several ranks on a node, or an
    unshaped run (whose nodes the model joins with that link too). Where none does (every
    run 4 x 1 and shaped), nothing in the runs depends on that link's latency and rate, and
    the fit left them wherever it stopped: on the MNIST 4 x 1 sweeps the rate came out at
    4 MB/s from 200 Mbit/s, and the unshaped ddp step 37x too long, and at its bound (1e12 B/s,
    a link that costs nothing) from 50 Mbit/s and 1 Gbit/s. Set to UNSEEN_INTRA after the fit
    instead (held inside it by bounds, the optimiser took minutes over the empty direction)."""
    return any(r.ranks_per_node > 1 or r.inter_bps is None for r in runs)


def host_may_pace(runs: list[Run]) -> bool:
    """Whether the host's time per inter-node byte is fitted on ``runs``: where the fidelity
    monitor found every run's pace set by its link, the host's share of a byte's time is a few
    percent of the wire's, below the runs' noise, and a free host term took that noise (fitted
    at 50 Mbit/s on the recorded sweeps it came out between a quarter of and 20 times what
    their faster rates showed, and carried that to them); the goodput takes the whole byte
    there. Runs without a verdict (files from elsewhere) leave it to the fit."""
    verdicts = [r.extra["fidelity"] for r in runs if "fidelity" in r.extra]
    return not verdicts or any(v != "link" for v in verdicts)


def _fit_shared(x0, runs, overlap, form, measured, extras, bounds, evaluations) -> tuple:
    from scipy.optimize import least_squares

    args = (runs, overlap, form, measured, extras)
    result = least_squares(_residuals, x0, args=args, method="trf", bounds=bounds,
                           x_scale=1.0, diff_step=1e-4, max_nfev=evaluations * len(x0),
                           **({"loss": SHARED_LOSS, "f_scale": SHARED_LOSS_SCALE}
                              if SHARED_LOSS != "linear" else {}))
    data = _residuals(result.x, *args)[:-PRIORS]  # the runs' residuals, without the priors
    return result.x, float(data @ data)


def _step_extras(runs: list[Run], params: dict, overlap) -> dict:
    """Each algorithm's fixed cost per step that the shared fit leaves unexplained: the least-
    squares constant (>= 0) over its runs' iteration times, with the shared parameters held.
    Fitted after them, never with them: at one link rate a constant and the wire time are
    indistinguishable, and a free constant per algorithm would take the goodput's place. For
    the same reason only runs whose wire takes less than WIRE_BOUND_SHARE of the step count:
    where the wire is most of the step, an error is the wire's (its goodput), not a constant's.
    """
    extras = {}
    for name in sorted({r.algorithm for r in runs}):
        own = [r for r in runs if r.algorithm == name
               and wire_share(r, params, overlap) < WIRE_BOUND_SHARE]
        if not own:  # wire-bound at every calibration rate: its error is taken as the wire's
            continue
        slowdowns = [params["compute_s"][r.setting_index]
                     / params.get("reference_compute_s", min(params["compute_s"])) for r in own]
        # iteration residual r_i = (p_i + e * s_i) / m_i - 1: linear in e
        a = np.array([s / r.iteration_s for r, s in zip(own, slowdowns)])
        b = np.array([1 - predict(r, params, overlap)["iteration_s"] / r.iteration_s
                      for r in own])
        extras[name] = float(min(max(a @ b / (a @ a), 0.0), STEP_EXTRA_MAX_S))
    return extras


def refit_step_extras(runs: list[Run], params: dict, overlap) -> dict:
    """``params`` with each algorithm's fixed cost per step fitted again on ``runs``, the
    shared parameters held (as :func:`fit` derives them): where a shared parameter changed
    after the fit (the plan's intra-node rate from a probe), the constants fitted against
    the old value would keep the time it charged."""
    # against the shared parameters alone, without the CPU floors, as fit() derives them
    return dict(params, step_extra_s=_step_extras(
        runs, dict(params, step_extra_s={}, cpu_floor={}), overlap))


def wire_share(run: Run, params: dict, overlap) -> float:
    """The share of ``run``'s measured step that its inter-node bytes take on the wire. The
    host's time per byte is not counted: it is the host's CPU work, of a kind with the
    algorithm's own constant. (Counted, it left ddp, whose 10 MB a step cost the LM's runs at
    1 Gbit/s about as much host time as wire time, without its constant, and the plan ranked it
    ahead of ddp-fp16 there, which ran 8-11% faster a step at four seeds: tests hold the rule.)"""
    if run.inter_bps is None:
        return 0.0
    return wire_s(run, predict(run, params, overlap), params) / run.iteration_s


def wire_bound_algorithms(runs: list[Run], params: dict, overlap,
                          algorithms=None) -> list[str]:
    """The algorithms (of ``algorithms``, None: all) whose every run among ``runs`` spent at
    least WIRE_BOUND_SHARE of its step on the wire (an unshaped run spends none): the fit takes
    no fixed cost per step of theirs from such runs (:func:`_step_extras`), so one they have
    is missing from their predictions on faster links. A CPU floor (:func:`cpu_floors`) does
    not clear them: it carries the host work where a faster step is the host's alone, and on
    the recorded sweeps misses of 21-28% remained beside it where the step was not."""
    shares = defaultdict(list)
    for run in runs:
        if algorithms is None or run.algorithm in algorithms:
            shares[run.algorithm].append(wire_share(run, params, overlap))
    return sorted(name for name, own in shares.items() if min(own) >= WIRE_BOUND_SHARE)


def _residuals_of(runs: list[Run], params: dict, overlap) -> np.ndarray:
    out = []
    for run in runs:
        row = predict(run, params, overlap)
        out.append(row["iteration_s"] / run.iteration_s - 1)
        if run.compute_s is not None:
            out.append((row["compute_s"] - run.compute_s) / run.iteration_s)
        if run.hook_s is not None:
            out.append((row["sync_s"] - run.hook_s) / run.iteration_s)
    return np.array(out)


def floors_line(fitted: dict) -> str | None:
    """The fitted CPU floors (``fitted["cpu_floor"]``, :func:`scales_json` rows) as the line
    `thinwire simulate` prints; None where there are none."""
    rows = fitted.get("cpu_floor", [])
    if not rows:
        return None
    # an algorithm measured at several settings (densities, ranks, clusters) shows each, by
    # the settings that tell its rows apart
    floors = {}
    for row in rows:
        mine = [r for r in rows if r["algorithm"] == row["algorithm"]]
        apart = [k for k in SETTING_NAMES[1:] if len({str(r[k]) for r in mine}) > 1]
        label = " ".join([row["algorithm"]] + [f"{k}={row[k]}" for k in apart])
        floors[label] = round(row["floor_x_compute"], 2)
    return f"CPU floor a step (x the step's compute; the ranks' CPU time over the cores they " \
           f"share): {floors}"


def scales_json(scales: dict, value: str = "scale") -> list[dict]:
    """A term keyed per setting (:func:`bytes_key`: the bytes scales, the CPU floors) as JSON
    rows, the term's value under ``value`` (the keys are tuples)."""
    return [{**dict(zip(SETTING_NAMES, key)), value: float(number)} for key, number in sorted(
        scales.items(), key=lambda item: tuple(map(str, item[0])))]


def calibrate(paths, overlap: str = "hooks", form: str = "sum") -> dict:
    """Fit on the runs of ``paths`` and report predicted against measured per run.
    ``overlap``: a key of OVERLAP_MODES; ``form``: one of PHASE_FORMS."""
    modes = overlap_modes(overlap)
    runs, skipped = read_runs(paths)
    fits = [(fit(runs, mode, form), mode) for mode in modes]
    (params, sse), mode = min(fits, key=lambda item: item[0][1])
    rows = []
    for run in runs:
        row = predict(run, params, mode)
        rows.append({
            "algorithm": run.algorithm, "modelled_as": run.modelled_as, "nodes": run.nodes, "ranks_per_node": run.ranks_per_node,
            "inter_node_bandwidth_bps": run.inter_bps, "model": run.layers_key,
            "measured_s": run.iteration_s, "predicted_s": row["iteration_s"],
            "error": row["iteration_s"] / run.iteration_s - 1,
            "measured_compute_s": run.compute_s, "predicted_compute_s": row["compute_s"],
            "measured_hook_ms": None if run.hook_s is None else run.hook_s * 1e3,
            "predicted_hook_ms": row["sync_s"] * 1e3,
            "predicted_inter_node_mb_per_iter": row["inter_node_mb_per_iter"],
            **({"measured_inter_node_mb_per_iter": run.extra["inter_node_mb_per_iter"]}
               if "inter_node_mb_per_iter" in run.extra else {}),
            "source": run.source,
        })
    worst = max(abs(r["error"]) for r in rows)
    fitted = {k: float(v) for k, v in params.items()
              if k not in ("compute_s", "phase_form", "step_extra_s") + MEASURED_TERMS}
    fitted["step_extra_s"] = dict(params["step_extra_s"])
    fitted["compute_s_per_setting"] = [float(v) for v in params["compute_s"]]
    fitted["bytes_scale"] = scales_json(params["bytes_scale"])
    fitted["cpu_floor"] = scales_json(params["cpu_floor"], "floor_x_compute")
    return {"fitted": fitted, "overlap": mode_name(mode), "phase_form": form,
            "sum_sq_residuals": sse,
            "max_abs_error": float(worst), "within_20pct": bool(worst <= 0.20), "runs": rows,
            "skipped": skipped}
