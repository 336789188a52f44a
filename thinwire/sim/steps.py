"""Steps to target, measured once per workload: the table `thinwire plan` multiplies by the cost
model's step time.

A run's steps to target do not depend on the link it ran over: the same configuration trains
the same way at 50 Mbit/s and unshaped (on the MNIST sweep every algorithm took the same steps
at all three rates). So any ``thinwire compare`` results file is a table of steps to target -
the fastest to measure is an unshaped race (``--inter-node-bandwidth none``) - and repeating a
race with other ``--seed`` values measures the estimate's error: the spread of a candidate's
steps over seeds, reported beside it. Steps are read from a run's evaluation curve (the first
evaluation at or past the target), so they are late by at most one evaluation interval.

A candidate is identified by its algorithm and the synchronisation settings that apply to it
(density, wires, selector, PowerSGD's rank, DiLoCo's H, ...), within one workload: the model,
its batch per rank, learning rate, optimizer, target and the cluster's shape (hierarchical
algorithms select per node, so 2 x 2 and 4 x 1 are measured apart).
"""

from __future__ import annotations

import dataclasses

import statistics
from dataclasses import dataclass, field

from thinwire.train import modes, quality, race_config, settings, workloads
from thinwire.train.race_config import TRAIN_FIELDS

# The settings that can change how many steps a run needs (what it sends and how it steps);
# the others (checkpoints, logging, timeouts) cannot.
IDENTITY_CONCERNS = ("sync", "diloco", "waves")
WORKLOAD_FIELDS = ("model", "batch_size", "lr", "optimizer", "momentum", "weight_decay",
                   "epochs", "amp", "warmup_steps")


@dataclass(frozen=True)
class Workload:
    """What a steps table is valid for."""
    workload: str
    metric: str
    target: float
    nodes: int
    ranks_per_node: int
    training: tuple  # ((name, value), ...) of WORKLOAD_FIELDS

    def describe(self) -> str:
        return (f"{self.workload} ({self.metric} to {self.target:g}) on {self.nodes} x "
                f"{self.ranks_per_node}")


@dataclass(frozen=True)
class Candidate:
    """An algorithm with the synchronisation settings that apply to it."""
    algorithm: str
    options: tuple = ()  # ((setting name, value), ...) that apply and differ from the default

    @property
    def settings(self) -> dict:
        return dict(self.options)

    def label(self) -> str:
        short = {"density": "d", "sparse_wire": "values", "wire": "wire", "selector": "",
                 "powersgd_rank": "rank", "sync_every": "H", "outer_algorithm": "outer"}
        parts = [f"{short.get(k, k)}={v}" if short.get(k, k) else str(v)
                 for k, v in self.options]
        return " ".join([self.algorithm] + parts)


@dataclass
class Entry:
    candidate: Candidate
    by_seed: dict = field(default_factory=dict)  # seed -> steps of its runs that reached it
    missed: list = field(default_factory=list)   # steps of runs that ended before the target
    sources: list = field(default_factory=list)
    eval_every: int = 0

    def add(self, seed: int, steps: int | None, ran: int) -> None:
        if steps is None:
            self.missed.append(ran)
        else:
            self.by_seed.setdefault(seed, []).append(steps)

    @property
    def steps(self) -> list:
        return [s for values in self.by_seed.values() for s in values]

    @property
    def seeds(self) -> set:
        return set(self.by_seed)

    def _per_seed(self) -> list:
        # a seed's repeats (the same race at other rates) count once: they train alike
        return [statistics.median(v) for v in self.by_seed.values()]

    @property
    def estimate(self) -> float | None:
        return float(statistics.median(self._per_seed())) if self.by_seed else None

    @property
    def spread(self) -> float | None:
        """(max - min) / median of the seeds' steps: the estimate's error as the seeds
        measured it (0 with one seed)."""
        if not self.by_seed:
            return None
        per_seed = self._per_seed()
        return (max(per_seed) - min(per_seed)) / statistics.median(per_seed)

    def row(self) -> dict:
        return {"candidate": self.candidate.label(), "algorithm": self.candidate.algorithm,
                "settings": self.candidate.settings, "steps": self.estimate,
                "steps_by_seed": {str(k): sorted(v) for k, v in sorted(self.by_seed.items())},
                "spread": self.spread, "missed_at": sorted(self.missed),
                "resolution_steps": self.eval_every}


def run_config(setting: dict, raw: dict):
    """(the run's workload, the TrainConfig compare ran ``raw`` with: its race's ``setting``
    and its own keys)."""
    merged = {**setting, **(raw.get("setting") or {}), **raw}
    workload = merged.get("workload")
    if workload not in workloads.WORKLOADS:
        raise ValueError(f"not a thinwire compare run (workload {workload!r})")
    missing = [key for key in ("algorithm", "nodes", "ranks_per_node") if merged.get(key) is None]
    if missing:
        raise ValueError(f"not a thinwire compare run (no {', '.join(missing)})")
    base = race_config.base_config(workload, {})
    train = {name: merged[name] for name in TRAIN_FIELDS
             if name in merged and merged[name] != getattr(base, name)
             and name not in ("algorithm_options",)}
    cfg = race_config.run_config(workload, raw["algorithm"], train,
                                 ranks_per_node=int(merged["ranks_per_node"]),
                                 target=merged.get("target"), lr=merged.get("lr"),
                                 seed=merged.get("seed"))
    return workload, int(merged["nodes"]), cfg


