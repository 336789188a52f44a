"""Bad input to `thinwire train` / `thinwire compare`: one clear message naming parameter,
value and what is allowed."""

import pytest

from thinwire.cli import main
from thinwire.train.compare import CompareSettings
from thinwire.train.config import TrainConfig


@pytest.mark.parametrize("changes, words", [
    ({"model": "vgg"}, ["--model", "'vgg'", "mlp", "lenet", "resnet", "transformer"]),
    ({"algorithm": "horovod"}, ["--algorithm", "'horovod'", "hitopk", "ddp-fp16", "powersgd"]),
    ({"density": 1.5}, ["--density", "1.5", "(0, 1]"]),
    ({"density": 0.0}, ["--density", "(0, 1]"]),
    ({"selector": "sort"}, ["--selector", "'sort'", "mstopk"]),
    ({"optimizer": "adam"}, ["--optimizer", "'adam'", "sgd", "lars"]),
    ({"amp": "fp8"}, ["--amp", "'fp8'", "bf16"]),
    ({"powersgd_rank": 0}, ["--powersgd-rank", "0"]),
    ({"epochs": 0}, ["--epochs", "0"]),
    ({"stop_after": 3}, ["--stop-after", "--checkpoint"]),
    ({"momentum_correction": True, "algorithm": "ddp"},
     ["--momentum-correction", "--algorithm ddp", "hitopk", "topk_allgather"]),
    ({"momentum_correction": True, "optimizer": "lars"},
     ["--momentum-correction", "--optimizer lars", "sgd"]),
    ({"dense_warmup_steps": -1}, ["--dense-warmup-steps", "-1"]),
    ({"density_warmup_steps": -1}, ["--density-warmup-steps", "-1"]),
    ({"density_warmup_steps": 5, "algorithm": "ddp"},
     ["--density-warmup-steps", "--algorithm ddp", "hitopk"]),
    ({"density_warmup_steps": 5, "density_warmup_from": 0.001},
     ["--density-warmup-from", "0.001", "[0.01, 1]"]),
    ({"powersgd_start_iter": -1}, ["--powersgd-start-iter", "-1", ">= 0"]),
    ({"wire": "int8"}, ["--wire", "'int8'", "none", "fp16", "bf16"]),
    ({"wire": "bf16", "algorithm": "powersgd"}, ["--wire", "--algorithm powersgd", "hitopk"]),
    ({"sparse_wire": "int8"}, ["--sparse-wire", "'int8'", "fp32", "fp16", "bf16"]),
    ({"sparse_wire": "fp16", "algorithm": "oktopk"},
     ["--sparse-wire", "--algorithm oktopk", "hitopk", "topk_a2a"]),
])
def test_train_config_errors_name_parameter_value_and_allowed(changes, words):
    with pytest.raises(ValueError) as info:
        TrainConfig(**changes).validate()
    for word in words:
        assert word in str(info.value)


def test_cli_reports_bad_input_in_one_line(capsys):
    assert main(["train", "--model", "mlp", "--algorithm", "nope"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("thinwire: error: --algorithm must be one of") and "'nope'" in err
    assert main(["train", "--density", "2"]) == 2
    assert "--density must be a number in (0, 1], got 2.0" in capsys.readouterr().err


@pytest.mark.parametrize("changes, words", [
    ({"algorithms": ["ddp", "bogus"]}, ["--algorithms", "'bogus'", "hitopk"]),
    ({"algorithms": []}, ["--algorithms"]),
    ({"train": {"model": "gpt5"}}, ["--model", "'gpt5'"]),
    ({"rates": ["fast"]}, ["--inter-node-bandwidth", "'fast'"]),
    ({"train": {"density": -1.0}}, ["--density", "-1.0"]),
    ({"workload": "cifar"}, ["--workload", "'cifar'", "mnist", "lm"]),
    ({"budget_s": -3.0}, ["--budget-s", "-3.0", ">= 0"]),
    ({"workload": "lm", "target": 0.9, "train": {"model": "widecnn"}},
     ["--model widecnn", "workload lm"]),
])
def test_compare_settings_errors(changes, words):
    with pytest.raises(ValueError) as info:
        CompareSettings(**changes).validate()
    for word in words:
        assert word in str(info.value)


def test_compare_cli_rejects_unknown_algorithm_before_running(tmp_path, capsys):
    assert main(["compare", "--out", str(tmp_path), "--algorithms", "ddp,foo"]) == 2
    assert "unknown algorithm 'foo'" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()
    assert main(["compare", "--out", str(tmp_path), "--workload", "lm", "--target", "9"]) == 2
    assert "--target for bits_per_byte must be a number in (0, 8], got 9" in \
        capsys.readouterr().err
