"""Pipeline-parallel training: fine-grained pipelined backpropagation (``pb``) at batch size one
with Spike Compensation and Linear Weight Prediction, and the ``gpipe`` and ``1f1b`` baselines,
as a multi-process engine (one stage per rank) and an exact single-process emulation."""

from thinwire.pipeline.config import PipelineConfig, scale_for_batch_one
from thinwire.pipeline.optim import StageSGD
from thinwire.pipeline.schedules import SCHEDULES, build, delay_formula, measured_delays
from thinwire.pipeline.split import as_stages, balanced_cuts, mlp, split_sequential

__all__ = ["PipelineConfig", "scale_for_batch_one", "StageSGD", "SCHEDULES", "build",
           "delay_formula", "measured_delays", "as_stages", "balanced_cuts", "mlp",
           "split_sequential"]
