"""`thinwire compare` refuses bad input before its first race (a race takes minutes): the
values a review found passing, or failing only after other races had run."""

from __future__ import annotations

import pytest
import torch

from thinwire.cli import main as thinwire_main
from thinwire.train import compare


@pytest.fixture
def no_race(monkeypatch):
    """compare() raced nothing: each test's input must be refused before it."""
    raced = []
    monkeypatch.setattr(compare, "compare", lambda settings, out, **k: raced.append(settings)
                        or pytest.fail(f"raced {settings.workload}"))
    return raced


@pytest.mark.parametrize("argv, message", [
    # a 0 equals False: it was dropped as an option left out, and the race ran unlimited
    (["--node-cpus", "0"], "--node-cpus must be"),
    (["--links-per-node", "0"], "--links-per-node must be"),
    # every workload's settings before the first race: the LM refuses MNIST's model
    (["--workload", "all", "--model", "widecnn"], "--model widecnn does not fit workload lm"),
    (["--lr-grid", "abc"], "--lr-grid must list numbers > 0 (multiples of the learning rate"),
    (["--lr-grid", "1,1", "--tune"], "--lr-grid lists a multiple twice"),
    (["--lr-grid", "0,-1"], "--lr-grid must list finite numbers > 0"),
    (["--inter-node-bandwidth", "200mbit", "0.2gbit"],
     "--inter-node-bandwidth lists one rate twice: '200mbit' and '0.2gbit'"),
    (["--nodes", "0"], "--nodes must be"),
])
def test_bad_input_is_refused_before_the_first_race(tmp_path, capsys, no_race, argv,
                                                    message):
    assert thinwire_main(["compare", "--out", str(tmp_path / "out")] + argv) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert not no_race


@pytest.mark.parametrize("where, message", [
    ("a_file", "is a file, expected a folder"),
    ("a_file/sub", "is a file, so no folder can be created under it"),
    ("", "expected a folder path, got an empty string"),
])
def test_an_out_folder_that_cannot_be_written_is_named(tmp_path, capsys, no_race, where,
                                                       message):
    (tmp_path / "a_file").write_text("x")
    out = str(tmp_path / where) if where else ""
    assert thinwire_main(["compare", "--out", out]) == 2
    err = capsys.readouterr().err
    assert "--out" in err and message in err


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA host runs --amp fp16")
def test_a_precision_this_host_cannot_run_is_refused_before_the_race(tmp_path, capsys,
                                                                    no_race):
    # the ranks run on this host: every run of the race would fail in its ranks
    assert thinwire_main(["compare", "--out", str(tmp_path / "out"), "--amp", "fp16"]) == 2
    assert "--amp fp16 needs a CUDA device" in capsys.readouterr().err
