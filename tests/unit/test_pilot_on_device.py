"""thinwire.ddp.replan's pilot where the gradients live (issue 31 on issue 30's devices): the
switches it makes to measure a runner-up and back flush the residuals on the gradient's device,
and what the steps delivered plus what is still held is every step's gradient (sent + kept =
corrected). A world of one on a scripted clock; on CUDA when the `device` tool lends a GPU
(NCCL), else on the CPU (gloo), so the test's logic stays covered in CI."""

from __future__ import annotations

import copy
import sys
import types
import warnings
from pathlib import Path

import pytest
import torch
from torch.nn.parallel import DistributedDataParallel as DDP

import thinwire.ddp
from thinwire import ddp_auto, plan_choice
from thinwire.ddp import _context_of

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_plan_choice import _with_steps, plan_of  # noqa: E402

HAS_CUDA = torch.cuda.is_available()
DEVICE = torch.device("cuda") if HAS_CUDA else torch.device("cpu")
BACKEND = "cpu:gloo,cuda:nccl" if HAS_CUDA else "gloo"


@pytest.mark.parametrize("world_of_one", [BACKEND], indirect=True)
@pytest.mark.parametrize("step_s, final", [
    ({"hitopk": 0.2, "allreduce": 0.1}, "allreduce"),
    ({"hitopk": 0.1, "allreduce": 0.2}, "hitopk"),
    # hitopk measured 3% ahead (both 100 steps to target): under PILOT_MARGIN, not worth a flush
    ({"hitopk": 0.1, "allreduce": 0.103}, "allreduce"),
])
def test_the_pilot_switches_and_back_on_the_device_and_delivers_every_gradient(
        world_of_one, monkeypatch, step_s, final):
    clock = [0.0]
    monkeypatch.setattr(ddp_auto, "time", types.SimpleNamespace(perf_counter=lambda: clock[0]))
    torch.manual_seed(0)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(),
                                    torch.nn.Linear(32, 8)).to(DEVICE))
    settings = {"dense_below_bytes": 0}  # these small buckets compressed, not sent dense
    plan = _with_steps(plan_of(nodes=1))  # hitopk 10 s, the fp32 all-reduce 12 s: piloted
    algorithm, chosen = plan_choice.candidate_hook(plan, "hitopk d=0.05")
    state = thinwire.ddp.register(model, algorithm, **chosen, **settings, ranks_per_node=1)
    state.auto = {"choice": "hitopk d=0.05", "probe": None}
    # what registering with algorithm="auto" keeps (its probe needs 2 nodes; this is one)
    _context_of(model).auto = ddp_auto.AutoContext(plan, settings, 12.5e6 / 8, DEVICE)
    reference = copy.deepcopy(model.module)
    g = torch.Generator().manual_seed(1)
    delivered = [torch.zeros_like(p) for p in model.parameters()]
    events = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a hierarchical method on one node
        for _ in range(2 * ddp_auto.PACE_CALLS + 3):
            x = torch.randn(16, 64, generator=g).to(DEVICE)
            reference(x).square().sum().backward()
            model(x).square().sum().backward()
            for total, p in zip(delivered, model.parameters()):
                total += p.grad
            model.zero_grad(set_to_none=True)
            clock[0] += step_s[thinwire.ddp.state_of(model).algorithm]
            events.append(thinwire.ddp.replan(model, every_s=3600.0, pilot=1))
        flushed, mass = thinwire.ddp.flush_residuals(model)
    assert [(i + 1, e["measured"]) for i, e in enumerate(events) if e] == \
        [(6, "hitopk d=0.05"), (12, "ddp")]
    assert thinwire.ddp.state_of(model).algorithm == final
    decided = [e for e in events if e][-1]
    assert decided["best"] == min(decided["predicted_at_pace_s"],
                                  key=decided["predicted_at_pace_s"].get)
    for total, held, want in zip(delivered, flushed or [None] * len(delivered),
                                 reference.parameters()):
        assert total.device.type == DEVICE.type
        got = total + (held if held is not None else 0)
        torch.testing.assert_close(got.cpu(), want.grad.cpu(), rtol=1e-4, atol=1e-4)
    # hitopk holds mass back; the dense all-reduce none of its own, but the shares a switch to
    # it still owes (handed over in plan_choice.HANDOVER_STEPS steps) are flushed with it
    assert (flushed is None or "owed_from_a_switch" in mass) if final == "allreduce" \
        else flushed is not None


@pytest.mark.parametrize("world_of_one", [BACKEND], indirect=True)
def test_a_pilot_waits_for_the_callers_dense_warm_up(world_of_one, monkeypatch):
    """dense_iterations=3: the pilot's first pace is measured after the dense steps."""
    clock = [0.0]
    monkeypatch.setattr(ddp_auto, "time", types.SimpleNamespace(perf_counter=lambda: clock[0]))
    model = DDP(torch.nn.Linear(32, 8).to(DEVICE))
    settings = {"dense_below_bytes": 0, "dense_iterations": 3}  # sparse-only: two sparse ones
    plan = _with_steps(plan_of(nodes=1))
    for at in plan["plans"]:
        for row in at["rows"]:
            if row["candidate"] == "ddp":
                row.update(candidate="topk_allgather d=0.05", algorithm="topk_allgather",
                           settings={"density": 0.05})
    algorithm, chosen = plan_choice.candidate_hook(plan, "hitopk d=0.05")
    state = thinwire.ddp.register(model, algorithm, **chosen, **settings, ranks_per_node=1)
    state.auto = {"choice": "hitopk d=0.05", "probe": None}
    _context_of(model).auto = ddp_auto.AutoContext(plan, settings, 12.5e6 / 8, DEVICE)
    events = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        for step in range(1, 12):
            model(torch.randn(4, 32).to(DEVICE)).sum().backward()
            model.zero_grad(set_to_none=True)
            clock[0] += 1.0 if step <= 3 else 0.1  # dense steps are slow
            events.append(thinwire.ddp.replan(model, every_s=3600.0, pilot=1))
    first = next(e for e in events if e)
    # listed at the call after step 3, which starts the pace; steps 4-8 measure it
    assert first["step"] == 3 + ddp_auto.PACE_CALLS and first["pace_s"] == pytest.approx(0.1)
    assert first["switched_to"] == "topk_allgather d=0.05"
