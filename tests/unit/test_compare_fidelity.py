"""compare's runs carry the emulator's fidelity verdict, and the table flags a run the host,
not the link, set the pace of (issue 31, item 6)."""

from __future__ import annotations

import json

from thinwire.train import compare, report


def test_the_verdict_is_read_from_the_runs_accounting_and_the_file_removed(tmp_path):
    stats = tmp_path / ".k.stats.json"
    stats.write_text(json.dumps({"fidelity": {"verdict": "host", "nodes": []},
                                 "nodes": [{"series": {"t": [0.1] * 1000}}]}))
    assert compare._fidelity(stats) == {"verdict": "host", "nodes": []}
    assert not stats.exists()
    assert compare._fidelity(None) is None and compare._fidelity(tmp_path / "none") is None


def test_the_table_flags_a_host_bound_run():
    setting = {"metric": "test_accuracy", "target": 0.9, "budget_s": 60}
    assert report._cell("bound_by", {"fidelity": {"verdict": "host"}}, setting) == "HOST"
    assert report._cell("bound_by", {"fidelity": {"verdict": "link"}}, setting) == "link"
    assert report._cell("bound_by", {}, setting) == "-"
    # under a bandwidth schedule each phase's verdict follows, in order
    phased = {"verdict": "link", "phases": [{"verdict": "link"}, {"verdict": "host"}]}
    assert report._cell("bound_by", {"fidelity": phased}, setting) == "link (link/HOST)"
    assert report.headers(setting)["bound_by"] == "bound by"
