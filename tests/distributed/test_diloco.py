"""thinwire's DiLoCo on several gloo processes against the float64 single-process reference."""

from __future__ import annotations

import pytest
import torch

from harness import run_ranks
from diloco_reference import reference_all
import diloco_workers

STEPS = 12
H = 4
# (name, DiLoCo keyword arguments, reference keyword arguments, tolerance)
CONFIGS = [
    ("dense", dict(sync_every=H, algorithm="allreduce"),
     dict(sync_every=H, outer_lr=0.7, outer_momentum=0.9), 1e-10),
    ("hier-plain-momentum", dict(sync_every=H, algorithm="hier_allreduce", outer_lr=0.5,
                                 outer_momentum=0.8, nesterov=False),
     dict(sync_every=H, outer_lr=0.5, outer_momentum=0.8, nesterov=False), 1e-10),
    ("local-sgd", dict(sync_every=3, algorithm="hier_allreduce", outer_lr=1, outer_momentum=0),
     dict(sync_every=3, outer_lr=1.0, outer_momentum=0.0), 1e-10),
    # density 1: top-k keeps everything, so the hierarchical sparse path must equal the dense one
    ("hitopk-full", dict(sync_every=H, algorithm="hitopk", density=1.0, selector="exact"),
     dict(sync_every=H, outer_lr=0.7, outer_momentum=0.9), 1e-10),
    # SparseLoCo-style exchange: density 1 with float32 values and no decay is the exact
    # average (up to the float32 rounding of what is sent)
    ("sparseloco-full", dict(sync_every=H, algorithm="sparseloco", density=1.0,
                             sync_options={"chunk": 16, "bits": None, "decay": 0.0}),
     dict(sync_every=H, outer_lr=0.7, outer_momentum=0.9), 1e-6),
    # compressed: chunked top-k of 2-bit values, decayed error feedback per rank, no momentum
    ("sparseloco", dict(sync_every=H, algorithm="sparseloco", density=0.2, outer_lr=1.0,
                        outer_momentum=0.0, fragments=2,
                        sync_options={"chunk": 8, "bits": 2, "decay": 0.9}),
     dict(sync_every=H, outer_lr=1.0, outer_momentum=0.0, fragments=2,
          sparse=dict(density=0.2, chunk=8, bits=2, decay=0.9)), 1e-10),
    ("fp16-wire", dict(sync_every=H, algorithm="hier_allreduce", wire="fp16"),
     dict(sync_every=H, outer_lr=0.7, outer_momentum=0.9), 2e-3),
    ("streaming", dict(sync_every=H, fragments=2),
     dict(sync_every=H, outer_lr=0.7, outer_momentum=0.9, fragments=2), 1e-10),
    ("streaming-overlap", dict(sync_every=H, fragments=2, overlap=True, delay=1,
                               local_weight=0.5),
     dict(sync_every=H, outer_lr=0.7, outer_momentum=0.9, fragments=2, delay=1), 1e-10),
    ("overlap-hitopk-full", dict(sync_every=6, fragments=3, overlap=True, delay=1,
                                 local_weight=0.3, algorithm="hitopk", density=1.0,
                                 selector="exact"),
     dict(sync_every=6, outer_lr=0.7, outer_momentum=0.9, fragments=3, delay=1,
          local_weight=0.3), 1e-10),
]


@pytest.fixture(scope="module", params=[(2, 2), (4, 1)], ids=["2x2", "4x1"])
def runs(request):
    nodes, n = request.param
    configs = [(name, kwargs) for name, kwargs, _, _ in CONFIGS]
    return nodes, n, run_ranks(diloco_workers.run_configs, nodes * n, n, configs, STEPS)


@pytest.mark.parametrize("name,kwargs,ref_kwargs,tol", CONFIGS, ids=[c[0] for c in CONFIGS])
def test_equals_reference(runs, name, kwargs, ref_kwargs, tol):
    nodes, n, results = runs
    expected = reference_all(nodes, n, STEPS, **ref_kwargs)
    for rank, result in enumerate(results):
        got = result[name]["params"]
        want = expected[rank // n]
        for g, w in zip(got, want):
            assert torch.allclose(g, w, rtol=0, atol=tol), \
                f"{name} rank {rank}: max error {(g - w).abs().max():.3g}"
    # the reference really moves: DiLoCo differs from never synchronising
    unsynced = reference_all(nodes, n, STEPS, sync_every=STEPS + 1, outer_lr=1.0,
                             outer_momentum=0.0)
    assert any(not torch.allclose(g, w, atol=1e-6)
               for g, w in zip(results[0][name]["params"], unsynced[0]))


def test_inter_node_bytes_counted(runs):
    nodes, n, results = runs
    dense = max(r["dense"]["totals"]["bytes_inter"] for r in results)
    streaming = max(r["streaming"]["totals"]["bytes_inter"] for r in results)
    assert dense > 0
    # two fragments of half the model each sync once per H: about the same bytes overall
    assert 0.5 * dense < streaming < 1.5 * dense
    assert results[0]["streaming"]["outer_steps"] == [STEPS // H, STEPS // H]


def test_compressed_outer_step_conserves_mass():
    config = dict(sync_every=3, algorithm="hitopk", density=0.1, selector="exact",
                  outer_lr=1, outer_momentum=0)
    results = run_ranks(diloco_workers.mass, 4, 2, config, 9)
    for r in results:
        assert r["checked"] == 3
        assert r["kept"] > 0, "density 0.1 must keep something back"
        assert r["worst"] < 1e-12, f"sent + kept != pseudo-gradient by {r['worst']:.3g}"


@pytest.mark.parametrize("config,stop_at", [
    (dict(sync_every=4, fragments=2, overlap=True, delay=1, algorithm="hitopk", density=0.2,
          selector="exact"), 6),  # stops with fragment 0's exchange (launched at 6) in flight
    (dict(sync_every=3, algorithm="hier_allreduce"), 4),
], ids=["overlap-hitopk", "dense"])
def test_resume_bit_identical(config, stop_at):
    results = run_ranks(diloco_workers.resume, 4, 2, config, 11, stop_at)
    for r in results:
        for a, b in zip(r["straight"], r["resumed"]):
            assert torch.equal(a, b)
    if config.get("overlap"):
        assert results[0]["in_flight_at_save"] == 1
        assert results[0]["residuals"] >= 1


def test_diverged_inner_steps_stop_every_rank_naming_the_inner_step():
    """A NaN in one node's parameters reaches the outer exchange as a non-finite
    pseudo-gradient: every rank stops at that exchange, and the message counts inner steps
    (the loop's), not the exchange's own step count (which read 51 where the loop was at 260)."""
    # the NaN appears before inner step 10 (index 9): the exchange after inner step 12 sees it
    results = run_ranks(diloco_workers.diverged, 4, 2, 3, 9, 16)
    for result in results:
        assert result["step"] == 12, result
        assert "after inner step 12 (outer step 3;" in result["error"], result
        assert "first in rank 2 bucket" in result["error"], result
