"""The DDP hook on CUDA (issue 30, item 4): each bucket runs on a side stream from the worker
thread, the future is CUDA-aware, and the autograd thread never calls
`torch.cuda.synchronize()`. Needs a GPU (the `device` tool lends one now and then); skipped
elsewhere with that reason."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

import thinwire

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(),
                         nn.Linear(512, 10))


def _batch(step: int):
    g = torch.Generator().manual_seed(step)
    return torch.randn(64, 256, generator=g).cuda(), torch.randint(0, 10, (64,), generator=g).cuda()


@pytest.mark.parametrize("world_of_one", ["nccl"], indirect=True)
@pytest.mark.parametrize("algorithm", ["allreduce", "hitopk"])
def test_gradients_match_and_backward_never_synchronises_the_device(
        world_of_one, algorithm, monkeypatch):
    reference, model = _model().cuda(), _model().cuda()
    ddp = DDP(model, bucket_cap_mb=0.5)  # several buckets
    state = thinwire.ddp.register(ddp, algorithm=algorithm, density=1.0, selector="exact",
                                  ranks_per_node=1, dense_below_bytes=0)
    calls = []
    real = torch.cuda.synchronize
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: (calls.append(1), real())[1])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # hitopk on one node
        for step in range(3):
            x, y = _batch(step)
            reference.zero_grad()
            nn.functional.cross_entropy(reference(x), y).backward()
            ddp.zero_grad()
            nn.functional.cross_entropy(ddp(x), y).backward()
            for a, b in zip(reference.parameters(), model.parameters()):
                torch.testing.assert_close(b.grad, a.grad, rtol=1e-5, atol=1e-6)
    assert calls == []
    assert state.steps == 3


def test_phase_times_come_from_cuda_events():
    state = thinwire.SyncState(None, "hitopk")
    state._device = torch.device("cuda")
    x = torch.randn(4096, 4096, device="cuda")
    with state.timer("select"):
        for _ in range(5):
            x = x @ x.T / 4096
    assert state._current["select_s"] == 0 and len(state._phase_events) == 1  # not read yet
    state.end_step()
    assert state.last_step["select_s"] > 0


@pytest.mark.parametrize("world_of_one", ["nccl"], indirect=True)
def test_a_nan_ends_backward_with_the_error(world_of_one):
    ddp = DDP(_model().cuda())
    thinwire.ddp.register(ddp, algorithm="allreduce", ranks_per_node=1)
    x, y = _batch(0)
    x[0, 0] = float("nan")
    with pytest.raises(Exception, match="non-finite gradient"):
        nn.functional.cross_entropy(ddp(x), y).backward()
