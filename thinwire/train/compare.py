"""`thinwire compare`: a time-to-target race of every algorithm on the emulated cluster.

Each (link rate, algorithm) is one `python -m thinwire.train --config FILE` job launched by
`thinwire.cluster.run`: FILE is the run's whole TrainConfig (the workload's, the user's
overrides, and what compare decides per run), so compare never re-declares the training options.
Every run trains until it reaches the target quality or exhausts the training-time budget,
evaluating every few steps (evaluation time is not training time). Its result goes to
`DIR/runs/<algorithm>@<rate>.json` (temp file + rename) as soon as it ends, together with the
setting it ran under; a re-run of an interrupted compare skips every run whose file exists with
the same setting. Each job's output goes to `DIR/logs/`, its metrics to `DIR/runs/*.jsonl`.

With `tune`, every algorithm first trains once per learning rate of the same grid on another
seed (same budget and target); the rate that reached the target soonest (else the best quality
at the budget) is the one its reported run uses: every method gets the same tuning budget.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import math
import os
import sys
import threading
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from thinwire.output import write_json_atomic
from thinwire.cluster import ClusterSpec, missing_requirements, parse_rate
from thinwire.cluster import run as cluster_run
from thinwire.cluster.launch import EXIT_TIMEOUT
from thinwire.train import (data, grad_sync, models, modes, quality, race_config, report,
                            settings, workloads)
from thinwire.train.config import TrainConfig
from thinwire.train import auto  # noqa: F401  (registers --algorithm auto)

log = logging.getLogger("thinwire.compare")

POWERSGD_START_ITER = grad_sync.POWERSGD_START_ITER
# A compare run writes a metrics line every step; its slowest steps (the LM's, an evaluation)
# take seconds, its start (imports, data, compute probe) well under a minute on 2 cores.
DEFAULT_STALL_S = 300.0


def default_algorithms(fault_tolerant: bool = False) -> list[str]:
    """PyTorch's peers, then every algorithm in thinwire's registry (read when needed, so an
    algorithm registered later is raced too). DiLoCo's modes are raced when named (each
    needs --sync-every). ``fault_tolerant``: the ones fault-tolerant training runs."""
    if fault_tolerant:
        from thinwire.ft.per_step import ALGORITHMS

        return [name for name in ALGORITHMS if name in algorithm_names()]
    names = [n for mode in modes.MODES if mode.in_default_race for n in mode.algorithms()]
    return sorted(names, key=lambda name: name not in grad_sync.TORCH_ALGORITHMS)  # stable


def algorithm_names() -> tuple[str, ...]:
    """Every name ``--algorithms`` takes: every mode's (thinwire.train.modes)."""
    return modes.algorithm_names()


DEFAULT_RATE = "200mbit"  # ddp spends most of its step on the wire here (docs/benchmarks.md)
DEFAULT_LR_GRID = (0.5, 1.0, 2.0)  # multiples of the workload's learning rate
# what compare sets per run, and what the user may override (thinwire.train.race_config)
PER_RUN, TRAIN_FIELDS = race_config.PER_RUN, race_config.TRAIN_FIELDS


