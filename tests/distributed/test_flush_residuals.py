"""Flushing the error-feedback residuals (the switch of --algorithm auto's re-planning):
what the sparse steps applied plus the flush equals the dense average of every rank's
gradients over those steps, for each residual space (a whole bucket; hitopk's node shard),
through thinwire.synchronize, through the DDP hook, and for PowerSGD's error memory (2 x 2
gloo ranks, one spawn)."""

from harness import run_ranks

import flush_workers

ALGORITHMS = ("topk_allgather", "oktopk", "hitopk", "topk_a2a")


def test_applied_plus_flushed_is_the_dense_average():
    results = run_ranks(flush_workers.every_space_then_ddp, 4, ALGORITHMS, 2)
    for rank in results:
        for algorithm in ALGORITHMS:
            r = rank[algorithm]
            assert r["held_l1"] > 0 and r["flushed_l1"] == r["held_l1"], (algorithm, r)
            assert r["error"] < 1e-5, (algorithm, r)
            assert r["after"] == 0 and r["buckets"] >= 1, (algorithm, r)
        assert rank["ddp"]["relative_error"] < 1e-5, rank["ddp"]
        powersgd = rank["powersgd"]  # its error memory, flushed the same way
        assert powersgd["flushed"]["l1"] > 0 and powersgd["relative_error"] < 1e-5, powersgd
        # compressing from the first step, before DDP's rebuild: nothing lost through it
        from_0 = rank["powersgd_from_0"]
        assert from_0["compressed_first"] and from_0["relative_error"] < 1e-5, from_0


HITOPK = {"algorithm": "hitopk", "density": 0.05, "selector": "exact"}
POWERSGD = {"algorithm": "powersgd", "powersgd_rank": 1}


def test_a_switch_hands_the_residuals_over_and_nothing_is_lost():
    """Re-planning's switch (thinwire.train.replan.switch) adds each rank's residual to its
    next gradient instead of flushing it densely: applied + what the new algorithm holds at
    the end = the dense average over every step, either way between hitopk and PowerSGD, and
    into a dense all-reduce; PowerSGD compresses from its first step after the switch."""
    dense = {"algorithm": "allreduce"}
    # handed over in 16 shares, 3 steps taken: the rest is flushed with the new residuals;
    # in 2 shares, all of it delivered by the steps
    pairs = [(HITOPK, POWERSGD, 16), (POWERSGD, HITOPK, 16), (HITOPK, dense, 16),
             (HITOPK, POWERSGD, 2), (HITOPK, dense, 2)]
    results = run_ranks(flush_workers.switch_conservation, 4, 2, pairs)
    for rank in results:
        for name, r in rank.items():
            assert r["handed_over"]["l1"] > 0, (name, r)  # the first held mass back
            steps = name.split(" in ")[1]
            assert r["handed_over"]["how"] == f"handed over in {steps} steps", (name, r)
            assert r["relative_error"] < 1e-5, (name, r)
            assert r["owed_after"] == (steps == "16") and not r["owed_after_flush"], (name, r)
        assert rank["hitopk->powersgd in 16"]["compressed_at_once"]
        # dense: nothing held after, but for the shares not delivered yet
        assert rank["hitopk->allreduce in 16"]["held_after"]["owed_from_a_switch_l1"] > 0
        assert rank["hitopk->allreduce in 2"]["held_after"].get("l1", 0) == 0
        assert "owed_from_a_switch_l1" not in rank["hitopk->allreduce in 2"]["held_after"]


def test_with_momentum_correction_a_switch_flushes_densely():
    """DGC's residual is accumulated velocity: handed to the new algorithm's momentum it would
    be counted again at every step it stays unsent, so those switches flush as before."""
    results = run_ranks(flush_workers.switch_with_momentum_correction, 4, 2)
    for record in results:
        assert record["how"] == "flushed densely" and record["l1"] > 0, record
