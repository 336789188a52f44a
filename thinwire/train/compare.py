"""`thinwire compare`: every algorithm, the same model, data, seed and epochs, on the emulated
cluster; one table, `results.json`, `report.md` and plots.

Each (link rate, algorithm) is one `python -m thinwire.train` job launched by
`thinwire.cluster.run`. Its result goes to `DIR/runs/<algorithm>@<rate>.json` (temp file +
rename) as soon as it ends, together with the setting it ran under; a re-run of an interrupted
compare skips every run whose file exists with the same setting. Each job's output goes to
`DIR/logs/`, its metrics to `DIR/runs/*.jsonl`.
"""

from __future__ import annotations

import json
import logging
import math
import os
import sys
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path

from thinwire.output import write_json_atomic
from thinwire.cluster import ClusterSpec, missing_requirements, parse_rate
from thinwire.cluster import run as cluster_run
from thinwire import collectives
from thinwire.train import data, grad_sync, models

log = logging.getLogger("thinwire.compare")

def default_algorithms() -> list[str]:
    """PyTorch's peers, then every algorithm in thinwire's registry."""
    return list(grad_sync.TORCH_ALGORITHMS) + list(collectives.names())
DEFAULT_MODEL = "widecnn"
DEFAULT_RATE = "200mbit"  # ddp spends most of its step on the wire here (docs/benchmarks.md)


@dataclass
class CompareSettings:
    algorithms: list = field(default_factory=default_algorithms)
    model: str = DEFAULT_MODEL
    epochs: int = 2
    max_iters: int = 0
    batch_size: int = 32
    density: float = 0.01
    selector: str = "mstopk"
    powersgd_rank: int = 4
    nodes: int = 2
    ranks_per_node: int = 2
    rates: list = field(default_factory=lambda: [DEFAULT_RATE])
    shaping: bool = True
    seed: int = 0
    target_accuracy: float | None = 0.9
    evals_per_epoch: int = 4
    timeout_s: float = 1800.0

    def validate(self) -> "CompareSettings":
        if not self.algorithms:
            raise ValueError("--algorithms must name at least one algorithm")
        for name in self.algorithms:
            if name not in grad_sync.algorithm_names():
                raise ValueError(f"--algorithms: unknown algorithm {name!r}; allowed: "
                                 f"{', '.join(grad_sync.algorithm_names())}")
        if len(set(self.algorithms)) != len(self.algorithms):
            raise ValueError(f"--algorithms lists an algorithm twice: {self.algorithms}")
        models.check_model(self.model)
        grad_sync.check_density(self.density)
        grad_sync.check_selector(self.selector)
        grad_sync.check_powersgd_rank(self.powersgd_rank)
        for param in ("epochs", "batch_size", "nodes", "ranks_per_node", "evals_per_epoch"):
            value = getattr(self, param)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"--{param.replace('_', '-')} must be an integer >= 1, "
                                 f"got {value!r}")
        if isinstance(self.max_iters, bool) or not isinstance(self.max_iters, int) \
                or self.max_iters < 0:
            raise ValueError(f"--max-iters must be an integer >= 0, got {self.max_iters!r}")
        if not self.rates:
            raise ValueError("--inter-node-bandwidth needs at least one rate")
        for rate in self.rates:
            if rate != "none":
                parse_rate(rate, "--inter-node-bandwidth")
        if self.target_accuracy is not None and not 0 < self.target_accuracy <= 1:
            raise ValueError(f"--target-accuracy must be in (0, 1], got {self.target_accuracy!r}")
        if not self.timeout_s > 0:
            raise ValueError(f"--timeout must be > 0 seconds, got {self.timeout_s!r}")
        ClusterSpec(nodes=self.nodes, ranks_per_node=self.ranks_per_node)  # checks the shape
        return self

    def common(self) -> dict:
        """What every run shares (the `setting` of results.json)."""
        out = asdict(self)
        out.pop("algorithms"), out.pop("rates"), out.pop("timeout_s")
        return out


def parse_rates(values: list[str]) -> list[str]:
    """`--inter-node-bandwidth 1gbit 200mbit` or `1gbit,200mbit` -> ['1gbit', '200mbit']."""
    return [r.strip() for v in values for r in v.split(",") if r.strip()]


