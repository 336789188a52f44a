"""Each algorithm against the single-process reference, on several gloo processes."""

from __future__ import annotations

import math

import pytest
import torch

from harness import run_ranks
from thinwire import collectives
from reference import Reference, gradient, held_back_by_ranks
import workers

LENGTHS = [1001, 3000]  # one bucket each; 1001 does not divide evenly into shards
STEPS = 3
DENSITY = 0.05
ALGORITHMS = ["allreduce", "hier_allreduce", "topk_allgather", "hitopk", "topk_a2a", "oktopk"]
SPARSE = ["topk_allgather", "hitopk", "topk_a2a", "oktopk"]
MOMENTUM = 0.9
# oktopk re-deriving both thresholds and its regions every step: deterministic, its reference
OPTIONS = {"oktopk": {"tau": 1, "rebalance_every": 1}}


def _expected(algorithm, nodes, n, density, momentum=0.0):
    refs = [Reference(algorithm, nodes, n, density, momentum) for _ in LENGTHS]
    world = nodes * n
    per_step = []
    for step in range(STEPS):
        grads = [gradient(r, step, sum(LENGTHS)).split(LENGTHS) for r in range(world)]
        per_step.append([ref.step([g[i] for g in grads]) for i, ref in enumerate(refs)])
    return per_step, refs


@pytest.fixture(scope="module", params=[(2, 2), (4, 2)], ids=["2x2", "4x2"])
def shape_runs(request):
    """Every algorithm on one launch of nodes x ranks (launching ranks is the slow part)."""
    nodes, n = request.param
    configs = [(a, a, DENSITY, None, 0.0, OPTIONS.get(a)) for a in ALGORITHMS]
    configs += [(f"{a}+momentum", a, DENSITY, None, MOMENTUM, OPTIONS.get(a)) for a in SPARSE]
    configs += [("oktopk:reuse", "oktopk", DENSITY, None, 0.0, {"tau": 2, "rebalance_every": 4})]
    return nodes, n, run_ranks(workers.sync_many, nodes * n, n, configs, LENGTHS, STEPS)


@pytest.mark.parametrize("algorithm", SPARSE)
def test_momentum_correction_matches_the_reference(shape_runs, algorithm):
    """DGC momentum correction: velocities accumulate into the residual, both masked where
    sent; every rank holds the float64 reference's average of the selections."""
    nodes, n, runs = shape_runs
    expected, refs = _expected(algorithm, nodes, n, DENSITY, MOMENTUM)
    plain, _ = _expected(algorithm, nodes, n, DENSITY)
    for by_name in runs:
        result = by_name[f"{algorithm}+momentum"]
        for step in range(STEPS):
            for got, want in zip(result["grads"][step], expected[step]):
                torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
    # from the second step on, momentum changes what is selected and sent
    assert not torch.allclose(expected[STEPS - 1][0], plain[STEPS - 1][0])
    velocities = runs[0][f"{algorithm}+momentum"]["feedback"]["velocities"]
    assert velocities and all(v.abs().sum() > 0 for v in velocities.values())


