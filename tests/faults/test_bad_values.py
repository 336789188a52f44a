"""Every command and value of issue 15, item 7: a clear error naming the parameter (exit 2, one
line, no traceback), never a traceback, a silent acceptance or a hang."""

from __future__ import annotations

import pytest

import cases


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    return cases.prepare(tmp_path_factory.mktemp("faults"))


@pytest.mark.parametrize("case", cases.cli_cases(), ids=lambda c: c.name)
def test_command_refuses_clearly(case, scratch):
    outcome, message = cases.classify_cli_inprocess(case, scratch)
    assert outcome == "clear", message


@pytest.mark.parametrize("case", cases.api_cases(), ids=lambda c: c.name)
def test_api_refuses_clearly(case, scratch):
    outcome, message = cases.classify_api(case, scratch)
    assert outcome == "clear", message


def test_the_classifier_can_fail(scratch):
    """A value that is fine is 'accepted' and a message without the parameter is not clear."""
    ok = cases.CliCase("simulate fine", ["simulate", "--nodes", "2", "--no-plot",
                                         "--scaling-nodes", "2"], "--nodes")
    assert cases.classify_cli_inprocess(ok, scratch)[0] == "accepted"
    wrong = cases.CliCase("names another", ["bench", "cpr", "--epochs", "0"], "--batch")
    assert cases.classify_cli_inprocess(wrong, scratch)[0] == "traceback"
    hang = cases.ApiCase("sleeps", lambda t: __import__("time").sleep(5), "x", timeout_s=0.2)
    assert cases.classify_api(hang, scratch)[0] == "hang"


def test_json_write_failure_names_the_path_asked_for(scratch, monkeypatch):
    """A write that fails after the check (the disk filled, the folder went away) is reported
    with the path the user gave, not the temporary file's name."""
    import os

    from thinwire import output

    target = scratch / "out" / "r.json"
    output.check_output_path(target, "--json")

    def refuse(src, dst):
        raise PermissionError(13, "Permission denied", src)

    monkeypatch.setattr(output.os, "replace", refuse)
    with pytest.raises(output.OutputPathError, match=f"cannot write {target}: Permission denied"):
        output.write_json_atomic(target, {"a": 1})
    assert not [p for p in os.listdir(target.parent) if p.endswith(".tmp")]
