"""DiLoCo's input checks and fragment schedule (no process group needed: every check runs
before the topology is used)."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from thinwire.local_sgd import DiLoCo
from thinwire.local_sgd.fragments import phase, split


class _NoGroups:
    """Stands in for a Topology: SyncState only stores it until a reduce."""
    world_size, rank, ranks_per_node, nodes, node, local_rank = 1, 0, 1, 1, 0, 0


def _model():
    return nn.Sequential(nn.Linear(4, 3), nn.Linear(3, 2))  # 4 parameter tensors


def _make(model=None, opt=None, **kwargs):
    model = model or _model()
    opt = opt or torch.optim.SGD(model.parameters(), lr=0.1)
    kwargs.setdefault("sync_every", 4)
    return DiLoCo(model, opt, topology=_NoGroups(), **kwargs)


@pytest.mark.parametrize("kwargs,message", [
    (dict(sync_every=0), "sync_every must be an int >= 1, got 0"),
    (dict(sync_every=2.5), "sync_every must be an int >= 1, got 2.5"),
    (dict(fragments=5, sync_every=8), "fragments must be at most the number of parameter "
                                      "tensors (4), got 5"),
    (dict(fragments=0), "fragments must be an int >= 1, got 0"),
    (dict(fragments=0, overlap=True), "fragments must be an int >= 1, got 0"),
    (dict(fragments=True), "fragments must be an int >= 1, got True"),
    (dict(fragments=4, sync_every=3), "fragments must be at most sync_every (3)"),
    (dict(outer_lr=0), "outer_lr must be a finite number > 0, got 0"),
    (dict(outer_momentum=1.0), "outer_momentum must be a number in [0, 1), got 1.0"),
    (dict(local_weight=1.5, overlap=True), "local_weight must be a number in [0, 1], got 1.5"),
    (dict(local_weight=0.3), "local_weight applies with overlap=True"),
    (dict(selector="exact"), "selector applies to the top-k of a sparse algorithm"),
    (dict(algorithm="sparseloco", density=0.1, selector="exact"),
     "selector applies to the top-k of a sparse algorithm"),
    (dict(overlap=True, delay=4, sync_every=4), "delay must be in [1, sync_every // fragments "
                                                "- 1] = [1, 3]"),
    (dict(overlap=True, fragments=2, sync_every=2), "no room to overlap"),
    (dict(delay=2), "delay must be 0 without overlap"),
    (dict(algorithm="hitopk"), "density is required with the sparse algorithm 'hitopk'"),
    (dict(algorithm="ring"), "algorithm must be one of"),
    (dict(algorithm="hitopk", density=2.0), "density"),
])
def test_bad_input_is_named(kwargs, message):
    with pytest.raises(ValueError) as info:
        _make(**kwargs)
    assert message in str(info.value)


def test_inner_optimizer_must_own_the_parameters():
    model = _model()
    partial = torch.optim.SGD(model[0].parameters(), lr=0.1)
    with pytest.raises(ValueError, match=r"inner_optimizer must own every trainable parameter.*"
                                         r"parameters \[2, 3\]"):
        _make(model, partial)
    with pytest.raises(TypeError, match="inner_optimizer must be a torch.optim.Optimizer"):
        DiLoCo(model, object(), sync_every=2, topology=_NoGroups())


def test_frozen_parameters_are_not_synchronised():
    model = _model()
    model[0].weight.requires_grad_(False)
    diloco = _make(model, torch.optim.SGD([p for p in model.parameters() if p.requires_grad],
                                          lr=0.1))
    assert len(diloco.params) == 3


def test_split_is_contiguous_balanced_and_non_empty():
    params = [torch.zeros(n) for n in (100, 1, 1, 50, 50, 1)]
    runs = split(params, 3)
    assert [i for run in runs for i in run] == list(range(6))
    assert all(runs)
    assert runs == [[0], [1, 2, 3], [4, 5]]
    assert split(params, 6) == [[i] for i in range(6)]
    assert split(params, 1) == [list(range(6))]


def test_phases_are_staggered_and_the_last_keeps_plain_diloco_phase():
    assert [phase(f, 1, 8) for f in range(1)] == [0]
    assert [phase(f, 4, 8) for f in range(4)] == [2, 4, 6, 0]
    assert [phase(f, 3, 7) for f in range(3)] == [2, 4, 0]
    assert len({phase(f, 5, 5) for f in range(5)}) == 5


def test_state_dict_refuses_another_configuration():
    a = _make(sync_every=4)
    b = _make(sync_every=5)
    with pytest.raises(ValueError, match="checkpoint is for DiLoCo"):
        b.load_state_dict(a.state_dict())
    with pytest.raises(ValueError, match="not a DiLoCo checkpoint"):
        b.load_state_dict({"format": "something else"})
