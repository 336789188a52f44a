"""Training: `thinwire train` (one model, one algorithm, torchrun-compatible) and
`thinwire compare` (every algorithm on the emulated cluster, one table, two plots).

    from thinwire.train import TrainConfig, train
    summary = train(TrainConfig(model="lenet", algorithm="hitopk", density=0.01, epochs=2))
"""

from thinwire.train.config import TrainConfig
from thinwire.train.loop import train

__all__ = ["TrainConfig", "train"]