@dataclass
class CompareSettings:
    workload: str = "mnist"
    algorithms: list = field(default_factory=default_algorithms)
    rates: list = field(default_factory=lambda: [DEFAULT_RATE])
    nodes: int = 2
    ranks_per_node: int = 2
    shaping: bool = True
    target: float | None = None      # None: the workload's
    budget_s: float | None = None    # None: the workload's; 0: no budget (the whole schedule)
    eval_every: int = 0              # steps; 0: the workload's
    stop_at_target: bool = True
    tune: bool = False
    lr_grid: tuple = DEFAULT_LR_GRID
    timeout_s: float = 1800.0
    # A run whose metrics file shows no new step or evaluation for this long is stopped and
    # reported as failed (the rest of the race goes on); its log gets the ranks' stacks.
    stall_s: float = DEFAULT_STALL_S
    train: dict = field(default_factory=dict)  # TrainConfig overrides (TRAIN_FIELDS)
    # Node CPU/memory budgets and link priority classes: ClusterSpec keyword arguments
    # (node_cpus, node_memory, best_effort_limits, link_classes, class_queue); {} = none.
    resources: dict = field(default_factory=dict)

    @property
    def fault_tolerant(self) -> bool:
        """Every run on the fault-tolerant loop (`thinwire train --fault-tolerant`), each node
        its own world, so that the race goes on through `--fail`'s outages."""
        return bool(self.resources.get("fault_tolerant"))

    def _check_cluster(self) -> None:
        """The shape, and the resources at every rate raced (checked at one rate, a schedule
        beside an unshaped rate failed at its run, after the others), named by their flags; a
        check that fails at some rates only says at which."""
        from thinwire.options import checked_as_flags

        fields = [f.name for f in dataclasses.fields(ClusterSpec)]
        failed = {}
        for rate in self.rates:
            try:
                checked_as_flags(lambda: ClusterSpec(
                    nodes=self.nodes, ranks_per_node=self.ranks_per_node,
                    inter_node_bandwidth=None if rate == "none" else rate,
                    shaping=self.shaping or not self.resources, **self.resources),
                    fields, {"failure_schedule": "--fail", "shaping": "--no-shaping"})
            except ValueError as exc:
                failed[rate] = str(exc)
        if failed:
            rate, message = next(iter(failed.items()))
            raise ValueError(message if len(failed) == len(self.rates) else
                             f"--inter-node-bandwidth {rate}: {message}")

    def validate(self) -> "CompareSettings":
        wl = workloads.check_workload(self.workload)
        if self.resources.get("max_restarts"):
            raise ValueError(f"--max-restarts {self.resources['max_restarts']}: compare races "
                             f"through failures with --fault-tolerant; checkpoint-restart, its "
                             f"baseline, is raced by `thinwire bench ft-cluster`")
        if self.fault_tolerant:
            self._check_fault_tolerant()
        if not self.algorithms:
            raise ValueError("--algorithms must name at least one algorithm")
        for name in self.algorithms:
            if name not in algorithm_names():
                raise ValueError(f"--algorithms: unknown algorithm {name!r}; allowed: "
                                 f"{', '.join(algorithm_names())}")
        if len(set(self.algorithms)) != len(self.algorithms):
            raise ValueError(f"--algorithms lists an algorithm twice: {self.algorithms}")
        unknown = sorted(set(self.train) - set(TRAIN_FIELDS))
        if unknown:
            raise ValueError(f"training settings compare cannot take: {unknown}; allowed: "
                             f"{', '.join(TRAIN_FIELDS)}")
        quality.check_target(wl.metric, self.resolved_target(), "--target")
        quality.check_budget(self.resolved_budget())
        if isinstance(self.eval_every, bool) or not isinstance(self.eval_every, int) \
                or self.eval_every < 0:
            raise ValueError(f"--eval-every must be an integer >= 0, got {self.eval_every!r}")
        if (self.tune and not self.lr_grid) or not all(
                isinstance(m, (int, float)) and not isinstance(m, bool) and math.isfinite(m)
                and m > 0 for m in self.lr_grid):
            raise ValueError(f"--lr-grid must list finite numbers > 0, got {self.lr_grid!r}")
        if len(set(self.lr_grid)) != len(self.lr_grid):
            raise ValueError(f"--lr-grid lists a multiple twice: {self.lr_grid!r}")
        if not self.rates:
            raise ValueError("--inter-node-bandwidth needs at least one rate")
        seen = {}
        for rate in self.rates:  # one race a rate: a rate spelt twice would race twice
            bps = None if rate == "none" else parse_rate(rate, "--inter-node-bandwidth")
            if bps in seen:
                raise ValueError(f"--inter-node-bandwidth lists one rate twice: {seen[bps]!r} "
                                 f"and {rate!r}")
            seen[bps] = rate
        if not self.timeout_s > 0:
            raise ValueError(f"--timeout must be > 0 seconds, got {self.timeout_s!r}")
        if isinstance(self.stall_s, bool) or not isinstance(self.stall_s, (int, float)) \
                or not math.isfinite(self.stall_s) or self.stall_s <= 0:
            raise ValueError(f"--stall-timeout must be a number of seconds > 0, got "
                             f"{self.stall_s!r}")
        self._check_cluster()
        base = self.base_config()
        from thinwire.train.loop import check_device  # the ranks run on this host
        check_device(base)
        language = models.data_name(base.model) in ("stdlib_text",)
        if language != (wl.metric == "bits_per_byte"):
            raise ValueError(f"--model {base.model} does not fit workload {wl.name} "
                             f"(judged by {wl.metric})")
        used, configs = set(), []
        for algorithm in self.algorithms:  # every run's config, checked before the first runs
            try:  # a fault-tolerant run's config checks what that loop can run
                cfg = self.run_config(algorithm).validate()
                for multiple in self.lr_grid if self.tune else ():  # what tuning will try
                    knob = tuned_setting(algorithm)
                    try:
                        dataclasses.replace(cfg, **{knob: getattr(cfg, knob) * multiple}
                                            ).validate()
                    except ValueError as exc:
                        raise ValueError(f"--tune tries {knob} x {multiple:g} for "
                                         f"{algorithm}: {exc}") from None
            except ValueError as exc:
                if not self.fault_tolerant:
                    raise
                raise ValueError(f"--fault-tolerant: the run of {algorithm}: {exc}") from None
            configs.append(cfg)
            used.update(modes.mode_of(algorithm).collectives(cfg))
        race = f"(--algorithms {','.join(self.algorithms)})"
        for name in sorted(set(base.algorithm_options) - used):
            raise ValueError(f"--algorithm-option {name}:...: no run of this race uses {name} "
                             f"{race}")
        for name, value in self.train.items():  # a setting the user gave, used by no run
            setting = settings.BY_NAME.get(name)
            if setting is not None and setting.applies is not None and \
                    all(getattr(cfg, name) != value for cfg in configs):
                raise ValueError(f"{setting.cli_flag} applies to {setting.applies_text}; no run "
                                 f"of this race uses it {race}")
        return self

    def resolved_target(self) -> float:
        return workloads.WORKLOADS[self.workload].target if self.target is None else self.target

    def resolved_budget(self) -> float:
        if self.fault_tolerant:  # a node's clock is its own: the runs stop at the target
            return 0.0
        wl = workloads.WORKLOADS[self.workload]
        return wl.budget_s if self.budget_s is None else self.budget_s

    def _check_fault_tolerant(self) -> None:
        """What a race through failures cannot take, refused by name."""
        if self.budget_s:
            raise ValueError(f"--budget-s {self.budget_s:g} cannot be used with "
                             f"--fault-tolerant: each node keeps its own training clock, so "
                             f"the runs stop at the target or the end of their schedule")
        if self.tune:
            raise ValueError("--tune cannot be used with --fault-tolerant: the trials are "
                             "told apart by their quality at the budget, and a race through "
                             "failures has none")
        if self.resources.get("failure_schedule"):
            from thinwire.cluster.spec import parse_failure_schedule

            events = parse_failure_schedule(self.resources["failure_schedule"], self.nodes,
                                            "--fail")
            if any(node == 0 for _, node, _ in events):
                raise ValueError(f"--fail {self.resources['failure_schedule']!r} kills node0: "
                                 f"a race through failures keeps node 0, whose record is "
                                 f"the run's summary (a node's record starts when it starts)")

    def base_config(self) -> TrainConfig:
        """The workload's training settings with the user's overrides (no run's yet)."""
        return race_config.base_config(self.workload, self.train)

    def run_config(self, algorithm: str, lr: float | None = None,
                   seed: int | None = None) -> TrainConfig:
        cfg = race_config.run_config(
            self.workload, algorithm, self.train, ranks_per_node=self.ranks_per_node,
            target=self.resolved_target(), budget_s=self.resolved_budget(),
            eval_every=self.eval_every, stop_at_target=self.stop_at_target, lr=lr, seed=seed)
        return dataclasses.replace(cfg, fault_tolerant=True) if self.fault_tolerant else cfg

    def common(self) -> dict:
        """What every run shares (the `setting` of results.json)."""
        base = dataclasses.asdict(self.base_config())
        return {"workload": self.workload, "metric": workloads.WORKLOADS[self.workload].metric,
                "target": self.resolved_target(), "budget_s": self.resolved_budget(),
                "stop_at_target": self.stop_at_target,
                "eval_every": self.eval_every or workloads.WORKLOADS[self.workload].eval_every,
                "nodes": self.nodes, "ranks_per_node": self.ranks_per_node,
                "shaping": self.shaping, "tune": self.tune,
                "lr_grid": list(self.lr_grid) if self.tune else None,
                "powersgd_start_iter": base["powersgd_start_iter"],
                # results from before node budgets existed stay valid without the key
                **({"resources": dict(self.resources)} if self.resources else {}),
                **{k: base[k] for k in TRAIN_FIELDS}}