def rate_bps(rate: str) -> float:
    return math.inf if rate == "none" else float(parse_rate(rate))


def run_key(algorithm: str, rate: str, settings: CompareSettings) -> str:
    return f"{algorithm}@{rate}_{settings.nodes}x{settings.ranks_per_node}"


def _train_command(s: CompareSettings, algorithm: str, summary: Path, metrics: Path) -> list:
    steps_per_epoch = len(data.load(models.data_name(s.model))) // (
        s.batch_size * s.nodes * s.ranks_per_node)
    total = s.epochs * steps_per_epoch
    if s.max_iters:
        total = min(total, s.max_iters)
    eval_every = max(1, min(total, steps_per_epoch) // s.evals_per_epoch)
    command = ["-m", "thinwire.train", "--model", s.model, "--algorithm", algorithm,
               "--density", repr(s.density), "--selector", s.selector,
               "--powersgd-rank", str(s.powersgd_rank), "--epochs", str(s.epochs),
               "--max-iters", str(s.max_iters), "--batch-size", str(s.batch_size),
               "--seed", str(s.seed), "--eval-every", str(eval_every), "--no-progress",
               "--summary", str(summary), "--metrics", str(metrics)]
    if s.target_accuracy is not None:
        command += ["--target-accuracy", repr(s.target_accuracy)]
    return command


def _resolve_shaping(settings: CompareSettings) -> None:
    if settings.shaping and missing_requirements():
        warnings.warn("the shaped cluster needs " + ", ".join(missing_requirements())
                      + ": falling back to --no-shaping (loopback, no link rate): the numbers "
                      "will not show a thin wire", RuntimeWarning, stacklevel=3)
        print("thinwire compare: warning: no root or ip/tc: running with --no-shaping",
              file=sys.stderr)
        settings.shaping = False


def run_one(settings: CompareSettings, algorithm: str, rate: str, out: Path) -> dict:
    """One training job on the cluster; its result (also written to DIR/runs/<key>.json)."""
    key = run_key(algorithm, rate, settings)
    setting = {**settings.common(), "inter_node_bandwidth": rate}
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
    for stale in (summary, metrics):
        if stale.exists():
            stale.unlink()
    spec = ClusterSpec(nodes=settings.nodes, ranks_per_node=settings.ranks_per_node,
                       inter_node_bandwidth=None if rate == "none" else rate,
                       shaping=settings.shaping)
    with open(out / "logs" / f"{key}.log", "w") as output:
        status = cluster_run(spec, _train_command(settings, algorithm, summary, metrics),
                             timeout_s=settings.timeout_s, output=output)
    result = {"algorithm": algorithm, "inter_node_bandwidth": rate, "setting": setting,
              "status": "ok" if status == 0 and summary.is_file() else f"failed ({status})"}
    if result["status"] == "ok":
        result.update({k: v for k, v in json.loads(summary.read_text()).items()
                       if k not in result})
        summary.unlink()
    else:
        result["log"] = str(out / "logs" / f"{key}.log")
    write_json_atomic(path, result)
    return result


def compare(settings: CompareSettings, out: str | os.PathLike, progress: bool = True) -> dict:
    """Run every (rate, algorithm) not finished yet; write results.json, report.md and plots."""
    from thinwire.train import report

    settings.validate()
    _resolve_shaping(settings)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    jobs = [(rate, algorithm) for rate in settings.rates for algorithm in settings.algorithms]
    bar = None
    if progress:
        from tqdm import tqdm
        bar = tqdm(total=len(jobs), desc="compare", unit="run", dynamic_ncols=True)
    runs = []
    try:
        for rate, algorithm in jobs:
            if bar is not None:
                bar.set_postfix_str(f"{algorithm} @ {rate}")
            runs.append(run_one(settings, algorithm, rate, out))
            if bar is not None:
                bar.update(1)
    finally:
        if bar is not None:
            bar.close()
    results = {"setting": {**settings.common(), "rates": settings.rates,
                           "algorithms": settings.algorithms},
               "runs": report.annotate(runs)}
    write_json_atomic(out / "results.json", results)
    report.write_all(results, out)
    return results
