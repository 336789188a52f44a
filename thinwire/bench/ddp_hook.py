"""`thinwire bench ddp-hook`: what thinwire's DDP hook costs a training step, and how much of
its work hides behind backward (issue 30, item 4: the hook path that never holds backward).

One process, a world of one (NCCL on CUDA, gloo on the CPU), so the link costs nothing and what
is measured is the hook path itself: the worker thread, the side stream, the selection and the
packing. Per configuration, interleaved over ``repeats`` rounds, the median time of a training
step (forward, backward, SGD step) of an MLP:

* ``floor``: backward under ``ddp.no_sync()``, no synchronisation at all (the compute);
* ``ddp``: DDP's built-in all-reduce (C++), and ``torch-fp16``: PyTorch's fp16 compression
  hook (a Python future, as thinwire's are): the peers;
* ``ALGORITHM``: thinwire's hook, and ``ALGORITHM serial``: backward under ``no_sync()`` then
  ``thinwire.synchronize`` on the same settings: the same work, after backward instead of
  inside it.

``hidden`` = 1 - (hook - floor) / (serial - floor): the share of thinwire's work that the hook
path overlapped with backward (0 when it ran as if inline, 1 when none of it showed).
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import tempfile
import time
import warnings

import torch
import torch.distributed as dist
import torch.nn as nn

from thinwire.bench.report import save_if_asked
from thinwire.cliargs import device as device_type
from thinwire.cliargs import add_algorithm_option, integer, number, options_by_algorithm
from thinwire.output import format_table

COLUMNS = ("config", "step_ms", "vs_ddp", "serial_ms", "hidden")
# Model sizes that make backward long enough to hide the hook's work behind: an H100 runs the
# CUDA default's step in ~10 ms; the CPU default keeps a CI run to seconds.
DEFAULTS = {"cuda": {"width": 4096, "layers": 8, "batch": 512},
            "cpu": {"width": 512, "layers": 4, "batch": 32}}


def _model(width: int, layers: int, device: torch.device) -> nn.Module:
    torch.manual_seed(0)
    blocks = []
    for _ in range(layers):
        blocks += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*blocks).to(device)


class _Config:
    """One way of running a step; `step()` runs one and returns nothing (timed outside)."""

    def __init__(self, name, ddp, optimizer, batch, *, no_sync=False, after=None):
        self.name, self.ddp, self.optimizer, self.batch = name, ddp, optimizer, batch
        self.no_sync, self.after = no_sync, after

    def step(self) -> None:
        x, y = self.batch
        self.optimizer.zero_grad(set_to_none=False)
        context = self.ddp.no_sync() if self.no_sync else contextlib.nullcontext()
        with context:
            nn.functional.cross_entropy(self.ddp(x), y).backward()
        if self.after is not None:
            self.after()
        self.optimizer.step()


def _configs(algorithms, device, width, layers, batch_size, sync, algorithm_options,
             bucket_mb):
    from thinwire.bench.sync_settings import for_algorithm

    import thinwire
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn.parallel import DistributedDataParallel as DDP

    generator = torch.Generator(device=device).manual_seed(1)
    x = torch.randn(batch_size, width, generator=generator, device=device)
    y = torch.randint(0, width, (batch_size,), generator=generator, device=device)
    ids = [device.index] if device.type == "cuda" else None

    def wrapped():
        model = DDP(_model(width, layers, device), device_ids=ids, bucket_cap_mb=bucket_mb)
        return model, torch.optim.SGD(model.parameters(), lr=1e-4)

    configs = []
    model, opt = wrapped()
    configs.append(_Config("floor", model, opt, (x, y), no_sync=True))
    model, opt = wrapped()
    configs.append(_Config("ddp", model, opt, (x, y)))
    model, opt = wrapped()
    model.register_comm_hook(dist.group.WORLD, default_hooks.fp16_compress_hook)
    configs.append(_Config("torch-fp16", model, opt, (x, y)))
    for algorithm in algorithms:
        settings = for_algorithm(algorithm, sync)
        settings["algorithm_options"] = algorithm_options.get(algorithm)
        model, opt = wrapped()
        thinwire.ddp.register(model, algorithm=algorithm, ranks_per_node=1, **settings)
        configs.append(_Config(algorithm, model, opt, (x, y)))
        model, opt = wrapped()
        state = thinwire.SyncState(thinwire.Topology.shared(ranks_per_node=1), algorithm,
                                   **settings)
        params = list(model.parameters())
        configs.append(_Config(f"{algorithm} serial", model, opt, (x, y), no_sync=True,
                               after=lambda p=params, s=state: thinwire.synchronize(
                                   p, s, bucket_bytes=int(bucket_mb * 2**20))))
    return configs


def _time(config: _Config, steps: int, device: torch.device) -> float:
    """Median seconds of one step over ``steps``, each step ended on the device."""
    times = []
    for _ in range(steps):
        begin = time.perf_counter()
        config.step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - begin)
    return statistics.median(times)


def run(algorithms=("allreduce", "hier_allreduce", "hitopk"), device: str = "cpu",
        width: int | None = None, layers: int | None = None, batch: int | None = None,
        sync: dict | None = None, algorithm_options: dict | None = None,
        bucket_mb: float = 25.0,
        steps: int = 10, warmup: int = 3, repeats: int = 3) -> dict:
    """``sync``: {setting: value} of thinwire.bench.sync_settings.NAMES (each algorithm gets
    the ones it uses; the rest keep train's defaults); ``algorithm_options``: {algorithm:
    {name: value}}, each algorithm's declared settings."""
    from thinwire import collectives
    from thinwire.bench import sync_settings

    for algorithm in algorithms:
        collectives.get(algorithm)  # an unknown name fails here, naming the known ones
    sync = sync_settings.checked(sync)
    algorithm_options = sync_settings.checked_algorithm_options(algorithm_options,
                                                                 algorithms)
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device {device} requested but CUDA is not available")
    sizes = DEFAULTS[dev.type]
    width, layers, batch = width or sizes["width"], layers or sizes["layers"], \
        batch or sizes["batch"]
    if dev.type == "cuda":
        if dev.index is None:  # DDP's device_ids and NCCL want the index
            dev = torch.device("cuda", torch.cuda.current_device())
        torch.cuda.set_device(dev)
    with tempfile.TemporaryDirectory() as store, warnings.catch_warnings():
        # thinwire's hierarchical algorithms warn that one node has no inter-node phase
        warnings.simplefilter("ignore", RuntimeWarning)
        dist.init_process_group("nccl" if dev.type == "cuda" else "gloo",
                                init_method=f"file://{store}/store", rank=0, world_size=1)
        try:
            configs = _configs(list(algorithms), dev, width, layers, batch, sync,
                               algorithm_options, bucket_mb)
            for config in configs:  # warm up: DDP rebuilds its buckets after step one
                for _ in range(warmup):
                    config.step()
            measured = {c.name: [] for c in configs}
            for _ in range(repeats):  # interleaved, so drift hits every configuration alike
                for config in configs:
                    measured[config.name].append(_time(config, steps, dev))
        finally:
            dist.destroy_process_group()
    median = {name: statistics.median(values) for name, values in measured.items()}
    rows = []
    for name, seconds in median.items():
        if name.endswith(" serial"):
            continue
        row = {"config": name, "step_ms": seconds * 1e3, "vs_ddp": seconds / median["ddp"],
               "repeats_ms": [v * 1e3 for v in measured[name]]}
        serial = median.get(f"{name} serial")
        if serial is not None:
            work = serial - median["floor"]
            row["serial_ms"] = serial * 1e3
            row["hidden"] = 1 - (seconds - median["floor"]) / work if work > 0 else None
        rows.append(row)
    params = sum(p.numel() for p in _model(width, layers, torch.device("meta")).parameters())
    return {"device": str(dev), "device_name": torch.cuda.get_device_name(dev)
            if dev.type == "cuda" else "cpu", "torch": torch.__version__,
            "model": {"width": width, "layers": layers, "parameters": params},
            "batch": batch, **sync, "algorithm_options": algorithm_options,
            "bucket_mb": bucket_mb,
            "steps": steps, "warmup": warmup, "repeats": repeats, "rows": rows}


