"""Large-batch optimizers with a fused update: LARS and LAMB, their parameter groups, the
warm-up schedules and the linear scaling rule, and fp32 master weights for mixed precision.

    from thinwire.optim import LARS, param_groups, warmup_poly, linear_scaled_lr
    opt = LARS(param_groups(model, weight_decay=5e-5), lr=linear_scaled_lr(0.1, 8192))
    sched = warmup_poly(opt, total_steps=steps, warmup_steps=steps // 20)
"""

from thinwire.optim.groups import is_bias_or_norm, param_groups
from thinwire.optim.lamb import LAMB
from thinwire.optim.lars import LARS
from thinwire.optim.master import MasterWeights
from thinwire.optim.schedules import (WarmupCosine, WarmupPoly, linear_scaled_lr,
                                      warmup_cosine, warmup_poly)

__all__ = [
    "LARS", "LAMB", "MasterWeights", "param_groups", "is_bias_or_norm",
    "warmup_poly", "warmup_cosine", "WarmupPoly", "WarmupCosine", "linear_scaled_lr",
]
