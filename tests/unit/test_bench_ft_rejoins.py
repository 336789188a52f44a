"""`bench ft-cluster` reads every return's rejoin from the returning node's own record (written
at its first quorum), not only the last process's summary: a node killed again before the end
still counts."""

from __future__ import annotations

import pytest

from thinwire.bench import ft_cluster
from thinwire.train import ft_job


def test_every_return_is_read_in_the_order_it_started(tmp_path, monkeypatch):
    for node, started, parts in ((1, 200.0, {"in_quorum": 204.5, "first_quorum": 206.0}),
                                 (1, 100.0, {"in_quorum": 103.0, "first_quorum": 105.5}),
                                 (2, 150.0, {"first_quorum": 152.0})):  # no healing times
        monkeypatch.setattr(ft_job, "STARTED_AT", started)
        monkeypatch.setattr(ft_job.os, "getpid", lambda started=started: int(started))
        path = ft_job.write_rejoin(tmp_path, node, parts)
        assert path.name == f"rejoin_node{node}_{int(started)}.json"
    (tmp_path / "node1.json").write_text("{}")  # a summary is not a rejoin record
    got = ft_cluster._rejoins(tmp_path)
    assert got["rejoins"] == [{"node": 1, "in_quorum_s": 3.0, "rejoin_s": 5.5},
                              {"node": 2, "in_quorum_s": None, "rejoin_s": 2.0},
                              {"node": 1, "in_quorum_s": 4.5, "rejoin_s": 6.0}]
    assert got["in_quorum_max_s"] == pytest.approx(4.5)


def test_a_run_without_returns_has_none(tmp_path):
    assert ft_cluster._rejoins(tmp_path) == {"rejoins": [], "in_quorum_max_s": None}
