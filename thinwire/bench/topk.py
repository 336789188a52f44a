"""`thinwire bench topk`: selection time and quality per method, size and density.

Method "mstopk-carry" is what the sparse algorithms run in steady state
(``compress.TopK.select(x, key=bucket)``): the threshold carried over from the bucket's last
selection, here primed on a perturbed copy of x (10% noise) as the previous step.

Each row: the median of several runs, the speed-up over ``torch.topk(x.abs(), k, sorted=False)``
measured in the same run, the number of entries selected, the captured top-k mass, and the time
of one ``x.abs()`` pass over the same tensor (the memory-bandwidth yardstick).
"""

from __future__ import annotations

import argparse
import platform

import torch

from thinwire import cliargs, compress, topk
from thinwire.bench.report import format_table, median_time, save_if_asked

DEFAULT_SIZES = (1_000_000, 25_600_000, 110_000_000)  # 1M, ResNet-50, BERT-base
DEFAULT_DENSITIES = (0.01, 0.001)
HINTED = "mstopk-carry"
METHODS = topk.METHODS
COLUMNS = ("size", "density", "method", "median_s", "speedup_vs_torch_topk", "selected",
           "captured_mass", "abs_pass_s")


def _torch_topk(x: torch.Tensor, k: int):
    return torch.topk(x.abs(), k, sorted=False)


def _fits(size: int, device: torch.device) -> bool:
    # x, |x|, and topk's temporaries: about four float32 copies.
    need = 4 * 4 * size
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return need < free
    try:
        import os
        return need < os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return True


def _hinted(x: torch.Tensor, density: float, generator: torch.Generator):
    """A TopK whose bucket-0 threshold was carried from a perturbed copy of ``x``."""
    selector = compress.TopK(density, selector=HINTED)
    noise = torch.randn(x.shape, generator=generator, device=x.device)
    selector.select(x + 0.1 * x.abs().mean() * noise, key=0)
    return lambda: selector.select(x, key=0)


def run(sizes=DEFAULT_SIZES, densities=DEFAULT_DENSITIES, methods=METHODS,
        repeats: int = 5, device: str = "cpu", seed: int = 0) -> list[dict]:
    dev = torch.device(device)
    sync = torch.cuda.synchronize if dev.type == "cuda" else None
    rows = []
    generator = torch.Generator(device=dev).manual_seed(seed)
    for size in sizes:
        if not _fits(size, dev):
            print(f"skipping size {size}: not enough free memory on {dev}")
            continue
        x = torch.randn(size, generator=generator, device=dev)
        abs_s = median_time(lambda: x.abs(), repeats, sync=sync)
        for density in densities:
            k = topk.k_for_density(size, density)
            baseline_s = median_time(lambda: _torch_topk(x, k), repeats, sync=sync)
            for method in ("exact",) + tuple(m for m in methods if m != "exact"):
                if method == "exact":
                    seconds, indices = baseline_s, _torch_topk(x, k).indices
                elif method == HINTED:
                    select = _hinted(x, density, generator)
                    seconds = median_time(select, repeats, sync=sync)
                    indices = select()[1]
                else:
                    seconds = median_time(lambda: topk.select(x, k, method), repeats, sync=sync)
                    indices = topk.select(x, k, method)[1]
                rows.append({
                    "size": size, "density": density, "method": method, "k": k,
                    "median_s": seconds, "speedup_vs_torch_topk": baseline_s / seconds,
                    "selected": int(indices.numel()),
                    "captured_mass": topk.captured_mass(x, indices),
                    "abs_pass_s": abs_s, "time_vs_abs_pass": seconds / abs_s,
                    "device": str(dev), "repeats": repeats,
                })
        del x
    return rows


def _main(args: argparse.Namespace) -> int:
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"--device {args.device} requested but CUDA is not available")
    if args.repeats < 5:
        print(f"note: --repeats {args.repeats} is below the 5 the published figures use")
    rows = run(args.sizes, args.densities, args.methods, args.repeats, args.device)
    print(format_table(rows, COLUMNS))
    save_if_asked(args.json, {
        "benchmark": "topk", "torch": torch.__version__, "threads": torch.get_num_threads(),
        "machine": platform.machine(), "processor": platform.processor(), "rows": rows})
    return 0


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _density(text: str) -> float:
    try:
        return topk.validate_density(float(text))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def register(bench_subparsers) -> None:
    parser = bench_subparsers.add_parser("topk", help="top-k selection: time and captured mass")
    parser.add_argument("--sizes", type=_positive_int, nargs="+", default=list(DEFAULT_SIZES),
                        help="vector lengths to select from")
    parser.add_argument("--densities", type=_density, nargs="+", default=list(DEFAULT_DENSITIES),
                        help="shares of entries to select")
    parser.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS),
                        help="selection methods to time")
    parser.add_argument("--repeats", type=_positive_int, default=5,
                        help="timed selections per case (the median is reported)")
    parser.add_argument("--device", type=cliargs.device, default="cpu", help="cpu or cuda[:N]")
    parser.add_argument("--json", metavar="PATH", help="write the rows as JSON here")
    parser.set_defaults(func=_main)