# shown even at their default (a density is what a reader looks for first)
ALWAYS_SHOWN = ("density", "powersgd_rank", "sync_every")


def candidate_of(cfg) -> Candidate:
    options = tuple((s.name, getattr(cfg, s.name)) for s in settings.SETTINGS
                    if s.concern in IDENTITY_CONCERNS and s.name != "algorithm"
                    and (getattr(cfg, s.name) != s.default or s.name in ALWAYS_SHOWN)
                    and (s.applies is None or s.applies(cfg)))
    return Candidate(cfg.algorithm, options)


def workload_of(workload: str, nodes: int, cfg) -> Workload:
    metric = workloads.WORKLOADS[workload].metric
    target = cfg.target_accuracy if metric == "test_accuracy" else cfg.target_bits_per_byte
    return Workload(workload, metric, target, nodes, cfg.ranks_per_node,
                    tuple((name, getattr(cfg, name)) for name in WORKLOAD_FIELDS))


def chooses(algorithm) -> bool:
    """A run of a mode that chooses its algorithm when it starts (``auto``): not a candidate."""
    try:
        return modes.mode_of(algorithm).resolve is not None
    except ValueError:
        return False


def steps_to_target(curve: list, metric: str, target: float) -> int | None:
    m = quality.check_metric(metric)
    for point in curve or []:
        if m.reached(point.get(metric), target) and point.get("step") is not None:
            return int(point["step"])
    return None


def read_table(paths, steps_to: float | None = None) -> tuple[dict, list[str]]:
    """{Workload: {Candidate: Entry}} from compare results files, and a note per run left out.
    ``steps_to``: read steps to this quality instead of each race's target (what a table for
    another target would say; only runs that trained past it, ``--no-stop-at-target``, reach
    it: the others count as missing it)."""
    from thinwire.sim.calibrate import result_blocks

    table, notes = {}, []
    for path in paths:
        for block in result_blocks(path, "steps table (thinwire compare results)"):
            setting = block.get("setting") if isinstance(block.get("setting"), dict) else {}
            for i, raw in enumerate(block["runs"]):
                where = f"{path} run {i} ({raw.get('algorithm')})"
                if raw.get("status") != "ok":
                    notes.append(f"{where}: status {raw.get('status')!r}")
                    continue
                if chooses(raw.get("algorithm")):
                    notes.append(f"{where}: chose its algorithm when it started (its steps "
                                 f"are those of its choice, {(raw.get('auto') or {}).get('choice')})")
                    continue
                try:
                    workload, nodes, cfg = run_config(setting, raw)
                except (ValueError, KeyError, TypeError) as exc:
                    notes.append(f"{where}: {exc}")
                    continue
                work = workload_of(workload, nodes, cfg)
                if steps_to is not None:
                    work = dataclasses.replace(work, target=steps_to)
                cand = candidate_of(cfg)
                entry = table.setdefault(work, {}).setdefault(cand, Entry(cand))
                steps = steps_to_target(raw.get("curve"), work.metric, work.target)
                entry.add(cfg.seed, steps, int(raw.get("steps") or 0))
                entry.sources.append(str(path))
                entry.eval_every = max(entry.eval_every, int(cfg.eval_every or 0))
    return table, notes


def entries_for(table: dict, workload: str, nodes: int, ranks_per_node: int) -> tuple:
    """The entries measured for ``workload`` on ``nodes`` x ``ranks_per_node`` (the one such
    table; several mean the files mix trainings - say which)."""
    found = [(w, e) for w, e in table.items()
             if (w.workload, w.nodes, w.ranks_per_node) == (workload, nodes, ranks_per_node)]
    if not found:
        have = sorted({w.describe() for w in table})
        raise ValueError(f"no steps to target measured for {workload} on {nodes} x "
                         f"{ranks_per_node} (the steps files hold: {have or 'nothing'}); "
                         f"measure them with: thinwire compare --workload {workload} --nodes "
                         f"{nodes} --ranks-per-node {ranks_per_node} --inter-node-bandwidth none "
                         f"--out DIR")
    if len(found) > 1:
        raise ValueError(f"the steps files hold {len(found)} different trainings of {workload} "
                         f"on {nodes} x {ranks_per_node} (model, batch, lr, ... differ): "
                         + "; ".join(str(dict(w.training)) for w, _ in found))
    return found[0]


def merged_spread(entries) -> float | None:
    """The largest spread over the candidates measured with more than one seed."""
    spreads = [e.spread for e in entries if len(e.seeds) > 1 and e.spread is not None]
    return max(spreads) if spreads else None


__all__ = ["Candidate", "Entry", "Workload", "candidate_of", "entries_for", "merged_spread",
           "read_table", "run_config", "steps_to_target", "workload_of"]
