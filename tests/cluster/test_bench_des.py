"""`thinwire bench des` end to end on a small synthetic set (loopback, no root needed): every
method trains the same model on the same batches, repeats agree on bytes, and the JSON carries
the keys the issue names."""

from __future__ import annotations

import pytest

from thinwire.bench import des
from thinwire.cluster import ClusterSpec

EXTRA = ["--epochs", "1", "--batch", "128", "--k", "4", "--samples", "3000", "--fields", "4",
         "--multi-hot", "3", "--vocab", "500", "--zipf", "1.2", "--hidden", "8"]


def test_bench_des_small_run_rows_and_reductions():
    spec = ClusterSpec(nodes=2, ranks_per_node=1, shaping=False)
    result = des.run(spec, datasets=["synthetic"], models=["fm", "deepfm"],
                     methods=["des", "ps", "torchrec_tw"], extra=EXTRA, synthetic_steps=3,
                     repeats=2, timeout_s=300)
    rows = {(r["model"], r["method"]): r for r in result["rows"]}
    assert set(rows) == {(m, x) for m in ("fm", "deepfm") for x in ("des", "ps", "torchrec_tw")}
    for (model, method), row in rows.items():
        for key in ("model", "method", "bytes_per_iter", "samples_per_s", "auc",
                    "comm_reduction_vs_ps", "payload_reduction_vs_ps"):
            assert key in row, key
        assert row["steps"] == 3 and len(row["samples_per_s_runs"]) == 2
        assert row["samples_per_s"] > 0 and 0 < row["payload_bytes_per_iter"] < row["bytes_per_iter"]
        ps = rows[(model, "ps")]
        assert row["comm_reduction_vs_ps"] == pytest.approx(
            1 - row["bytes_per_iter"] / ps["bytes_per_iter"])
        # same model, same batches: the methods differ only in float32 summation order
        assert row["auc"] == pytest.approx(ps["auc"], abs=2e-3)
    assert rows[("fm", "ps")]["comm_reduction_vs_ps"] == 0
    # FM's partials are per sample, rows per id: DES must send fewer values than the PS
    assert rows[("fm", "des")]["payload_reduction_vs_ps"] > 0.5
    assert result["setting"]["repeats"] == 2


def test_bench_des_rejects_zero_repeats():
    with pytest.raises(ValueError, match="repeats must be an int >= 1, got 0"):
        des.run(ClusterSpec(nodes=1, ranks_per_node=1, shaping=False), repeats=0)
