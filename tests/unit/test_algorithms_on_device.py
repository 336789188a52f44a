"""Every registered algorithm, selector and the sparse packing run where the gradient lives, and
give there what they give on the CPU (the reference): issue 30, item 4. The ``meta`` device
(test_meta_device.py) catches a CPU tensor mixed in; only a real device catches a host read in
the wrong place or a kernel that differs. On CUDA (the `device` tool lends a GPU now and then)
these run against the CPU; without one, the same comparison runs CPU against CPU so the test's
own logic stays covered in CI."""

from __future__ import annotations

import warnings

import pytest
import torch

import thinwire
from thinwire import collectives, compress, topk

HAS_CUDA = torch.cuda.is_available()
DEVICE = torch.device("cuda") if HAS_CUDA else torch.device("cpu")
# One world whose collectives take CPU tensors (gloo) and, with a GPU, CUDA tensors (NCCL).
BACKEND = "cpu:gloo,cuda:nccl" if HAS_CUDA else "gloo"
# dlcp sends datagrams from the host (its transport is UDP); every other algorithm's phases run
# on the gradient's device.
ALGORITHMS = collectives.names()


def _gradients(n_params: int = 3, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    sizes = [40_000, 300, 70_001][:n_params]  # one bucket above, one below dense_below_bytes
    return [torch.randn(size, generator=g, dtype=torch.float64).float() for size in sizes]


def _synchronised(algorithm: str, device: torch.device, steps: int = 3) -> list[torch.Tensor]:
    """The averaged gradients of ``steps`` synchronisations (residuals carried), on ``device``,
    returned on the CPU."""
    settings = {"density": 0.05, "selector": "exact"} if collectives.get(algorithm).sparse \
        else {}
    state = thinwire.SyncState(thinwire.Topology.shared(ranks_per_node=1), algorithm,
                               **settings)
    out = []
    for step in range(steps):
        params = [torch.nn.Parameter(torch.zeros_like(g, device=device))
                  for g in _gradients(seed=step)]
        for p, g in zip(params, _gradients(seed=step)):
            p.grad = g.to(device)
        thinwire.synchronize(params, state, bucket_bytes=200_000)
        state.end_step()
        out += [p.grad.cpu() for p in params]
    return out


@pytest.mark.parametrize("world_of_one", [BACKEND], indirect=True)
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_every_algorithm_gives_on_the_device_what_it_gives_on_the_cpu(world_of_one,
                                                                       algorithm):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # hierarchical ones on one node
        reference = _synchronised(algorithm, torch.device("cpu"))
        on_device = _synchronised(algorithm, DEVICE)
    for expected, got in zip(reference, on_device):
        torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("method", topk.METHODS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_every_selector_keeps_the_largest_on_the_device(method, dtype):
    x = torch.randn(200_000, generator=torch.Generator().manual_seed(3)).to(dtype)
    k = 2_000
    values, indices = topk.select(x.to(DEVICE), k, method)
    assert values.device.type == indices.device.type == DEVICE.type
    assert torch.equal(values.cpu(), x[indices.cpu()])
    magnitudes = x.float()[indices.cpu()].abs()
    exact = torch.topk(x.float().abs(), k).values
    if method == "exact":  # the same magnitudes (16-bit ties at the k-th may pick other indices)
        assert torch.equal(torch.sort(magnitudes).values, torch.sort(exact).values)
    else:  # the approximate selectors: the mass they capture, against the exact top-k's
        assert magnitudes.sum() >= 0.9 * exact.sum()


@pytest.mark.parametrize("numel", [1_000, 70_000, 2**17 + 3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_packing_round_trips_on_the_device_byte_for_byte_with_the_cpu(numel, dtype):
    g = torch.Generator().manual_seed(numel)
    indices = torch.sort(torch.randperm(numel, generator=g)[: numel // 50]).values
    values = torch.randn(indices.numel(), generator=g).to(dtype)
    reference = compress.pack(values, indices, numel)
    packed = compress.pack(values.to(DEVICE), indices.to(DEVICE), numel)
    assert packed.device.type == DEVICE.type
    assert torch.equal(packed.cpu(), reference)
    got_values, got_indices = compress.unpack(packed, indices.numel(), dtype, numel)
    assert torch.equal(got_values.cpu(), values) and torch.equal(got_indices.cpu(), indices)




@pytest.mark.parametrize("device, chosen", [("cpu", "mstopk"), ("meta", "mstopk"),
                                            ("cuda", "exact"), ("cuda:1", "exact")])
def test_the_auto_selector_is_torch_topk_on_a_gpu_and_mstopk_on_the_cpu(device, chosen):
    assert topk.resolve("auto", torch.device(device)) == chosen
    assert topk.resolve("sampled", torch.device(device)) == "sampled"  # a named one stays


def test_selector_options_need_a_named_selector():
    with pytest.raises(ValueError, match="'auto' picks exact or mstopk by device"):
        topk.select(torch.randn(100), 5, "auto", iterations=10)
    values, indices = topk.select(torch.randn(100), 5, "mstopk", iterations=10)
    assert indices.numel() == 5