def parse_rates(values: list[str]) -> list[str]:
    """`--inter-node-bandwidth 1gbit 200mbit` or `1gbit,200mbit` -> ['1gbit', '200mbit']."""
    return [r.strip() for v in values for r in v.split(",") if r.strip()]


def run_key(algorithm: str, rate: str, settings: CompareSettings, tag: str = "") -> str:
    return f"{algorithm}@{rate}_{settings.nodes}x{settings.ranks_per_node}{tag}"


def write_json(path: Path, payload) -> None:
    """Atomic, and readable by everyone like every other file compare writes (0644)."""
    write_json_atomic(path, payload)
    os.chmod(path, 0o666 & ~_umask())


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _resolve_shaping(settings: CompareSettings) -> None:
    if settings.shaping and missing_requirements():
        # what only the shaped cluster runs (a node budget, a schedule, several links) is
        # refused here, before the first run, not by each run after the fallback
        try:
            ClusterSpec(nodes=settings.nodes, ranks_per_node=settings.ranks_per_node,
                        inter_node_bandwidth=None, shaping=False, **settings.resources)
        except ValueError as exc:
            raise ValueError(f"the shaped cluster needs {', '.join(missing_requirements())}, "
                             f"and without it: {exc}") from None
        warnings.warn("the shaped cluster needs " + ", ".join(missing_requirements())
                      + ": falling back to --no-shaping (loopback, no link rate): the numbers "
                      "will not show a thin wire", RuntimeWarning, stacklevel=3)
        print("thinwire compare: warning: no root or ip/tc: running with --no-shaping",
              file=sys.stderr)
        settings.shaping = False


