"""Rank functions of test_auto_resolve (importable by the spawned ranks)."""

from thinwire.train import auto
from thinwire.train.compare import CompareSettings


def resolve(rank, world, results_path, ranks_per_node, batch_size=32, compute_ms=None):
    cfg = CompareSettings(workload="mnist", algorithms=["auto"], nodes=world // ranks_per_node,
                          ranks_per_node=ranks_per_node,
                          train={"plan_from": results_path, "batch_size": batch_size}
                          ).run_config("auto")
    try:
        measure = None if compute_ms is None else (lambda: compute_ms[rank])
        chosen, info = auto.resolve(cfg, measure)
    except ValueError as exc:
        return {"error": str(exc)}
    return {"algorithm": chosen.algorithm, "plan_from": chosen.plan_from,
            "choice": info["choice"], "goodput": info["probe"]["goodput_Bps"],
            "planned_at_bps": info["planned_at_bps"], "compute": info["compute"],
            "probe": info["probe"]}


def register_auto(rank, world, plans):
    """thinwire.ddp.register(..., "auto", plan=plans[rank]) and one step of a linear model."""
    import copy

    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    import thinwire.ddp

    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(8, 4))
    try:
        state = thinwire.ddp.register(model, "auto", plan=plans[rank], ranks_per_node=1)
    except ValueError as exc:
        return {"error": str(exc)}
    torch.manual_seed(1 + rank)
    x = torch.randn(16, 8)
    alone = copy.deepcopy(model.module)  # this rank's own gradient, for the reference
    alone(x).square().sum().backward()
    model(x).square().sum().backward()
    return {"algorithm": state.algorithm, "wire": state.wire,
            "choice": state.auto["choice"], "probe": state.auto["probe"],
            "grad": model.module.weight.grad.clone(), "own_grad": alone.weight.grad.clone()}


def train_auto(rank, world, results_path):
    """thinwire train's loop with --algorithm auto: its compute probe times the run's model."""
    from thinwire.train import loop

    cfg = CompareSettings(workload="mnist", algorithms=["auto"], nodes=world, ranks_per_node=1,
                          train={"plan_from": results_path, "replan_every_s": 0.0,
                                 "max_iters": 2, "compute_probe_iters": 2}).run_config("auto")
    summary = loop.train(cfg)
    return summary.get("auto") if rank == 0 else None
