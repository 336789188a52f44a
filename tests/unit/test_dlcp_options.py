"""dlcp's settings: checked where they enter (SyncState), defaults from the cluster launcher."""

from __future__ import annotations

import pytest

from thinwire.collectives import dlcp
from thinwire.state import SyncState


@pytest.mark.parametrize("name, value, message", [
    ("epsilon", 0.5, r"'epsilon' must be a number in \[0, 0.1\], got 0.5"),
    ("epsilon", -0.1, r"'epsilon' must be a number in \[0, 0.1\], got -0.1"),
    ("epsilon", float("nan"), r"'epsilon' must be a number in \[0, 0.1\], got nan"),
    ("high_share", 1.5, r"'high_share' must be a number in \[0, 1\], got 1.5"),
    ("rate_bps", 0, r"'rate_bps' must be a number > 0 or none, got 0"),
    ("classes", 9, r"'classes' must be an integer in \[2, 8\] or none, got 9"),
    ("pacing", "fast", r"'pacing' must be one of sleep, socket or none, got 'fast'"),
    ("datagram_bytes", 9000, r"'datagram_bytes' must be an integer in \[512, 8972\]"),
    ("window", 3, r"no option 'window'; its options: epsilon, high_share"),
])
def test_bad_settings_name_the_parameter_value_and_range(name, value, message):
    with pytest.raises(ValueError, match=message):
        SyncState(None, "dlcp", algorithm_options={name: value})


def test_rate_and_classes_default_to_what_the_cluster_launcher_exports(monkeypatch):
    monkeypatch.setenv("THINWIRE_INTER_NODE_BPS", "100000000")
    monkeypatch.setenv("THINWIRE_LINK_CLASSES", "3")
    state = SyncState(None, "dlcp", algorithm_options={"epsilon": 0.05})
    assert state.algorithm_options == {**dlcp.DEFAULTS, "epsilon": 0.05,
                                       "rate_bps": 1e8, "classes": 3}
    assert dlcp.missed_share({"dlcp_entries": 200.0, "dlcp_missed_entries": 6.0}) == 0.03
    assert dlcp.missed_share({}) == 0.0
