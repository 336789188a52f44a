"""`thinwire bench optim`: optimizer step time, fused LARS vs per-tensor LARS vs SGD-foreach.

Two parameter sets, generated from the architectures (no torchvision needed):
- `resnet50`: ResNet-50's 161 tensors, 25.6M elements: large tensors, bandwidth-bound.
- `transformer`: a small GPT-style model (d_model 128, 18 blocks): 221 tensors, median 384
  elements, 3.9M elements in all; many small tensors, where fusing the per-tensor work pays most.
- `overhead`: the same 221 tensors with one element each: the cost of issuing the ops alone.

Each method gets its own parameters, gradients and optimizer; after two warm-up steps the methods
are timed in interleaved rounds (one step each per round, order rotated), so that load from other
processes on a shared machine falls on all of them alike; the figure is the median per method.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import time
from typing import Callable

import torch

from thinwire.bench.report import format_table, save_if_asked
from thinwire.cliargs import device, integer

log = logging.getLogger(__name__)

Shapes = list[tuple[str, tuple[int, ...]]]
METHODS = ("fused", "per_tensor", "sgd_foreach")
WEIGHT_DECAY = 5e-5


def resnet50_shapes(num_classes: int = 1000) -> Shapes:
    """ResNet-50's parameters (He et al. 2016, torchvision layout): stem conv + BN, four stages
    of [3, 4, 6, 3] bottlenecks (1x1, 3x3, 1x1 convs without bias, each with a BN; a 1x1
    projection + BN on each stage's first block), then the classifier."""
    shapes: Shapes = [("conv1.weight", (64, 3, 7, 7))]
    shapes += _bn("bn1", 64)
    in_ch = 64
    for stage, (blocks, width) in enumerate(zip((3, 4, 6, 3), (64, 128, 256, 512)), start=1):
        out_ch = width * 4
        for block in range(blocks):
            p = f"layer{stage}.{block}"
            shapes.append((f"{p}.conv1.weight", (width, in_ch, 1, 1)))
            shapes += _bn(f"{p}.bn1", width)
            shapes.append((f"{p}.conv2.weight", (width, width, 3, 3)))
            shapes += _bn(f"{p}.bn2", width)
            shapes.append((f"{p}.conv3.weight", (out_ch, width, 1, 1)))
            shapes += _bn(f"{p}.bn3", out_ch)
            if block == 0:
                shapes.append((f"{p}.downsample.0.weight", (out_ch, in_ch, 1, 1)))
                shapes += _bn(f"{p}.downsample.1", out_ch)
            in_ch = out_ch
    shapes += [("fc.weight", (num_classes, in_ch)), ("fc.bias", (num_classes,))]
    return shapes


def _bn(prefix: str, channels: int) -> Shapes:
    return [(f"{prefix}.weight", (channels,)), (f"{prefix}.bias", (channels,))]


def transformer_shapes(layers: int = 18, d_model: int = 128, vocab: int = 1024,
                       context: int = 256) -> Shapes:
    """A small GPT-style model: token and position embeddings, `layers` pre-norm blocks (LN,
    fused QKV, projection, LN, 4x MLP; all with biases), final LN, untied head."""
    shapes: Shapes = [("tok_emb.weight", (vocab, d_model)), ("pos_emb.weight", (context, d_model))]
    for i in range(layers):
        p = f"blocks.{i}"
        shapes += [
            (f"{p}.ln1.weight", (d_model,)), (f"{p}.ln1.bias", (d_model,)),
            (f"{p}.attn.qkv.weight", (3 * d_model, d_model)), (f"{p}.attn.qkv.bias", (3 * d_model,)),
            (f"{p}.attn.proj.weight", (d_model, d_model)), (f"{p}.attn.proj.bias", (d_model,)),
            (f"{p}.ln2.weight", (d_model,)), (f"{p}.ln2.bias", (d_model,)),
            (f"{p}.mlp.fc.weight", (4 * d_model, d_model)), (f"{p}.mlp.fc.bias", (4 * d_model,)),
            (f"{p}.mlp.proj.weight", (d_model, 4 * d_model)), (f"{p}.mlp.proj.bias", (d_model,)),
        ]
    shapes += [("ln_f.weight", (d_model,)), ("ln_f.bias", (d_model,)),
               ("head.weight", (vocab, d_model))]
    return shapes


def overhead_shapes() -> Shapes:
    """The transformer's 221 tensors with one element each: no arithmetic to speak of, so the
    step time is the cost of issuing the ops (Python, dispatch) and nothing else."""
    return [(name, (1,)) for name, _ in transformer_shapes()]


CASES: dict[str, Callable[[], Shapes]] = {"resnet50": resnet50_shapes,
                                          "transformer": transformer_shapes,
                                          "overhead": overhead_shapes}


def _is_bias_or_norm(name: str) -> bool:
    # Same rule as thinwire.optim.param_groups, read from the names of the generated shapes.
    module, _, leaf = name.rpartition(".")
    return leaf == "bias" or module.split(".")[-1].startswith(("bn", "ln")) \
        or module.endswith("downsample.1")


def _make_optimizer(method: str, shapes: Shapes, device: torch.device, seed: int
                    ) -> torch.optim.Optimizer:
    from thinwire.optim import LARS

    gen = torch.Generator().manual_seed(seed)
    decay, no_decay = [], []
    for name, shape in shapes:
        p = (torch.randn(shape, generator=gen) * 0.05).to(device).requires_grad_(True)
        p.grad = (torch.randn(shape, generator=gen) * 1e-3).to(device)
        (no_decay if _is_bias_or_norm(name) else decay).append(p)
    groups = [{"params": decay, "weight_decay": WEIGHT_DECAY},
              {"params": no_decay, "weight_decay": 0.0, "trust_ratio": False}]
    if method == "sgd_foreach":
        return torch.optim.SGD(groups, lr=0.1, momentum=0.9, foreach=True)
    return LARS(groups, lr=0.1, momentum=0.9, foreach=(method == "fused"))


def run(cases: tuple[str, ...] = tuple(CASES), repeats: int = 7, device: str = "cpu",
        seed: int = 0) -> list[dict]:
    """One row per (case, method): median step time and the ratios between methods."""
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats must be an integer >= 1, got {repeats!r}")
    if repeats < 5:
        log.warning("repeats=%d: fewer than 5 repetitions make a noisy median", repeats)
    unknown = [c for c in cases if c not in CASES]
    if unknown:
        raise ValueError(f"unknown case {unknown[0]!r}; allowed: {', '.join(CASES)}")
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("device cuda requested but torch.cuda.is_available() is False")
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)

    rows = []
    for case in cases:
        shapes = CASES[case]()
        numels = sorted(torch.Size(s).numel() for _, s in shapes)
        opts = {m: _make_optimizer(m, shapes, dev, seed) for m in METHODS}
        times: dict[str, list[float]] = {m: [] for m in METHODS}
        for opt in opts.values():
            for _ in range(2):
                opt.step()
        sync()
        for r in range(repeats):
            order = METHODS[r % len(METHODS):] + METHODS[:r % len(METHODS)]
            for method in order:
                start = time.perf_counter()
                opts[method].step()
                sync()
                times[method].append(time.perf_counter() - start)
        del opts
        med = {m: statistics.median(t) for m, t in times.items()}
        log.info("%s: %s", case, ", ".join(f"{m} {v * 1e3:.2f} ms" for m, v in med.items()))
        for method in METHODS:
            rows.append({
                "case": case, "method": method, "device": str(dev),
                "tensors": len(shapes), "elements": sum(numels),
                "median_numel": int(statistics.median(numels)),
                "repeats": repeats, "median_s": med[method], "min_s": min(times[method]),
                "speedup_vs_per_tensor": med["per_tensor"] / med[method],
                "time_vs_sgd_foreach": med[method] / med["sgd_foreach"],
            })
    return rows