def _main(args: argparse.Namespace) -> int:
    from thinwire.bench import sync_settings

    sync_settings.refuse_unused(args, args.algorithms)
    result = run(args.algorithms, args.device, args.width, args.layers, args.batch,
                 {name: getattr(args, name) for name in sync_settings.NAMES},
                 options_by_algorithm(args.algorithm_option or [], args.algorithms),
                 args.bucket_mb, args.steps, args.warmup, args.repeats)
    model = result["model"]
    print(f"{result['device_name']}, torch {result['torch']}: MLP {model['layers']} x "
          f"{model['width']} ({model['parameters'] / 1e6:.1f}M parameters), batch "
          f"{result['batch']}, median of {result['repeats']} rounds of {result['steps']} steps")
    print(format_table(result["rows"], COLUMNS))
    save_if_asked(args.json, result)
    return 0


def register(bench_subparsers) -> None:
    from thinwire import collectives
    from thinwire.bench import sync_settings

    parser = bench_subparsers.add_parser(
        "ddp-hook", help="what thinwire's DDP hook costs a step, and how much of it hides "
                         "behind backward (one process; CUDA or CPU)")
    parser.add_argument("--algorithms", nargs="+", default=["allreduce", "hier_allreduce",
                                                            "hitopk"],
                        choices=collectives.names(), metavar="ALGORITHM",
                        help=f"thinwire algorithms to time: {', '.join(collectives.names())}")
    parser.add_argument("--device", type=device_type, default="cpu", help="cpu or cuda[:N]")
    parser.add_argument("--width", type=integer(8, 65536), default=None,
                        help="the MLP's width (default 4096 on CUDA, 512 on the CPU)")
    parser.add_argument("--layers", type=integer(1, 256), default=None,
                        help="the MLP's layers (default 8 on CUDA, 4 on the CPU)")
    parser.add_argument("--batch", type=integer(1), default=None,
                        help="samples a step (default 512 on CUDA, 32 on the CPU)")
    sync_settings.add(parser)
    add_algorithm_option(parser)
    parser.add_argument("--bucket-mb", type=number(0, low_open=True), default=25.0,
                        help="DDP's bucket size (bucket_cap_mb)")
    parser.add_argument("--steps", type=integer(1), default=10, help="timed steps a round")
    parser.add_argument("--warmup", type=integer(1), default=3, help="untimed steps first")
    parser.add_argument("--repeats", type=integer(1), default=3, help="interleaved rounds")
    parser.add_argument("--json", metavar="PATH", help="write the results as JSON here")
    parser.set_defaults(func=_main)
