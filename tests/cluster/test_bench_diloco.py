"""`thinwire bench diloco` end to end, small (loopback, no root needed): every configuration
trains from the same start, DiLoCo sends fewer inter-node bytes per step than DDP by about H,
and the compressed outer step fewer than the dense one."""

from __future__ import annotations

import pytest

from thinwire.bench import diloco
from thinwire.cluster import ClusterSpec


def test_bench_diloco_small_run():
    spec = ClusterSpec(nodes=2, ranks_per_node=2, shaping=False)
    h = 4
    outer = {"sparse_density": 0.1, "outer_chunk": 64, "outer_bits": 2, "outer_decay": 0.95,
             "sparse_outer_lr": 0.7, "sparse_outer_momentum": 0.0}
    result = diloco.run(spec, ["ddp", "hitopk", f"diloco-{h}", f"diloco-hitopk-{h}",
                               f"diloco-sparseloco-{h}"], steps=8,
                        batch=8, density=0.05, eval_every=4, target_bits=1e9, model="mlp",
                        lr=1e-3, timeout_s=300, outer=outer)
    rows = {r["config"]: r for r in result["rows"]}
    assert set(rows) == {"ddp", "hitopk", "diloco-4", "diloco-hitopk-4", "diloco-sparseloco-4"}
    for row in rows.values():
        assert row["steps"] == 8 and len(row["curve"]) == 2
        # every run is below a target of 1e9 bits at its first evaluation
        assert row["s_per_step"] > 0 and row["time_to_target_s"] == row["curve"][0]["seconds"]
    assert rows["diloco-4"]["outer_exchanges"] == 2
    # DDP all-reduces the whole model every step over the world ring; DiLoCo's hierarchical
    # all-reduce sends 1/n of it between nodes every H steps
    assert rows["diloco-4"]["ddp_bytes_over"] >= h / 2
    assert 0 < rows["diloco-hitopk-4"]["inter_bytes_per_step"] < \
        rows["diloco-4"]["inter_bytes_per_step"]
    # 2-bit values and int16 indices at density 0.1: about 1/18 of the dense exchange
    assert rows["diloco-sparseloco-4"]["outer_exchanges"] == 2
    assert 0 < rows["diloco-sparseloco-4"]["inter_bytes_per_step"] < \
        rows["diloco-4"]["inter_bytes_per_step"] / 10
    assert result["setting"]["outer"] == outer
    assert rows["hitopk"]["vs_hitopk_time"] == pytest.approx(1.0)
    assert result["setting"]["target_bits"] == 1e9
