"""Compute model: device presets and per-layer tables (parameters, forward FLOPs per sample).

A layer's forward takes ``flops * batch / device.flops`` seconds and its backward twice that
(gradient of the input and of the weights, each as costly as the forward). FLOPs count only
matrix products and convolutions (2 per multiply-add); the cost of element-wise layers (BN,
ReLU, softmax, LayerNorm) is folded into the device's *effective* rate, which is therefore
lower than its datasheet peak. A table of measured per-layer times (``TimedLayer``, read by
:func:`read_layer_table`) replaces the FLOP model entirely.

ResNet-50 and BERT-base tables are generated from the architectures (no torchvision needed);
any ``torch.nn.Module`` - the models of thinwire's own runs - gets its table from
:func:`layers_from_module`, which counts by running one forward pass.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from thinwire.output import read_json
from thinwire.sim.collectives import SparseRates


@dataclass(frozen=True)
class Layer:
    name: str
    params: int              # gradient elements
    flops: float             # forward FLOPs per sample


@dataclass(frozen=True)
class TimedLayer:
    name: str
    params: int
    forward_s: float
    backward_s: float


@dataclass(frozen=True)
class Device:
    name: str
    flops: float             # effective FLOP/s on the model's matmuls/convs (mixed precision)
    sparse: SparseRates
    note: str = ""


# Assumptions (effective, not peak; ResNet-50 training = 24.5 GFLOPs per image):
# - V100: 28 TFLOP/s -> ~1,140 ResNet-50 images/s, in the range published for mixed-precision
#   PyTorch/MXNet training on one V100 (1,000-1,400). A100 70 (~2,850 img/s), H100 150.
# - MSTopK selection is memory-bound: ~20 compare-and-count passes over fp32 data plus the
#   error-feedback passes, at ~800 GB/s on a V100 -> 1e10 elements/s; 0.1 ms of fixed launch
#   cost per call. index_add of received pairs: 1e10 pairs/s. A100 x1.7, H100 x3.7 (HBM ratio).
def _rates(scale: float) -> SparseRates:
    return SparseRates(select_rate=1e10 * scale, scatter_rate=1e10 * scale, select_alpha=1e-4)


DEVICES: dict[str, Device] = {
    "v100": Device("v100", 28e12, _rates(1.0), "V100 SXM2, fp16 tensor cores"),
    "a100": Device("a100", 70e12, _rates(1.7), "A100 SXM4, bf16/fp16"),
    "h100": Device("h100", 150e12, _rates(3.7), "H100 SXM5, bf16/fp16"),
}


def device(name: str) -> Device:
    key = name.lower()
    if key not in DEVICES:
        raise ValueError(f"device must be one of {', '.join(DEVICES)}, got {name!r}")
    return DEVICES[key]


# --------------------------------------------------------------------------- architectures


def _conv(name: str, cin: int, cout: int, k: int, out_hw: int) -> Layer:
    return Layer(name, cout * cin * k * k, 2.0 * cout * cin * k * k * out_hw * out_hw)


def _bn(name: str, channels: int) -> Layer:
    return Layer(name, 2 * channels, 0.0)


def resnet50(num_classes: int = 1000, image: int = 224) -> list[Layer]:
    """ResNet-50 v1.5 (torchvision layout: stride on the 3x3 conv), forward order."""
    hw = image // 2  # 7x7 stride-2 stem
    layers = [_conv("conv1", 3, 64, 7, hw), _bn("bn1", 64)]
    hw //= 2         # 3x3 stride-2 max pool
    in_ch = 64
    for stage, (blocks, width) in enumerate(zip((3, 4, 6, 3), (64, 128, 256, 512)), start=1):
        out_ch = width * 4
        for block in range(blocks):
            p = f"layer{stage}.{block}"
            stride = 2 if (block == 0 and stage > 1) else 1
            out_hw = hw // stride
            layers += [_conv(f"{p}.conv1", in_ch, width, 1, hw), _bn(f"{p}.bn1", width),
                       _conv(f"{p}.conv2", width, width, 3, out_hw), _bn(f"{p}.bn2", width),
                       _conv(f"{p}.conv3", width, out_ch, 1, out_hw), _bn(f"{p}.bn3", out_ch)]
            if block == 0:
                layers += [_conv(f"{p}.downsample.0", in_ch, out_ch, 1, out_hw),
                           _bn(f"{p}.downsample.1", out_ch)]
            in_ch, hw = out_ch, out_hw
    layers.append(Layer("fc", in_ch * num_classes + num_classes, 2.0 * in_ch * num_classes))
    return layers


def _linear(name: str, fan_in: int, fan_out: int, tokens: int) -> Layer:
    return Layer(name, fan_in * fan_out + fan_out, 2.0 * tokens * fan_in * fan_out)


def bert_base(seq_len: int = 128, hidden: int = 768, layers: int = 12, vocab: int = 30522,
              max_positions: int = 512) -> list[Layer]:
    """BERT-base encoder with pooler (bert-base-uncased: 109,482,240 parameters), forward order.
    Attention's two batched products (QK^T and AV) have no parameters but cost FLOPs."""
    h, ffn, length = hidden, 4 * hidden, seq_len
    table = [Layer("embeddings", (vocab + max_positions + 2) * h + 2 * h, 0.0)]
    for i in range(layers):
        p = f"encoder.{i}"
        table += [_linear(f"{p}.query", h, h, length), _linear(f"{p}.key", h, h, length),
                  _linear(f"{p}.value", h, h, length),
                  Layer(f"{p}.attention_products", 0, 2 * 2.0 * length * length * h),
                  _linear(f"{p}.attention_output", h, h, length), Layer(f"{p}.ln1", 2 * h, 0.0),
                  _linear(f"{p}.intermediate", h, ffn, length),
                  _linear(f"{p}.output", ffn, h, length), Layer(f"{p}.ln2", 2 * h, 0.0)]
    table.append(_linear("pooler", h, h, 1))
    return table


