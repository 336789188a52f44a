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
