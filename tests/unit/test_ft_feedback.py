"""Error feedback when a fault-tolerant step does not commit, when a node leaves and when one
joins (issue 32, item 2), checked against a run that never took the abandoned step, in a world
of one (the bookkeeping is per rank)."""

from __future__ import annotations

import pytest
import torch

from thinwire.state import SyncState
from thinwire.topology import Topology

SIZE = 4000


def _grads(seed: int, steps: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(SIZE, generator=g, dtype=torch.float64) for _ in range(steps)]


def _state(topology, algorithm, momentum):
    return SyncState(topology, algorithm=algorithm, density=0.05, momentum_correction=momentum,
                     dense_below_bytes=0)


def _step(state, grad):
    out = state.reduce(0, grad.clone())
    state.end_step()
    return out


@pytest.mark.filterwarnings("ignore:hitopk on a single node")
@pytest.mark.parametrize("algorithm", ["topk_allgather", "hitopk", "topk_a2a"])
@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_a_rolled_back_step_leaves_no_trace(world_of_one, algorithm, momentum):
    topology = Topology.build(1)
    try:
        grads, abandoned = _grads(0, 4), _grads(1, 1)[0]
        reference, tried = _state(topology, algorithm, momentum), _state(topology, algorithm,
                                                                         momentum)
        expected = [_step(reference, g) for g in grads]
        got = [_step(tried, grads[0])]
        snap = tried.snapshot()
        _step(tried, abandoned)           # the quorum did not commit this one
        tried.rollback(snap)
        got += [_step(tried, g) for g in grads[1:]]
        for a, b in zip(expected, got):
            assert torch.equal(a, b)
        assert tried.steps == reference.steps == 4
        for index, residual in reference.feedback.residuals.items():
            assert torch.equal(tried.feedback.residuals[index], residual)
        for index, velocity in reference.feedback.velocities.items():
            assert torch.equal(tried.feedback.velocities[index], velocity)
    finally:
        topology.close()


def test_sent_plus_kept_is_the_corrected_input_across_a_rollback(world_of_one):
    """Conservation in a world of one without momentum: everything that entered the residual
    books either went out or is still held, also with a step abandoned in between."""
    topology = Topology.build(1)
    try:
        state = _state(topology, "topk_allgather", 0.0)
        grads = _grads(2, 5)
        sent = torch.zeros(SIZE, dtype=torch.float64)
        for i, grad in enumerate(grads):
            snap = state.snapshot()
            if i == 2:
                _step(state, grad * 100)  # abandoned
                state.rollback(snap)
            sent += _step(state, grad)
        held = sum(state.feedback.residuals.values())
        assert torch.allclose(sent + held, sum(grads), rtol=0, atol=1e-12)
        mass = state.residual_mass()
        assert mass["sum"] == pytest.approx(float(held.sum()))
        assert mass["l1"] == pytest.approx(float(held.abs().sum()))
        assert mass["elements"] == SIZE
    finally:
        topology.close()


def test_a_joining_rank_takes_everything_but_the_donors_residual(world_of_one):
    topology = Topology.build(1)
    try:
        donor = _state(topology, "topk_allgather", 0.9)
        for grad in _grads(3, 3):
            _step(donor, grad)
        healed = _state(topology, "topk_allgather", 0.9)
        healed.load_state_dict(donor.healing_state_dict())
        assert healed.steps == donor.steps == 3
        assert healed.feedback.residuals == {} and healed.feedback.velocities == {}
        assert healed.residual_mass() == {"l1": 0.0, "sum": 0.0, "elements": 0}
        assert donor.residual_mass()["l1"] > 0  # the donor keeps its own
    finally:
        topology.close()
