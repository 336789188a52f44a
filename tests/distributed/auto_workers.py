"""Rank functions of test_auto_resolve (importable by the spawned ranks)."""

from thinwire.train import auto
from thinwire.train.compare import CompareSettings


def resolve(rank, world, results_path, ranks_per_node, batch_size=32):
    cfg = CompareSettings(workload="mnist", algorithms=["auto"], nodes=world // ranks_per_node,
                          ranks_per_node=ranks_per_node,
                          train={"plan_from": results_path, "batch_size": batch_size}
                          ).run_config("auto")
    try:
        chosen, info = auto.resolve(cfg)
    except ValueError as exc:
        return {"error": str(exc)}
    return {"algorithm": chosen.algorithm, "plan_from": chosen.plan_from,
            "choice": info["choice"], "goodput": info["probe"]["goodput_Bps"],
            "planned_at_bps": info["planned_at_bps"]}
