"""Two tick-tock waves are one data-parallel job: equal to the combined batch, offset kept."""

from __future__ import annotations

import pytest
import torch

from harness import run_ranks
import wavelet_workers

STEPS, BATCH, LR = 6, 5, 0.1
NODES, PROCESSES_PER_NODE = 2, 2  # one device slot per node: its tick and its tock
SPARSE = {"density": 0.2, "selector": "exact"}
# (name, waves, algorithm, options, turn); density 1 keeps every entry, so the hierarchical
# sparse path must give the dense result
CONFIGS = [("allreduce", 2, "allreduce", {}, "forward"),
           ("hier_allreduce", 2, "hier_allreduce", {}, "backward"),
           ("hitopk-full", 2, "hitopk", {"density": 1.0, "selector": "exact",
                                         "dense_below_bytes": 0}, "forward"),
           ("hitopk-waves", 2, "hitopk", SPARSE, "backward"),
           ("hitopk-plain", 1, "hitopk", SPARSE, "forward")]
TURN = {c[0]: c[4] for c in CONFIGS}


@pytest.fixture(scope="module")
def results():
    """One spawn of 2 nodes x 2 processes runs every configuration (spawning is the cost)."""
    return run_ranks(wavelet_workers.run_configs, NODES * PROCESSES_PER_NODE,
                     PROCESSES_PER_NODE, CONFIGS, STEPS, BATCH, LR)


@pytest.mark.parametrize("name", ["allreduce", "hier_allreduce", "hitopk-full"])
def test_two_waves_equal_the_combined_batch(results, name):
    world = NODES * PROCESSES_PER_NODE
    want = wavelet_workers.reference(STEPS, BATCH * world, LR)
    start = wavelet_workers.model()
    assert any(not torch.equal(w, s) for w, s in zip(want, start.parameters()))  # it trained
    for rank, result in enumerate(results):
        for got, expected in zip(result[name]["params"], want):
            assert torch.allclose(got, expected, rtol=0, atol=1e-12), \
                f"rank {rank}: max error {(got - expected).abs().max():.3g}"


def test_sparse_waves_equal_the_same_ranks_without_waves(results):
    """A compressing algorithm with error feedback: tick-tock changes timing, never numbers."""
    for result in results:
        for x, y in zip(result["hitopk-waves"]["params"], result["hitopk-plain"]["params"]):
            assert torch.equal(x, y)
        assert not any(e["kind"] == "wait" for e in result["hitopk-plain"]["events"])


@pytest.mark.parametrize("name", ["allreduce", "hier_allreduce", "hitopk-full", "hitopk-waves"])
def test_offset_kept_every_iteration(results, name):
    """Every iteration, the tock's forward starts after its tick's forward has ended (and, with
    turn='backward', after its tick's backward compute has ended)."""
    for slot in range(0, len(results), 2):
        tick, tock = results[slot][name], results[slot + 1][name]
        assert (tick["wave"], tock["wave"]) == (0, 1)
        tick_fwd = {e["step"]: e for e in tick["events"] if e["kind"] == "forward"}
        tick_bwd = {e["step"]: e for e in tick["events"] if e["kind"] == "backward"}
        tock_fwd = {e["step"]: e for e in tock["events"] if e["kind"] == "forward"}
        assert sorted(tick_fwd) == sorted(tock_fwd) == list(range(STEPS))
        for step in range(STEPS):
            assert tock_fwd[step]["start"] >= tick_fwd[step]["end"], step
            if TURN[name] == "backward":
                assert tock_fwd[step]["start"] >= tick_bwd[step]["end"], step