def main(args: argparse.Namespace) -> int:
    if args.threads is not None:
        if args.threads < 1:
            raise ValueError(f"threads must be >= 1, got {args.threads}")
        torch.set_num_threads(args.threads)
    rows = run(tuple(args.cases), repeats=args.repeats, device=args.device, seed=args.seed)
    print(format_table(rows, ["case", "method", "tensors", "elements", "median_s",
                              "speedup_vs_per_tensor", "time_vs_sgd_foreach"]))
    save_if_asked(args.json, {"benchmark": "optim", "torch": torch.__version__,
                              "threads": torch.get_num_threads(), "rows": rows})
    return 0


def register(bench_subparsers: argparse._SubParsersAction) -> None:
    parser = bench_subparsers.add_parser(
        "optim", help="fused LARS vs per-tensor LARS vs SGD-foreach step time")
    parser.add_argument("--json", metavar="PATH", help="write the rows as JSON to PATH")
    parser.add_argument("--cases", nargs="+", choices=list(CASES), default=list(CASES),
                        help="parameter layouts to time")
    parser.add_argument("--repeats", type=integer(1), default=7,
                        help="timed steps per method (>= 5)")
    parser.add_argument("--device", type=device, default="cpu", help="cpu or cuda")
    parser.add_argument("--seed", type=int, default=0,
                        help="seed of the random parameters and gradients")
    parser.add_argument("--threads", type=integer(1), default=None,
                        help="CPU threads for torch (default: torch's choice); 1 gives steadier "
                             "figures on a shared machine")
    parser.set_defaults(func=main)