@pytest.fixture(scope="module")
def dense_runs():
    """2 x 2: dense, top-k at density 1, and half-precision wires, in one launch."""
    configs = [("allreduce", "allreduce", 1.0, None)]
    configs += [(f"{a}@1", a, 1.0, None) for a in ("topk_allgather", "hitopk", "topk_a2a")]
    configs += [(f"{a}:{w}", a, 1.0, w) for w in ("fp16", "bf16")
                for a in ("allreduce", "hier_allreduce", "hitopk")]
    return run_ranks(workers.sync_many, 4, 2, configs, LENGTHS, 2)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_every_rank_holds_the_reference_result(shape_runs, algorithm):
    nodes, n, runs = shape_runs
    results = [by_name[algorithm] for by_name in runs]
    expected, refs = _expected(algorithm, nodes, n, DENSITY)
    for rank, result in enumerate(results):
        assert result["topology"] == (nodes, rank // n, rank % n)
        for step in range(STEPS):
            for got, want in zip(result["grads"][step], expected[step]):
                torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
    if algorithm in SPARSE:
        _check_conservation(results, refs, algorithm, nodes * n)
    _check_bytes(results, algorithm, nodes, n, refs)


def test_oktopk_reusing_thresholds_conserves_every_gradient(shape_runs):
    """tau = 2: the second step selects by the thresholds of the first. Whatever is selected,
    applied (times W) plus every rank's residual is the sum of all raw gradients; the
    thresholds and regions are in the state's checkpoint."""
    nodes, n, runs = shape_runs
    results = [by_name["oktopk:reuse"] for by_name in runs]
    _check_conservation(results, None, "oktopk", nodes * n)
    for result in results:
        for memory in result["algorithm_state"].values():
            assert memory["step"] == STEPS and memory["local_threshold"] > 0
            assert memory["bounds"][0] == 0 and memory["bounds"] == sorted(memory["bounds"])


def _check_conservation(results, refs, algorithm, world):
    """Over the steps: applied (times W) plus everything held back = sum of raw gradients."""
    for i, length in enumerate(LENGTHS):
        raw = sum(gradient(r, s, sum(LENGTHS)).split(LENGTHS)[i]
                  for r in range(world) for s in range(STEPS))
        applied = sum(results[0]["grads"][s][i] for s in range(STEPS)) * world
        # Residuals as the ranks hold them (bucket index i is parameter len-1-i: DDP order).
        bucket = len(LENGTHS) - 1 - i
        held = torch.zeros(length, dtype=torch.float64)
        for rank, result in enumerate(results):
            residual = result["feedback"]["residuals"][bucket]
            if algorithm == "hitopk":  # this rank's shard of its node's sum, padding cut off
                start = result["topology"][2] * residual.numel()
                piece = residual[:max(0, length - start)]
                held[start:start + piece.numel()] += piece
            else:
                held += residual
        torch.testing.assert_close(applied + held, raw, rtol=0, atol=1e-10)
        if refs is not None:
            torch.testing.assert_close(held, refs[i].held_back(length), rtol=0, atol=1e-12)


def _packed(k, value_bytes, numel):
    """k coded indices below numel (the smaller of 16-bit offsets in 65536-entry chunks plus a
    4-byte count per chunk, and a bitmap) and k values, each section padded to 8 bytes."""
    index_bytes = min(2 * k + 4 * math.ceil(numel / 65536), math.ceil(numel / 8))
    return math.ceil(index_bytes / 8) * 8 + math.ceil(k * value_bytes / 8) * 8


def _alltoall(rank, n, per_destination):
    """(intra, inter) bytes of rank's all-to-all blocks (none to itself)."""
    intra = sum(b for s, b in enumerate(per_destination) if s != rank and s // n == rank // n)
    return intra, sum(b for s, b in enumerate(per_destination) if s // n != rank // n)


def _check_bytes(results, algorithm, m, n, refs):
    """Per-step bytes against PAPERS.md's ring formulas (float64 values, int32 indices) and,
    for the all-to-alls, the blocks a rank sends to each destination."""
    w, b = m * n, 8
    for rank, result in enumerate(results):
        intra = inter = 0.0
        last_local = (rank % n == n - 1) and m > 1
        for d, ref in zip(LENGTHS, refs):
            if algorithm == "topk_a2a":  # equal blocks of k_s entries, then a dense all-gather
                length = math.ceil(d / w)
                block = _packed(math.ceil(DENSITY * length), b, length)
                intra, inter = intra + (n - 1) * block, inter + (m - 1) * n * block
                volume = (w - 1) * length * b
                inter += volume if last_local else 0
                intra += 0 if last_local else volume
                continue
            if algorithm == "oktopk":  # rebalance all-reduce, all-gather of the owners'
                # counts, count exchange and sparse reduce, every owner's nonzero sums to every
                # rank (tau = 1: the estimate step)
                volume = 2 * (w - 1) / w * (w - 1) * 8 + (w - 1) * 8
                inter += volume if last_local else 0
                intra += 0 if last_local else volume
                for blocks in ([8] * w,
                               [_packed(c, b, d) for c in ref.sent_counts[rank]],
                               [_packed(ref.region_nonzeros[rank], b, d)] * w):
                    got = _alltoall(rank, n, blocks)
                    intra, inter = intra + got[0], inter + got[1]
                continue
            padded = math.ceil(d / n) * n
            if algorithm == "allreduce":
                volume = 2 * (w - 1) / w * d * b
                inter += volume if last_local else 0
                intra += 0 if last_local else volume
            elif algorithm == "hier_allreduce":
                intra += 2 * (n - 1) / n * padded * b
                inter += 2 * (m - 1) / m * (padded / n) * b
            elif algorithm == "topk_allgather":
                volume = (w - 1) * _packed(math.ceil(DENSITY * d), b, d)
                inter += volume if last_local else 0
                intra += 0 if last_local else volume
            else:  # hitopk: (n-1)/n d intra (reduce-scatter), (m-1) blocks of density*d/n
                # entries inter, then the m received blocks all-gathered inside the node (they
                # are smaller than the dense shard at this density)
                block = _packed(math.ceil(DENSITY * padded / n), b, padded // n)
                assert m * block < padded / n * b
                intra += (n - 1) / n * padded * b + (n - 1) * m * block
                inter += (m - 1) * block
        assert result["last_step"]["bytes_intra"] == pytest.approx(intra)
        assert result["last_step"]["bytes_inter"] == pytest.approx(inter)


@pytest.mark.parametrize("algorithm", ["topk_allgather", "hitopk", "topk_a2a"])
def test_topk_at_density_one_equals_dense(dense_runs, algorithm):
    for by_name in dense_runs:
        got, want = by_name[f"{algorithm}@1"], by_name["allreduce"]
        for step in range(2):
            for a, b in zip(got["grads"][step], want["grads"][step]):
                torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


def test_reduce_leaves_the_tensor_it_was_given_as_it_was():
    """At a low density and at density 1 (hitopk's dense way back inside the node), on even
    and odd lengths (with and without padding to the node's shards)."""
    algorithms = collectives.names()
    for result in run_ranks(workers.reduce_keeps_input, 4, 2, algorithms, [0.05, 1.0],
                            [1000, 1001]):
        changed = [key for key, kept in result.items() if not all(kept)]
        assert not changed, f"state.reduce wrote into its input for {changed}"


def test_hooks_give_ddps_own_gradients():
    variants = [("allreduce", dict(algorithm="allreduce")),
                ("hier_allreduce", dict(algorithm="hier_allreduce")),
                ("hitopk_dense", dict(algorithm="hitopk", density=1.0, dense_below_bytes=0)),
                ("topk_dense", dict(algorithm="topk_allgather", density=1.0))]
    results = run_ranks(workers.ddp_equivalence, 4, 2, variants)
    for result in results:
        for name, _ in variants:
            for step, (got, want) in enumerate(zip(result[name], result["ddp"])):
                for a, b in zip(got, want):
                    torch.testing.assert_close(a, b, rtol=0, atol=1e-12,
                                               msg=f"{name} step {step}")


def test_momentum_moved_into_the_hook_equals_momentum_sgd_on_dense_steps():
    """With every step dense (warm-up), u = m u + (average + wd p) in the hook and SGD without
    momentum or weight decay is exactly momentum SGD with weight decay: the velocities are kept
    per bucket, in canonical order."""
    for result in run_ranks(workers.momentum_in_hook, 4, 2):
        for got, want in zip(result["hook"], result["optimizer"]):
            torch.testing.assert_close(got, want, rtol=0, atol=1e-12)


def test_hitopk_carries_the_warm_up_velocity_into_its_shards():
    """After a dense warm-up the whole-bucket velocity of the average becomes each rank's shard
    of the node's sum (n times), instead of starting again at zero."""
    m, n = 0.5, 2
    for result in run_ranks(workers.warmup_velocity_handoff, 4, n):
        (velocity,) = result["velocities"].values()
        s = velocity.numel()
        full = torch.zeros(n * s, dtype=torch.float64)
        full[:result["c"].numel()] = n * (1 + m + m * m) * result["c"]
        expected = full[result["local_rank"] * s:(result["local_rank"] + 1) * s]
        kept = velocity != 0  # the entries sent in the first sparse step are zeroed
        assert kept.sum() >= 0.95 * s
        torch.testing.assert_close(velocity[kept], expected[kept], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("wire,tol", [("fp16", 2e-3), ("bf16", 2e-2)])
@pytest.mark.parametrize("algorithm", ["allreduce", "hier_allreduce", "hitopk"])
def test_fp16_and_bf16_on_the_wire_stay_close_to_the_exact_average(dense_runs, algorithm,
                                                                    wire, tol):
    expected, _ = _expected("allreduce", 2, 2, 1.0)
    for by_name in dense_runs:
        got = by_name[f"{algorithm}:{wire}"]["grads"][0]
        for a, b in zip(got, expected[0]):
            torch.testing.assert_close(a, b, rtol=tol, atol=tol)
            assert not torch.equal(a, b), "the wire dtype must actually round"


def test_checkpointed_state_restores_residuals_and_training_continues_bit_identically():
    for result in run_ranks(workers.checkpoint_resume, 4, 2):
        for index, residual in result["residuals_before"].items():
            assert torch.equal(result["residuals_pickled"][index], residual)
            assert torch.equal(result["residuals_state_dict"][index], residual)
        assert result["residuals_before"], "hitopk must hold residuals after two steps"
        for got, want in zip(result["resumed_params"], result["straight_params"]):
            assert torch.equal(got, want)


def test_topology_mismatch_fails_on_every_rank_instead_of_hanging():
    messages = run_ranks(workers.topology_mismatch, 4)
    assert all(m and "ranks_per_node differs between ranks" in m for m in messages)


def test_second_registration_on_the_same_model_is_refused():
    messages = run_ranks(workers.second_registration, 2)
    assert all(m and "already registered" in m for m in messages)


@pytest.mark.parametrize("settings", [
    dict(algorithm="hitopk", density=0.05, selector="exact", dense_below_bytes=0,
         dense_iterations=1, momentum_correction=0.9, weight_decay=0.01),
    dict(algorithm="topk_allgather", density=0.05, selector="exact", weight_decay=0.01),
    dict(algorithm="allreduce", weight_decay=0.01),
    # without error feedback the selection still sees model order (it saw DDP's rebuilt order)
    dict(algorithm="hitopk", density=0.05, selector="exact", dense_below_bytes=0,
         error_feedback=False),
], ids=["hitopk-warmup-momentum-wd", "topk_allgather-wd", "allreduce-wd", "hitopk-no-feedback"])
def test_synchronize_equals_the_ddp_hook_for_the_same_settings(settings):
    """Dense warm-up, weight decay in the hook, momentum correction and the canonical bucket
    order belong to SyncState, so both entry points give the same training (2 x 2)."""
    for result in run_ranks(workers.synchronize_equals_hook, 4, 2, settings):
        for hook, sync in zip(result["hook"], result["synchronize"]):
            torch.testing.assert_close(hook, sync, rtol=0, atol=1e-12)


@pytest.fixture(scope="module", params=[(1, 2), (2, 1)], ids=["1x2", "2x1"])
def flat_runs(request):
    """Every algorithm where all traffic is of one kind: one node (intra only), or one rank a
    node (inter only)."""
    nodes, n = request.param
    configs = [(a, a, DENSITY, None, 0.0, OPTIONS.get(a)) for a in ALGORITHMS]
    return nodes, n, run_ranks(workers.sync_many, nodes * n, n, configs, LENGTHS, STEPS)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_time_is_filed_under_the_link_its_bytes_cross(flat_runs, algorithm):
    """state.last_step puts a phase's time and its bytes under the same label: on one node
    everything is intra-node, with one rank a node everything is inter-node (a time under the
    other label, with no bytes there, misleads every per-phase profile built on it)."""
    nodes, _, runs = flat_runs
    used, unused = ("intra", "inter") if nodes == 1 else ("inter", "intra")
    for rank, by_name in enumerate(runs):
        step = by_name[algorithm]["last_step"]
        assert step[f"bytes_{used}"] > 0 and step[f"{used}_s"] > 0, (rank, step)
        assert step[f"bytes_{unused}"] == 0 and step[f"{unused}_s"] == 0, (rank, step)


@pytest.mark.parametrize("algorithm", ["hitopk", "topk_allgather"])
def test_density_warmup_matches_the_reference_step_by_step(algorithm):
    """DGC's density warm-up (0.4 -> 0.05 over 3 steps, then 0.05): every rank holds the float64
    reference run at each step's density, and error feedback conserves every gradient. At 0.4
    hitopk's result returns inside the node densely, at 0.05 as the received selections."""
    settings = dict(density=DENSITY, density_warmup_steps=3, density_warmup_from=0.4)
    results = run_ranks(workers.sync_with_settings, 4, 2, algorithm, LENGTHS, STEPS + 1,
                        settings)
    assert results[0]["densities"] == pytest.approx([0.4, 0.2, 0.1, DENSITY])
    refs = [Reference(algorithm, 2, 2, DENSITY) for _ in LENGTHS]
    for step in range(STEPS + 1):
        grads = [gradient(r, step, sum(LENGTHS)).split(LENGTHS) for r in range(4)]
        for i, ref in enumerate(refs):
            ref.density = results[0]["densities"][step]
            want = ref.step([g[i] for g in grads])
            for result in results:
                torch.testing.assert_close(result["grads"][step][i], want, rtol=0, atol=1e-12)
    for i, length in enumerate(LENGTHS):  # applied (times W) + held back = every raw gradient
        raw = sum(gradient(r, s, sum(LENGTHS)).split(LENGTHS)[i]
                  for r in range(4) for s in range(STEPS + 1))
        applied = sum(results[0]["grads"][s][i] for s in range(STEPS + 1)) * 4
        torch.testing.assert_close(applied + refs[i].held_back(length), raw, rtol=0, atol=1e-10)
        held = held_back_by_ranks(results, i, length, algorithm, len(LENGTHS))
        torch.testing.assert_close(held, refs[i].held_back(length), rtol=0, atol=1e-12)


def test_every_sparse_algorithm_all_reduces_a_small_bucket_densely():
    """dense_below_bytes is SyncState's, applied once for every sparse algorithm (topk_allgather
    and dlcp used to select top-k of a 800-byte bucket anyway)."""
    sparse = list(collectives.sparse_names())
    length, world = 100, 4
    results = run_ranks(workers.small_bucket_sync, world, 2, sparse, length)
    want = sum(gradient(r, 0, length) for r in range(world)) / world
    for result in results:
        for name in sparse:
            got, _ = result[name]
            torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12, msg=name)
