"""thinwire's dense DiLoCo against torchft's (the optional peer), same start, same data."""

from __future__ import annotations

import pytest
import torch

from harness import run_ranks
from diloco_reference import inner_optimizer, loss_of, make_model, reference_all
import diloco_workers
from thinwire.local_sgd import torchft_peer

pytestmark = pytest.mark.skipif(not torchft_peer.available(), reason=torchft_peer.MISSING)

NODES, STEPS = 2, 12


@pytest.mark.parametrize("sync_every,outer_lr,outer_momentum,nesterov", [
    (4, 0.7, 0.9, True),
    pytest.param(3, 1.0, 0.0, False, marks=pytest.mark.slow)], ids=["diloco", "local-sgd"])
def test_thinwire_equals_torchft(sync_every, outer_lr, outer_momentum, nesterov):
    config = dict(sync_every=sync_every, outer_lr=outer_lr, outer_momentum=outer_momentum,
                  nesterov=nesterov)
    ours = run_ranks(diloco_workers.run_configs, NODES, 1, [("dense", config)], STEPS)
    theirs = torchft_peer.run_replicas(NODES, torchft_peer.diloco_replica(
        make_model, inner_optimizer, loss_of, STEPS, **config))
    for node in range(NODES):
        assert len(theirs[node]["sync_s"]) == STEPS // sync_every
        for a, b in zip(ours[node]["dense"]["params"], theirs[node]["params"]):
            assert torch.allclose(a, b, rtol=0, atol=1e-10), f"max error {(a - b).abs().max()}"
    # and both equal the float64 reference, which moves away from the start
    expected = reference_all(NODES, 1, STEPS, **config)
    for a, b in zip(theirs[0]["params"], expected[0]):
        assert torch.allclose(a, b, rtol=0, atol=1e-10)
    assert not all(torch.allclose(a, b) for a, b in zip(expected[0], make_model().parameters()))
