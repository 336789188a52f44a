"""Topology and DiLoCo release their process groups (issue 33, item 6): built and closed 200
times in one process, the file descriptors stay flat (each build opened ~12-18 and a sweep in
one process ran out of them after ~70 cycles)."""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist

from thinwire.local_sgd import DiLoCo
from thinwire.topology import Topology


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_topologies_built_and_closed_in_a_loop_keep_the_fds_flat(world_of_one):
    Topology.build(1).close()  # the first build may open lasting things (threads, caches)
    before = _fds()
    for _ in range(200):
        with Topology.build(1) as topology:
            assert topology.world is not None
    assert _fds() <= before + 2
    assert topology.world is None  # closed: not usable any more
    shared = Topology.shared(1)
    shared.close()
    assert Topology.shared(1) is not shared  # a closed shared topology leaves the cache


def test_dilocos_built_and_closed_in_a_loop_keep_the_fds_flat(world_of_one):
    def one() -> None:
        model = torch.nn.Linear(8, 2)
        inner = torch.optim.SGD(model.parameters(), lr=0.1)
        with DiLoCo(model, inner, sync_every=2, algorithm="allreduce") as diloco:
            for _ in range(2):
                model(torch.randn(4, 8)).sum().backward()
                inner.step()
                diloco.step()
    one()
    before = _fds()
    for _ in range(200):
        one()
    assert _fds() <= before + 2


def test_a_given_topology_is_the_callers_to_close(world_of_one):
    topology = Topology.build(1)
    model = torch.nn.Linear(8, 2)
    diloco = DiLoCo(model, torch.optim.SGD(model.parameters(), lr=0.1), sync_every=2,
                    algorithm="allreduce", topology=topology)
    diloco.close()
    assert topology.world is not None
    topology.close()
