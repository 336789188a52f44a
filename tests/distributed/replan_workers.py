"""Rank functions of test_replan (importable by the spawned ranks)."""

from thinwire.train import auto, loop, replan
from thinwire.train.compare import CompareSettings

EFFICIENCY = 0.85  # plan_helpers.TRUE's: the plan turns goodput into a nominal rate with it


def _scripted_probe(rates_bps):
    """probe_inter_node returning the goodputs of ``rates_bps`` in turn (the first is the
    first choice's), so the test knows which link each check saw."""
    rates = iter(rates_bps)

    def probe(ranks_per_node, timeout_s=None, sizes=None, repeats=1, leaders_group=None):
        small, large = sizes or (1 << 20, 2 << 20)
        return {"nodes": 2, "goodput_Bps": next(rates) / 8 * EFFICIENCY,
                "small_bytes": small, "small_s": 0.0, "large_bytes": large, "large_s": 0.0}
    return probe


def train_with_replanning(rank, world, results_path, rates_bps, max_iters=6):
    auto.probe_inter_node = _scripted_probe(rates_bps)
    seen = {}
    real_switch = replan.switch

    def switch(cfg, chosen, sync, *args):
        seen["old_state"], seen["old_steps"] = sync.state, getattr(sync.state, "steps", None)
        return real_switch(cfg, chosen, sync, *args)
    replan.switch = switch
    cfg = CompareSettings(workload="mnist", algorithms=["auto"], nodes=world, ranks_per_node=1,
                          train={"plan_from": results_path, "replan_every_s": 1e-9,
                                 "max_iters": max_iters,
                                 # the plan at the calibration's compute: the synthetic
                                 # races' crossings are known by construction there
                                 "compute_probe_iters": 0}).run_config("auto")
    summary = loop.train(cfg)
    old = seen.get("old_state")
    return {"summary": summary if rank == 0 else None,
            "old_steps_at_switch": seen.get("old_steps"),
            "old_steps_at_end": getattr(old, "steps", None)}
