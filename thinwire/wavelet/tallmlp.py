"""A model whose memory is its activations: the shape of job Wavelet is for.

`tallmlp` (on the digits): a wide input layer, ``blocks`` residual tanh blocks that compute
almost nothing but each keep a ``width``-float activation per sample for the backward (about
1 MiB a sample at the defaults), then a narrow head. About 3.2M parameters (13 MB of gradient),
so a thin wire matters too. thinwire's own models are small in activations next to a process's
~150 MB of runtime, so a node limit they "just fit" leaves no valley worth filling.
"""

from __future__ import annotations

import torch
from torch import nn

from thinwire.train import models

NAME = "tallmlp"


class TallMLP(nn.Module):
    def __init__(self, inputs: int = 64, width: int = 16384, blocks: int = 16,
                 hidden: int = 128, classes: int = 10):
        super().__init__()
        self.blocks = blocks
        self.inp = nn.Linear(inputs, width)
        self.mix = nn.Linear(width, hidden)
        self.out = nn.Linear(hidden, classes)

    def forward(self, x):
        h = self.inp(x.flatten(1)) / 4
        for _ in range(self.blocks):  # tanh keeps its output for the backward: width floats
            h = h + 0.25 * torch.tanh(h)
        return self.out(torch.relu(self.mix(h) / 8))


class TallMLPMnist(TallMLP):
    """On MNIST-5k (4,000 training images, room for large batches): 128 blocks of 4096, about
    2 MiB of activations a sample, 3.7M parameters."""

    def __init__(self):
        super().__init__(inputs=784, width=4096, blocks=128, hidden=128)


def register() -> None:
    """Adds `tallmlp` and `tallmlp-mnist` to `thinwire.train.models.MODELS` in this process
    (the wave entry point `python -m thinwire.wavelet` calls it; `thinwire train` does not know
    them)."""
    models.MODELS.setdefault(NAME, (TallMLP, "digits", 0.05))
    models.MODELS.setdefault(NAME + "-mnist", (TallMLPMnist, "mnist5k", 0.05))
