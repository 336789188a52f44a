"""CPR: checkpointing with partial recovery for sharded recommender training.

    from thinwire.recsys.cpr import CPRConfig, TimeModel, plan, failure_schedule
    p = plan(t_save=180, t_load=180, t_res=120, mtbf=72000, n_emb=8, pls_target=0.02)

See docs/design.md, section "CPR", and `thinwire bench cpr`.
"""

from thinwire.recsys.cpr.overhead import (MODES, Plan, best_full_interval, full_overhead,
                                          interval_for_pls, partial_overhead, plan, pls)
from thinwire.recsys.cpr.schedule import Failure, failure_schedule
from thinwire.recsys.cpr.store import (CheckpointStore, CorruptCheckpoint, apply_rows,
                                       restore_shard, rows_state)
from thinwire.recsys.cpr.trainer import CPRConfig, RunStats, ShardedTrainer, TimeModel, run, summary

__all__ = ["MODES", "CPRConfig", "CheckpointStore", "CorruptCheckpoint", "Failure", "Plan",
           "RunStats", "ShardedTrainer", "TimeModel", "apply_rows", "best_full_interval",
           "failure_schedule", "full_overhead", "interval_for_pls", "partial_overhead", "plan",
           "pls", "restore_shard", "rows_state", "run", "summary"]
