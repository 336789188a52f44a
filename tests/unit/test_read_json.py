"""User JSON (a --config file, simulate's layer table and results) is read strictly (issue 33,
item 5): NaN, Infinity, 1e400, deep nesting, a malformed or huge file end in one clear error
naming the file, not in a RecursionError, an OverflowError later or a NaN taken as a value."""

from __future__ import annotations

import json

import pytest

from thinwire import output
from thinwire.collectives.costs import Cluster
from thinwire.sim.compute import read_layer_table


@pytest.mark.parametrize("text, message", [
    ('{"lr": NaN}', "NaN is not a number a setting may hold"),
    ('{"lr": Infinity}', "Infinity is not a number a setting may hold"),
    ('{"lr": 1e400}', "the number 1e400 is out of range"),
    ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
    ('{"lr": ', "not valid JSON"),
])
def test_bad_json_is_one_clear_error(tmp_path, text, message):
    path = tmp_path / "c.json"
    path.write_text(text)
    with pytest.raises(ValueError, match=message) as err:
        output.read_json(path, "config")
    assert str(path) in str(err.value)


def test_a_huge_file_is_refused_before_it_is_read(tmp_path, monkeypatch):
    monkeypatch.setattr(output, "MAX_INPUT_BYTES", 10)
    path = tmp_path / "c.json"
    path.write_text('{"a": 1, "b": 2}')
    with pytest.raises(ValueError, match="more than the 10 a config may have"):
        output.read_json(path, "config")
    monkeypatch.setattr(output, "MAX_INPUT_BYTES", 1000)
    assert output.read_json(path) == {"a": 1, "b": 2}


@pytest.mark.parametrize("layer, message", [
    ({"params": 10, "forward_s": -1.0, "backward_s": 0.1}, "finite times >= 0"),
    ({"params": -10, "forward_s": 0.1, "backward_s": 0.1}, "params >= 0"),
])
def test_a_layer_table_with_negative_values_is_refused(tmp_path, layer, message):
    path = tmp_path / "layers.json"
    path.write_text(json.dumps([layer]))
    with pytest.raises(ValueError, match=message):
        read_layer_table(path)


def test_a_simulated_cluster_is_bounded():
    with pytest.raises(ValueError, match=r"nodes must be an integer in \[1, 4096\], got 1000000000"):
        Cluster(10**9, 1)


def test_a_config_file_goes_through_the_strict_reader(tmp_path):
    import argparse

    from thinwire.train.config import add_arguments, add_config_file

    path = tmp_path / "c.json"
    path.write_text('{"lr": 1e400}')
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    with pytest.raises(ValueError, match="--config file .*the number 1e400 is out of range"):
        add_config_file(parser, ["--config", str(path)])


def test_a_non_finite_number_is_written_as_null_and_reads_back(tmp_path):
    # a diverged run's NaN loss made results.json unreadable by thinwire plan and auto
    from thinwire.output import read_json, write_json_atomic

    path = tmp_path / "results.json"
    write_json_atomic(path, {"final_loss": float("nan"), "curve": [{"loss": float("inf")},
                                                                   {"loss": 1.5}]})
    assert read_json(path) == {"final_loss": None, "curve": [{"loss": None}, {"loss": 1.5}]}