# name -> (layer table builder, default per-GPU batch, what a sample is)
MODELS: dict[str, tuple[Callable[[], list[Layer]], int, str]] = {
    "resnet50": (resnet50, 64, "224x224 image"),
    "bert-base": (bert_base, 32, "128-token sequence"),
}


def model(name: str) -> list[Layer]:
    if name not in MODELS:
        raise ValueError(f"model must be one of {', '.join(MODELS)} (or a layer-table JSON "
                         f"file), got {name!r}")
    return MODELS[name][0]()


def uniform(parameters: int, layers: int = 50) -> list[Layer]:
    """A model known only by its size: ``layers`` equal layers with equal compute."""
    if isinstance(parameters, bool) or not isinstance(parameters, int) or parameters < 1:
        raise ValueError(f"parameters must be an integer >= 1, got {parameters!r}")
    layers = max(1, min(layers, parameters))
    sizes = [parameters // layers + (i < parameters % layers) for i in range(layers)]
    return [Layer(f"layer{i}", size, 1.0) for i, size in enumerate(sizes)]


def layers_from_module(module, example_input) -> list[Layer]:
    """Per-module table of any ``torch.nn.Module`` from one forward pass on ``example_input``
    (batch first): parameters of each leaf module, FLOPs of Linear and Conv layers per sample,
    in the order the forward pass runs them. Unused parameters come last with no FLOPs."""
    import torch

    batch = example_input.shape[0]
    seen: dict[int, Layer] = {}
    order: list[int] = []

    def hook(mod, inputs, output):
        flops = 0.0
        if isinstance(mod, torch.nn.Linear):
            flops = 2.0 * output.numel() * mod.in_features / batch
        elif isinstance(mod, torch.nn.modules.conv._ConvNd):
            per_out = mod.in_channels // mod.groups * math.prod(mod.kernel_size)
            flops = 2.0 * output.numel() * per_out / batch
        if id(mod) not in seen:
            order.append(id(mod))
            seen[id(mod)] = Layer(names[id(mod)], own_params(mod), 0.0)
        prev = seen[id(mod)]
        seen[id(mod)] = Layer(prev.name, prev.params, prev.flops + flops)

    def own_params(mod) -> int:
        return sum(p.numel() for p in mod.parameters(recurse=False) if p.requires_grad)

    names = {id(m): n or type(m).__name__ for n, m in module.named_modules()}
    leaves = [m for m in module.modules() if not list(m.children()) or own_params(m)]
    handles = [m.register_forward_hook(hook) for m in leaves]
    try:
        with torch.no_grad():
            module(example_input)
    finally:
        for handle in handles:
            handle.remove()
    table = [seen[i] for i in order if seen[i].params or seen[i].flops]
    unused = [Layer(names[id(m)], own_params(m), 0.0) for m in leaves
              if id(m) not in seen and own_params(m)]
    return table + unused


# Example inputs (batch of 2) for the data sets of thinwire.train's models, to trace them.
_EXAMPLE_INPUTS = {"digits": ((2, 64), "float"), "mnist5k": ((2, 1, 28, 28), "float"),
                   "synthetic32": ((2, 3, 32, 32), "float"), "stdlib_text": ((2, 64), "long")}


def own_model(name: str) -> list[Layer] | None:
    """The table of a model of thinwire's own runs (``thinwire.train.models``), traced with
    :func:`layers_from_module`; None where that model or its input shape is unknown."""
    try:
        from thinwire.train import models as train_models
    except ImportError:
        return None
    if name not in getattr(train_models, "MODELS", {}):
        return None
    import torch

    shape_kind = _EXAMPLE_INPUTS.get(train_models.MODELS[name][1])
    if shape_kind is None:
        return None
    shape, kind = shape_kind
    example = torch.zeros(shape, dtype=torch.long if kind == "long" else torch.float32)
    return layers_from_module(train_models.build(name, 0), example)


def timed(layers: list[Layer], dev_flops: float, batch: int) -> list[TimedLayer]:
    """Per-layer forward and backward seconds for a per-GPU ``batch`` at ``dev_flops``."""
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise ValueError(f"batch_size must be an integer >= 1, got {batch!r}")
    if not dev_flops > 0:
        raise ValueError(f"device FLOP/s must be > 0, got {dev_flops!r}")
    return [TimedLayer(l.name, l.params, l.flops * batch / dev_flops,
                       2 * l.flops * batch / dev_flops) for l in layers]


def read_layer_table(path: str | Path) -> list[TimedLayer]:
    """Measured per-layer times: a JSON list (or ``{"layers": [...]}``) of objects with
    ``params`` (gradient elements), ``forward_s`` and ``backward_s``, in forward order
    (``name`` optional; ``forward_ms``/``backward_ms`` accepted too)."""
    data = read_json(path, "layer table")
    rows = data.get("layers") if isinstance(data, dict) else data
    if not isinstance(rows, list) or not rows:
        raise ValueError(f"{path}: expected a non-empty list of layers (or {{'layers': [...]}})")
    table = []
    for i, row in enumerate(rows):
        try:
            fwd = row["forward_s"] if "forward_s" in row else row["forward_ms"] / 1e3
            bwd = row["backward_s"] if "backward_s" in row else row["backward_ms"] / 1e3
            layer = TimedLayer(str(row.get("name", f"layer{i}")), int(row["params"]),
                               float(fwd), float(bwd))
        except (KeyError, TypeError) as exc:
            raise ValueError(f"{path}: layer {i} needs params, forward_s (or forward_ms) and "
                             f"backward_s (or backward_ms); problem: {exc!r}") from None
        if layer.params < 0 or not (0 <= layer.forward_s < math.inf
                                    and 0 <= layer.backward_s < math.inf):
            raise ValueError(f"{path}: layer {i} needs params >= 0 and finite times >= 0, "
                             f"got params {layer.params}, forward {layer.forward_s} s, backward "
                             f"{layer.backward_s} s")
        table.append(layer)
    return table