class _StepWatcher:
    """Follows a running job's metrics file and shows its latest step on the progress bar."""

    def __init__(self, bar, path: Path, label: str, total: int):
        self.bar, self.path, self.label, self.total = bar, path, label, total
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._follow, daemon=True)

    def __enter__(self):
        if self.bar is not None:
            self.bar.set_postfix_str(f"{self.label}: starting")
            self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def _follow(self):
        offset, step, seconds, shown = 0, 0, 0.0, 0
        while not self._stop.wait(1.0):
            try:
                with open(self.path) as handle:
                    handle.seek(offset)
                    chunk = handle.read()
            except OSError:
                continue
            complete = chunk[:chunk.rfind("\n") + 1]
            offset += len(complete.encode())
            for line in complete.splitlines():
                try:
                    record = json.loads(line)
                except ValueError:
                    continue
                if record.get("event") == "step":
                    step, seconds = record["step"], record["train_time_s"]
            if step and step != shown:
                shown = step
                self.bar.set_postfix_str(f"{self.label}: step {step}/{self.total}, "
                                         f"{seconds:.0f} s trained")


class StallWatch:
    """`stop_when` for the cluster launcher: a reason once the run's metrics file (a line a
    step in compare's runs) has not grown for `stall_s` seconds, counted from the start until
    the first line. A run that hangs (a deadlocked hook, a lost peer) then fails in `stall_s`,
    not at the run's whole `--timeout`."""

    CHECK_EVERY_S = 1.0

    def __init__(self, metrics: Path, stall_s: float, clock=time.monotonic):
        self.metrics, self.stall_s, self.clock = metrics, stall_s, clock
        self._size, self._since = -1, clock()
        self._checked = -math.inf

    def __call__(self) -> str | None:
        now = self.clock()
        if now - self._checked < self.CHECK_EVERY_S:
            return None
        self._checked = now
        try:
            size = self.metrics.stat().st_size
        except OSError:
            size = -1
        if size != self._size:
            self._size, self._since = size, now
            return None
        if now - self._since < self.stall_s:
            return None
        where = "before its first step" if size <= 0 else f"after step {self._last_step()}"
        return f"stalled: no training progress for {self.stall_s:g} s {where}"

    def _last_step(self) -> str:
        step = "?"
        try:
            for line in self.metrics.read_text().splitlines():
                try:
                    record = json.loads(line)
                except ValueError:
                    continue
                if isinstance(record, dict) and "step" in record:
                    step = record["step"]
        except OSError:
            pass
        return str(step)


