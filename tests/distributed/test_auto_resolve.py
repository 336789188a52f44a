"""--algorithm auto on 2 gloo ranks (2 nodes x 1, loopback): the node leaders probe the link,
rank 0 plans, and every rank trains with the same choice; a plan that fails on rank 0 ends
every rank with its error."""

import sys
from pathlib import Path

from harness import run_ranks

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))
from plan_helpers import STEPS, _results, _truth_time  # noqa: E402

import auto_workers  # noqa: E402


def test_every_rank_trains_with_rank_0s_choice(tmp_path):
    path = _results(tmp_path, ranks_per_node=1)
    results = run_ranks(auto_workers.resolve, 2, str(path), 1)
    assert all("error" not in r for r in results), results
    assert len({(r["algorithm"], r["choice"], r["planned_at_bps"]) for r in results}) == 1
    first = results[0]
    assert first["plan_from"] == ""  # the resolved run is an ordinary one
    assert first["goodput"] > 1e6  # loopback: far faster than any shaped link
    fastest = min(STEPS, key=lambda a: _truth_time(a, first["planned_at_bps"], tmp_path))
    assert first["algorithm"] == fastest


def test_a_failed_plan_ends_every_rank_with_its_error(tmp_path):
    path = _results(tmp_path, ranks_per_node=1)
    results = run_ranks(auto_workers.resolve, 2, str(path), 1, batch_size=64)
    messages = {r.get("error") for r in results}
    assert len(messages) == 1 and "batch_size 32 there, 64 here" in messages.pop()
