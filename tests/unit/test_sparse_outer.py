"""The SparseLoCo-style outer exchange's compressor: chunked top-k, quantised values, decayed
error feedback. Conservation in float64 (sent + kept = what went in), the payload decodes to
exactly what the sender counts as sent, sizes, and bad settings named."""

import pytest
import torch

from thinwire.local_sgd import chunked
from thinwire.local_sgd.sparse_outer import check_decay, step_shard

SETTINGS = [(0.1, 64, None), (0.1, 64, 2), (0.05, 1000, 4), (0.3, 7, 8), (1.0, 16, None),
            (0.01, 4096, 2)]


@pytest.mark.parametrize("density,chunk,bits", SETTINGS)
@pytest.mark.parametrize("decay", [0.0, 0.9, 1.0])
def test_sent_plus_kept_is_the_decayed_residual_plus_the_shard(density, chunk, bits, decay):
    g = torch.Generator().manual_seed(3)
    residual = torch.randn(5003, generator=g, dtype=torch.float64)
    shard = torch.randn(5003, generator=g, dtype=torch.float64)
    expected = decay * residual + shard  # computed before: step_shard updates in place
    payload, sent, kept = step_shard(residual.clone(), shard, density, chunk, bits, decay)
    assert torch.allclose(sent + kept, expected, rtol=0, atol=1e-12)
    decoded = chunked.decompress(payload, shard.numel(), density, chunk, bits, torch.float64)
    assert torch.equal(decoded, sent)  # the receivers see exactly what the residual lost
    assert payload.numel() == chunked.payload_bytes(shard.numel(), density, chunk, bits)


@pytest.mark.parametrize("density,chunk,bits", SETTINGS)
def test_each_chunk_sends_its_k_largest(density, chunk, bits):
    x = torch.randn(3 * chunk + 5, generator=torch.Generator().manual_seed(1),
                    dtype=torch.float64)
    _, sent = chunked.compress(x, density, chunk, bits)
    k = chunked.k_per_chunk(density, chunk)
    for start in range(0, x.numel(), chunk):
        part, got = x[start:start + chunk], sent[start:start + chunk]
        chosen = got != 0
        want = part.abs().topk(min(k, part.numel())).indices
        assert set(chosen.nonzero().flatten().tolist()) <= set(want.tolist())
        assert int(chosen.sum()) == min(k, part.numel())
        assert torch.equal(torch.sign(got[chosen]), torch.sign(part[chosen]))
        if bits is None:  # float32 on the wire
            assert torch.equal(got[chosen], part[chosen].float().double())
        else:  # L magnitude levels, the largest exactly the chunk's top magnitude (float32)
            levels = 1 << (bits - 1)
            top = part[chosen].abs().max().float().double()
            allowed = top * torch.arange(1, levels + 1, dtype=torch.float64) / levels
            for value in got[chosen].abs():
                assert torch.isclose(allowed, value, rtol=1e-12, atol=0).any()


def test_first_step_has_no_residual_and_full_density_sends_everything():
    shard = torch.randn(100, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    payload, sent, kept = step_shard(None, shard, 1.0, 10, None, 0.5)
    # everything is sent, as float32; only float32's rounding stays behind
    assert torch.equal(sent, shard.float().double())
    assert torch.equal(kept, shard - shard.float().double())


def test_two_bit_values_cost_a_quarter_byte():
    # 10 chunks of 1000, k = 50: int16 indices, 2-bit codes, one float32 scale per chunk
    assert chunked.payload_bytes(10_000, 0.05, 1000, 2) == 500 * 2 + 125 + 10 * 4
    assert chunked.payload_bytes(10_000, 0.05, 1000, None) == 500 * 2 + 500 * 4


@pytest.mark.parametrize("args,message", [
    ((0.0, 64, 2), "density must be a number in (0, 1], got 0.0"),
    ((0.1, 40000, 2), "chunk must be an int in [1, 32768], got 40000"),
    ((0.1, 64, 3), "bits must be None (float32 values) or one of 2, 4, 8, got 3"),
])
def test_bad_settings_are_named(args, message):
    with pytest.raises(ValueError) as info:
        chunked.check(*args)
    assert message in str(info.value)


def test_bad_decay_is_named():
    with pytest.raises(ValueError, match=r"decay must be a number in \[0, 1\], got 1.5"):
        check_decay(1.5)