def run_one(settings: CompareSettings, cfg: TrainConfig, rate: str, out: Path, bar=None,
            tag: str = "") -> dict:
    """One training job on the cluster; its result (also written to DIR/runs/<key>.json)."""
    key = run_key(cfg.algorithm, rate, settings, tag)
    setting = {**settings.common(), "lr": cfg.lr, "seed": cfg.seed,
               "inter_node_bandwidth": rate}
    if not modes.mode_of(cfg.algorithm).per_step:  # --tune may have chosen DiLoCo's own
        setting["outer_lr"] = cfg.outer_lr
    path = out / "runs" / f"{key}.json"
    if path.is_file():
        try:
            done = json.loads(path.read_text())
        except ValueError:
            done = {}
        if done.get("setting") == setting and done.get("status") == "ok":
            log.info("%s: already finished (%s), skipped", key, path)
            return done
        log.info("%s: result file from another setting or a failed run: running again", key)
    (out / "runs").mkdir(parents=True, exist_ok=True)
    (out / "logs").mkdir(parents=True, exist_ok=True)
    summary, metrics = out / "runs" / f".{key}.summary.json", out / "runs" / f"{key}.jsonl"
    config = out / "runs" / f".{key}.config.json"
    # the run's accounting, for its fidelity verdict: was the wire or the host the limit?
    stats = out / "runs" / f".{key}.stats.json" if settings.shaping else None
    for stale in (summary, metrics):
        if stale.exists():
            stale.unlink()
    cfg = dataclasses.replace(cfg, summary=str(summary), metrics=str(metrics))
    write_json(config, dataclasses.asdict(cfg))
    spec = ClusterSpec(nodes=settings.nodes, ranks_per_node=settings.ranks_per_node,
                       inter_node_bandwidth=None if rate == "none" else rate,
                       shaping=settings.shaping, **settings.resources)
    steps = _total_steps(cfg, settings)
    stall = StallWatch(metrics, settings.stall_s)
    stalled: list[str] = []

    def stop_when() -> str | None:
        reason = stall()
        if reason:
            stalled.append(reason)
        return reason

    try:
        with open(out / "logs" / f"{key}.log", "w") as output, \
                _StepWatcher(bar, metrics, f"{cfg.algorithm} @ {rate}{tag}", steps):
            status = cluster_run(spec, ["-m", "thinwire.train", "--config", str(config)],
                                 timeout_s=settings.timeout_s, output=output,
                                 stop_when=stop_when,
                                 stats_path=str(stats) if stats is not None else None)
    finally:
        config.unlink(missing_ok=True)
    fidelity = _fidelity(stats)
    if status == 0 and summary.is_file():
        outcome = "ok"
    elif stalled:
        outcome = f"failed ({stalled[0]})"
        log.error("%s: %s; the ranks' stacks are in %s", key, stalled[0],
                  out / "logs" / f"{key}.log")
    elif status == EXIT_TIMEOUT:
        outcome = f"failed (timed out after {settings.timeout_s:g} s)"
    else:
        outcome = f"failed ({status})"
    result = {"algorithm": cfg.algorithm, "inter_node_bandwidth": rate, "setting": setting,
              "status": outcome}
    if fidelity is not None:
        result["fidelity"] = fidelity
    if result["status"] == "ok":
        result.update({k: v for k, v in json.loads(summary.read_text()).items()
                       if k not in result})
        summary.unlink()
    else:
        result["log"] = str(out / "logs" / f"{key}.log")
    write_json(path, result)
    return result


def _fidelity(stats: Path | None) -> dict | None:
    """The run's fidelity verdict from its accounting file (which is removed: its time series
    are not part of the result), or None (unshaped, or the file is missing)."""
    if stats is None or not stats.is_file():
        return None
    try:
        verdict = json.loads(stats.read_text()).get("fidelity")
    except ValueError:
        verdict = None
    stats.unlink()
    return verdict


