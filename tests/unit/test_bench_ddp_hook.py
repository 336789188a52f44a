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


def test_each_algorithm_gets_the_settings_it_uses_and_its_declared_options():
    """The sparse settings reach hitopk only, the wire every algorithm; oktopk's own option
    reaches oktopk. Measured with the same small model."""
    result = ddp_hook.run(algorithms=("allreduce", "oktopk"), device="cpu", width=32, layers=1,
                          batch=4, steps=1, warmup=1, repeats=1,
                          sync={"density": 0.05, "wire": "bf16"},
                          algorithm_options={"oktopk": {"tau": 4}})
    assert (result["density"], result["wire"], result["selector"]) == (0.05, "bf16", "auto")
    assert result["algorithm_options"] == {"oktopk": {"tau": 4}}


@pytest.mark.parametrize("kwargs, message", [
    ({"sync": {"bits": 2}}, r"sync: unknown settings \['bits'\]"),
    ({"sync": {"density": 2.0}}, r"--density must be a number in \(0, 1\], got 2.0"),
    ({"algorithm_options": {"hitopk": {}}}, "'hitopk', which is not one of the algorithms timed"),
    ({"algorithm_options": {"oktopk": {"nope": 1}}}, "takes no option 'nope'"),
])
def test_a_bad_setting_is_refused_before_the_world_starts(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ddp_hook.run(algorithms=("allreduce", "oktopk"), **kwargs)
    assert not dist.is_initialized()


@pytest.mark.parametrize("argv, message", [
    (["--algorithms", "allreduce", "--density", "0.1"], "--density applies to a sparse"),
    (["--algorithms", "allreduce", "oktopk", "--sparse-wire", "fp16"], "--sparse-wire applies"),
    (["--algorithms", "allreduce", "--algorithm-option", "oktopk:tau=4"],
     "'oktopk' is not one of the algorithms run"),
])
def test_a_setting_no_timed_algorithm_uses_is_refused(argv, message, capsys):
    from thinwire.cli import main

    assert main(["bench", "ddp-hook", *argv]) != 0
    assert message in capsys.readouterr().err
