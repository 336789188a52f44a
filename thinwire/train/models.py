"""The models `thinwire train` knows, each paired with the data set it trains on.

| name          | data          | parameters | what it is for                                    |
|---------------|---------------|-----------:|---------------------------------------------------|
| `mlp`         | digits        |       ~19k | seconds-long runs: tests, accuracy checks         |
| `lenet`       | mnist5k       |       ~61k | LeNet-5 on real MNIST images                      |
| `widecnn`     | mnist5k       |      ~3.3M | `thinwire compare`'s default: gradient volume decides |
| `resnet`      | synthetic32   |       ~78k | a CIFAR-style ResNet for throughput               |
| `transformer` | stdlib_text   |      ~1.7M | byte-level causal LM: compare's `lm` workload     |
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F


class MLP(nn.Module):
    def __init__(self, inputs: int = 64, hidden: int = 256, classes: int = 10):
        super().__init__()
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(inputs, hidden), nn.ReLU(),
                                 nn.Linear(hidden, classes))

    def forward(self, x):
        return self.net(x)


class LeNet(nn.Module):
    def __init__(self, classes: int = 10):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 6, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(6, 16, 5), nn.ReLU(), nn.MaxPool2d(2))
        self.classifier = nn.Sequential(
            nn.Flatten(), nn.Linear(16 * 5 * 5, 120), nn.ReLU(), nn.Linear(120, 84), nn.ReLU(),
            nn.Linear(84, classes))

    def forward(self, x):
        return self.classifier(self.features(x))


class WideCNN(nn.Module):
    """Two convolutions and a wide fully connected layer: ~3.3M parameters, almost all in one
    matrix, and cheap to compute - the shape of network where the wire, not the CPU, decides."""

    def __init__(self, classes: int = 10, width: int = 32, hidden: int = 1024):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, width, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(width, 2 * width, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2))
        self.classifier = nn.Sequential(
            nn.Flatten(), nn.Linear(2 * width * 7 * 7, hidden), nn.ReLU(),
            nn.Linear(hidden, classes))

    def forward(self, x):
        return self.classifier(self.features(x))


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = nn.Sequential()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                          nn.BatchNorm2d(cout))

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(out)) + self.shortcut(x))


class ResNet(nn.Module):
    """CIFAR-style ResNet (He et al. 2016, section 4.2): 3 stages of ``blocks`` basic blocks,
    widths 16/32/64; ``blocks=1`` is ResNet-8."""

    def __init__(self, classes: int = 10, blocks: int = 1, width: int = 16):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, width, 3, 1, 1, bias=False),
                                  nn.BatchNorm2d(width), nn.ReLU())
        layers, cin = [], width
        for stage, cout in enumerate((width, 2 * width, 4 * width)):
            for b in range(blocks):
                layers.append(BasicBlock(cin, cout, 2 if stage and b == 0 else 1))
                cin = cout
        self.layers = nn.Sequential(*layers)
        self.head = nn.Linear(cin, classes)

    def forward(self, x):
        out = self.layers(self.stem(x))
        return self.head(F.adaptive_avg_pool2d(out, 1).flatten(1))


class ByteTransformer(nn.Module):
    """A small GPT-style causal language model over bytes (pre-norm blocks, learned positions,
    tied input and output embeddings)."""

    # dim 256: ~1.7M parameters, so that at 8 blocks of 64 bytes a rank DDP's all-reduce at
    # 200 Mbit/s between two nodes takes longer than the step's compute (docs/benchmarks.md)
    def __init__(self, vocab: int = 256, block: int = 64, dim: int = 256, layers: int = 2,
                 heads: int = 4):
        super().__init__()
        self.tokens = nn.Embedding(vocab, dim)
        self.positions = nn.Parameter(torch.zeros(block, dim))
        layer = nn.TransformerEncoderLayer(dim, heads, 4 * dim, dropout=0.0, batch_first=True,
                                           norm_first=True, activation="gelu")
        self.blocks = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(dim)
        nn.init.normal_(self.positions, std=0.02)
        nn.init.normal_(self.tokens.weight, std=0.02)

    def forward(self, x):
        t = x.shape[1]
        mask = nn.Transformer.generate_square_subsequent_mask(t, device=x.device)
        h = self.tokens(x) + self.positions[:t]
        h = self.norm(self.blocks(h, mask=mask, is_causal=True))
        return h @ self.tokens.weight.t()  # (batch, time, vocab)


# name -> (constructor, data set, default learning rate for SGD with momentum)
MODELS = {
    "mlp": (MLP, "digits", 0.1),
    "lenet": (LeNet, "mnist5k", 0.05),
    "widecnn": (WideCNN, "mnist5k", 0.05),
    "resnet": (ResNet, "synthetic32", 0.1),
    "transformer": (ByteTransformer, "stdlib_text", 0.1),
}


def check_model(name: str) -> str:
    if name not in MODELS:
        raise ValueError(f"--model must be one of {', '.join(MODELS)}, got {name!r}")
    return name


def build(name: str, seed: int) -> nn.Module:
    """The model ``name`` with weights drawn from ``seed`` (identical on every rank)."""
    check_model(name)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return MODELS[name][0]()


def data_name(model: str) -> str:
    return MODELS[check_model(model)][1]


def default_lr(model: str) -> float:
    return MODELS[check_model(model)][2]


def loss_and_correct(model: nn.Module, x: torch.Tensor, y: torch.Tensor):
    """Cross-entropy loss and the number of correct predictions (tokens for a language model)."""
    logits = model(x)
    if logits.dim() == 3:
        logits, y = logits.reshape(-1, logits.shape[-1]), y.reshape(-1)
    loss = F.cross_entropy(logits, y)
    correct = (logits.argmax(dim=1) == y).sum()
    return loss, correct, y.numel()
