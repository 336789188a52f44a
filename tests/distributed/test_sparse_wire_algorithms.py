"""Selected values on the wire in fp16 / bf16 (``sparse_wire``): every rank holds the float64
reference of the same rounding, and error feedback conserves every gradient exactly (the
rounding error of what was sent stays in the residual)."""

from __future__ import annotations

import math

import pytest
import torch

from harness import run_ranks
from reference import Reference, gradient, held_back_by_ranks
import workers

LENGTHS = [1001, 3000]
STEPS = 3
DENSITY = 0.05
ALGORITHMS = ["hitopk", "topk_allgather", "topk_a2a"]
WIRES = {"fp16": torch.float16, "bf16": torch.bfloat16}


@pytest.fixture(scope="module")
def runs():
    """2 x 2, every algorithm and wire in one launch."""
    configs = [(f"{a}:{w}", a, {"density": DENSITY, "sparse_wire": w})
               for a in ALGORITHMS for w in WIRES]
    return run_ranks(workers.sync_settings_many, 4, 2, configs, LENGTHS, STEPS)


@pytest.mark.parametrize("wire", list(WIRES))
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_every_rank_holds_the_reference_of_the_rounded_values(runs, algorithm, wire):
    results = [by_name[f"{algorithm}:{wire}"] for by_name in runs]
    refs = [Reference(algorithm, 2, 2, DENSITY, sparse_wire=WIRES[wire]) for _ in LENGTHS]
    exact = [Reference(algorithm, 2, 2, DENSITY) for _ in LENGTHS]
    for step in range(STEPS):
        grads = [gradient(r, step, sum(LENGTHS)).split(LENGTHS) for r in range(4)]
        for i, (ref, unrounded) in enumerate(zip(refs, exact)):
            want = ref.step([g[i] for g in grads])
            for result in results:
                torch.testing.assert_close(result["grads"][step][i], want, rtol=0, atol=1e-12)
            # the rounding is real (the reference of unrounded values differs) and small
            plain = unrounded.step([g[i] for g in grads])
            assert not torch.equal(want, plain)
            eps = torch.finfo(WIRES[wire]).eps
            assert float((want - plain).abs().max()) <= 4 * eps * float(plain.abs().max())
    for i, length in enumerate(LENGTHS):  # applied (times W) + held back = every raw gradient
        raw = sum(gradient(r, s, sum(LENGTHS)).split(LENGTHS)[i]
                  for r in range(4) for s in range(STEPS))
        applied = sum(results[0]["grads"][s][i] for s in range(STEPS)) * 4
        held = held_back_by_ranks(results, i, length, algorithm, len(LENGTHS))
        torch.testing.assert_close(held, refs[i].held_back(length), rtol=0, atol=1e-12)
        torch.testing.assert_close(applied + held, raw, rtol=0, atol=1e-10)


def _ceil8(nbytes):
    return math.ceil(nbytes / 8) * 8


def test_hitopk_counts_two_bytes_a_value_and_an_index(runs):
    """2 x 2, one bucket per length: each rank sends its node's shard's k entries to the other
    node, a 16-bit offset (plus a 4-byte count per 65536 positions) and an fp16 value each."""
    expected = 0
    for d in LENGTHS:
        shard = math.ceil(d / 2)
        k = math.ceil(DENSITY * shard)
        expected += _ceil8(min(2 * k + 4 * math.ceil(shard / 65536), math.ceil(shard / 8))) + \
            _ceil8(2 * k)
    for by_name in runs:
        assert by_name["hitopk:fp16"]["last_step"]["bytes_inter"] == expected
        assert by_name["hitopk:bf16"]["last_step"]["bytes_inter"] == expected