def _total_steps(cfg: TrainConfig, settings: CompareSettings) -> int:
    per_epoch = len(data.load(models.data_name(cfg.model))) // (
        cfg.batch_size * settings.nodes * settings.ranks_per_node)
    total = cfg.epochs * per_epoch
    return min(total, cfg.max_iters) if cfg.max_iters else total


def tuned_setting(algorithm: str) -> str:
    """What ``--tune`` varies for ``algorithm``: the learning rate, or for DiLoCo (a loop
    of its own, whose inner steps are DDP's at the workload's rate) its outer learning rate,
    the method's own setting (at the default 0.7 DiLoCo did not train the LM at H 5 and 10;
    at 0.3 it did)."""
    return "lr" if modes.mode_of(algorithm).per_step else "outer_lr"


def tune_lr(settings: CompareSettings, algorithm: str, rate: str, out: Path, bar=None) -> dict:
    """Train ``algorithm`` once per multiple of the grid on seed + 1 (of its learning rate, or
    of DiLoCo's outer one: :func:`tuned_setting`); the chosen value."""
    metric = workloads.metric_of(settings.workload)
    base = settings.base_config()
    knob = tuned_setting(algorithm)
    trials = []
    for multiple in settings.lr_grid:
        cfg = settings.run_config(algorithm, seed=base.seed + 1)
        cfg = dataclasses.replace(cfg, **{knob: getattr(cfg, knob) * multiple}).validate()
        value = getattr(cfg, knob)
        tag = f"_tune_lr{value:g}" if knob == "lr" else f"_tune_{knob}{value:g}"
        run = run_one(settings, cfg, rate, out, bar, tag=tag)
        if bar is not None:
            bar.update(1)
        trials.append({"lr": value, "status": run["status"],
                       "time_to_target_s": run.get("time_to_target_s"),
                       "quality_at_budget": run.get("quality_at_budget")})
    chosen = None
    for trial in trials:
        if trial["status"] != "ok":
            continue
        if chosen is None or _better_trial(trial, chosen, metric):
            chosen = trial
    return {"algorithm": algorithm, "seed": base.seed + 1, "setting": knob, "trials": trials,
            "chosen_lr": chosen["lr"] if chosen else getattr(
                settings.run_config(algorithm), knob)}


def _better_trial(a: dict, b: dict, metric: quality.Metric) -> bool:
    ta, tb = a["time_to_target_s"], b["time_to_target_s"]
    if ta is not None or tb is not None:
        return tb is None or (ta is not None and ta < tb)
    return metric.better(a["quality_at_budget"], b["quality_at_budget"])


def compare(settings: CompareSettings, out: str | os.PathLike, progress: bool = True) -> dict:
    """Run every (rate, algorithm) not finished yet; write results.json, report.md and plots."""
    settings.validate()
    _resolve_shaping(settings)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    jobs = [(rate, algorithm) for rate in settings.rates for algorithm in settings.algorithms]
    count = len(jobs) + (len(settings.algorithms) * len(settings.lr_grid) if settings.tune else 0)
    bar, redirect = None, contextlib.nullcontext()
    if progress:
        from tqdm import tqdm
        from tqdm.contrib.logging import logging_redirect_tqdm

        bar = tqdm(total=count, desc=f"compare {settings.workload}", unit="run",
                   dynamic_ncols=True)
        redirect = logging_redirect_tqdm()
    runs, tuning = [], []
    try:
        with redirect:
            tuned_values = {}
            if settings.tune:  # at the first rate: the learning rate is not the link's business
                for algorithm in settings.algorithms:
                    tuned = tune_lr(settings, algorithm, settings.rates[0], out, bar)
                    tuning.append(tuned)
                    tuned_values[algorithm] = {tuned["setting"]: tuned["chosen_lr"]}
            for rate, algorithm in jobs:
                cfg = dataclasses.replace(settings.run_config(algorithm),
                                          **tuned_values.get(algorithm, {})).validate()
                runs.append(run_one(settings, cfg, rate, out, bar))
                if bar is not None:
                    bar.update(1)
    finally:
        if bar is not None:
            bar.close()
    results = {"setting": {**settings.common(), "rates": settings.rates,
                           "algorithms": settings.algorithms},
               "runs": report.annotate(runs), "tuning": tuning}
    write_json(out / "results.json", results)
    report.write_all(results, out)
    return results
