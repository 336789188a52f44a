"""A lost peer ends every survivor within the timeout in one line (issue 33, item 2): the
probe's classifier, and one real run of it (tests/faults/peer_failure.py runs all 28)."""

from __future__ import annotations

import pytest

import peer_failure

LINE = ("thinwire train: error: rank 0 lost a peer in the inter-node phase of bucket 0 of "
        "allreduce at step 21: Timed out waiting 10000ms for recv operation to complete")


@pytest.mark.parametrize("status, stderr, outcome", [
    (1, "INFO starting\n" + LINE + "\n", "clear"),
    (1, "Traceback (most recent call last):\n  ...\n" + LINE + "\n", "traceback"),
    (1, "thinwire train: error: rank 0 lost a peer in a collective: EOF\n", "other"),  # no step
    (1, LINE + "\n" + LINE + "\n", "other"),                                         # two lines
    (None, LINE, "hang"), (-6, "terminate called without an active exception", "abort"),
    (0, "", "trained_on"),
    (1, '[torchft] lighthouse quorum failed. error: status: Cancelled\n' + LINE, "clear"),
])
def test_the_classifier(status, stderr, outcome):
    assert peer_failure.classify(status, stderr)[0] == outcome


@pytest.mark.slow
def test_a_killed_peer_ends_the_survivor_in_one_line():
    """A kill, not a freeze: the same reporting path in seconds (a frozen peer waits out the
    timeout; tests/distributed/test_failures.py times that one)."""
    row = peer_failure.one_run(peer_failure.SCENARIOS["allreduce"], "kill", timeout_s=10)
    assert row["outcome"] == "clear", row
    assert row["seconds"] < 10 + peer_failure.GRACE_S
    assert "rank 0 lost a peer" in row["line"] and " at step " in row["line"]
