"""The bundled data set a pipeline run trains on (``PipelineConfig.dataset``): the library's
engines take it as an argument, the application chooses it."""

from __future__ import annotations

from thinwire.pipeline.config import DATASETS, PipelineConfig
from thinwire.train import data

LOADERS = {"digits": data.digits, "mnist5k": data.mnist5k}
assert set(LOADERS) == set(DATASETS), "every name PipelineConfig accepts has a loader"


def load(cfg: PipelineConfig) -> data.Dataset:
    """``cfg.dataset``'s data set (checked by ``PipelineConfig.validate``)."""
    return LOADERS[cfg.dataset]()
