"""Rank functions of test_replan (importable by the spawned ranks)."""

from thinwire.train import auto, loop, replan
from thinwire.train.compare import CompareSettings

EFFICIENCY = 0.85  # plan_helpers.TRUE's: the plan turns goodput into a nominal rate with it


def _scripted_probe(rates_bps):
    """probe_inter_node returning the goodputs of ``rates_bps`` in turn (the first is the
    first choice's), so the test knows which link each check saw."""
    rates = iter(rates_bps)

    def probe(ranks_per_node, timeout_s=None, sizes=None, repeats=1, leaders_group=None,
              world_group=None):
        small, large = sizes or (1 << 20, 2 << 20)
        return {"nodes": 2, "goodput_Bps": next(rates) / 8 * EFFICIENCY,
                "small_bytes": small, "small_s": 0.0, "large_bytes": large, "large_s": 0.0}
    return probe


def train_with_replanning(rank, world, results_path, rates_bps, max_iters=7):
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


def _auto_config(results_path, world, stop_at_target=True, **train):
    return CompareSettings(workload="mnist", algorithms=["auto"], nodes=world, ranks_per_node=1,
                           stop_at_target=stop_at_target, train={"plan_from": results_path, "replan_every_s": 1e-9,
                                  "compute_probe_iters": 0, **train}).run_config("auto")


def switch_checkpoint_and_resume(rank, world, results_path, rates_bps, directory):
    """Train with auto, switching at step 4 where a checkpoint is due too (its two files then
    straddle the switch: step 2 under hitopk, step 5 under allreduce with the switch's
    residuals not delivered yet), then resume from them with --algorithm auto."""
    import dataclasses

    from thinwire.train import checkpoint
    auto.probe_inter_node = _scripted_probe(rates_bps)
    saved, left, real_save = [], [], checkpoint.save

    def save(path, r, payload):
        saved.append(payload["step"])
        left.append(None if payload["handover"] is None else payload["handover"]["left"])
        return real_save(path, r, payload)
    checkpoint.save = save
    cfg = _auto_config(results_path, world, max_iters=5, checkpoint=directory,
                       checkpoint_every=2, handover_steps=8)
    first = loop.train(cfg)
    # the restart sees the slow link again, where the plan's choice is hitopk: it goes on
    # with the checkpoint's (allreduce), whose state the checkpoint holds
    auto.probe_inter_node = _scripted_probe([5e7])
    resumed = loop.train(dataclasses.replace(cfg, replan_every_s=0.0, resume=directory,
                                             max_iters=8))
    # restarted where the plan cannot choose (a spot node lost: a shape without steps): the
    # checkpoint's choice goes on, re-planning off although the configuration asks for it

    def cannot_plan(*args, **kwargs):
        raise ValueError("no steps to target measured for mnist on 2 x 1 (scripted)")
    auto.choose = cannot_plan
    auto.probe_inter_node = _scripted_probe([5e7])
    again = loop.train(dataclasses.replace(cfg, resume=directory, max_iters=10))
    return {"first": first if rank == 0 else None, "saved": saved, "left": left,
            "resumed": resumed if rank == 0 else None, "again": again if rank == 0 else None}


def replan_without_evaluations(rank, world, results_path, rates_bps):
    """--eval-every 0: the checks come at the end of each epoch (62 steps of 2 x 32 of
    MNIST's 4,000; two steps into the second)."""
    import dataclasses

    auto.probe_inter_node = _scripted_probe(rates_bps)
    cfg = _auto_config(results_path, world, stop_at_target=False, max_iters=64)
    cfg = dataclasses.replace(cfg, eval_every=0)
    summary = loop.train(cfg)
    return {"summary": summary if rank == 0 else None}
