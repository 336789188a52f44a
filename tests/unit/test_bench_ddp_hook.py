"""`thinwire bench ddp-hook` on the CPU (its figures are the GPU's: docs/results.md): every
configuration runs, the peers and the serial path are there, and the overlap is computed from
them; bad input fails before any process group is made."""

import math

import pytest
import torch.distributed as dist

from thinwire.bench import ddp_hook


def test_every_configuration_runs_and_the_hidden_share_comes_from_the_serial_path():
    result = ddp_hook.run(algorithms=("allreduce", "hitopk"), device="cpu", width=64, layers=2,
                          batch=8, steps=2, warmup=1, repeats=2)
    rows = {row["config"]: row for row in result["rows"]}
    assert list(rows) == ["floor", "ddp", "torch-fp16", "allreduce", "hitopk"]
    assert rows["ddp"]["vs_ddp"] == 1.0
    assert result["model"]["parameters"] == 2 * (64 * 64 + 64)
    for name in ("allreduce", "hitopk"):
        row = rows[name]
        assert len(row["repeats_ms"]) == 2 and row["step_ms"] > 0
        work = row["serial_ms"] - rows["floor"]["step_ms"]
        if work > 0:
            expected = 1 - (row["step_ms"] - rows["floor"]["step_ms"]) / work
            assert math.isclose(row["hidden"], expected, rel_tol=1e-9)
    assert "serial_ms" not in rows["ddp"]
    assert not dist.is_initialized()  # its world of one is gone


def test_an_unknown_algorithm_is_refused_by_name():
    with pytest.raises(ValueError, match="nope"):
        ddp_hook.run(algorithms=("nope",))
    assert not dist.is_initialized()
