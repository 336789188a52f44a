"""`thinwire bench optim`: the generated parameter sets and the rows it writes (not timings)."""

from __future__ import annotations

import argparse
import json
import statistics

import pytest
import torch

from thinwire.bench import optim as bench
from thinwire.optim import param_groups


def numels(shapes):
    return [torch.Size(s).numel() for _, s in shapes]


def test_resnet50_shapes():
    shapes = bench.resnet50_shapes()
    assert len(shapes) == 161
    assert sum(numels(shapes)) == 25_557_032  # ResNet-50's published parameter count
    assert len({name for name, _ in shapes}) == 161
    # 53 BatchNorms (weight + bias) and the classifier bias: 107 bias/norm tensors.
    assert sum(bench._is_bias_or_norm(name) for name, _ in shapes) == 107


def test_transformer_shapes_are_many_and_small():
    shapes = bench.transformer_shapes()
    assert len(shapes) >= 200
    assert statistics.median(numels(shapes)) <= 64 * 1024


def test_overhead_case_is_the_transformer_with_one_element_tensors():
    shapes = bench.overhead_shapes()
    assert [n for n, _ in shapes] == [n for n, _ in bench.transformer_shapes()]
    assert set(numels(shapes)) == {1}


def test_name_rule_matches_param_groups():
    # The benchmark classifies generated names; check the rule against param_groups on a real
    # module tree named the same way.
    model = torch.nn.Module()
    model.ln1 = torch.nn.LayerNorm(4)
    model.fc = torch.nn.Linear(4, 4)
    model.bn3 = torch.nn.BatchNorm2d(4)
    _, no_decay = param_groups(model)
    by_rule = {name for name, _ in model.named_parameters() if bench._is_bias_or_norm(name)}
    assert by_rule == {name for name, p in model.named_parameters()
                       if any(p is q for q in no_decay["params"])}


def test_run_rows_and_json(tmp_path):
    parser = argparse.ArgumentParser()
    bench.register(parser.add_subparsers())
    out = tmp_path / "optim.json"
    args = parser.parse_args(["optim", "--cases", "transformer", "--repeats", "1",
                              "--json", str(out)])
    assert args.func(args) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [r["method"] for r in rows] == ["fused", "per_tensor", "sgd_foreach"]
    for row in rows:
        assert row["case"] == "transformer" and row["median_s"] > 0
        assert row["speedup_vs_per_tensor"] == pytest.approx(
            rows[1]["median_s"] / row["median_s"])
        assert row["time_vs_sgd_foreach"] == pytest.approx(row["median_s"] / rows[2]["median_s"])


def test_run_bad_input():
    with pytest.raises(ValueError, match="unknown case 'vgg'; allowed: resnet50, transformer, overhead"):
        bench.run(("vgg",))
    with pytest.raises(ValueError, match="repeats must be an integer >= 1, got 0"):
        bench.run(("transformer",), repeats=0)
