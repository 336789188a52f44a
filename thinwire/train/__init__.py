"""Training: `thinwire train` (one model, one algorithm, torchrun-compatible) and
`thinwire compare` (every algorithm raced to a target quality on the emulated cluster).

    from thinwire.train import TrainConfig, train
    summary = train(TrainConfig(model="lenet", algorithm="hitopk", density=0.01, epochs=2))
"""

from thinwire.train.config import TrainConfig
from thinwire.train.entry import train

__all__ = ["TrainConfig", "train"]
