"""The PowerSGD peer of `thinwire compare` (thinwire.train.grad_sync) cannot deadlock gloo.

PyTorch's powerSGD_hook waits on an all-reduce inside a `.then()` callback that gloo runs on
one of its run-loop threads; with as many buckets in flight as run-loop threads, the process
hangs in backward. grad_sync finishes every bucket before the next: these tests check that, on
2 ranks with a bucket per layer, no bucket is ever in flight when the next starts.
"""

import pytest
import torch

import powersgd_workers as W
from harness import run_ranks
from thinwire.train import grad_sync


def test_powersgd_runs_one_bucket_at_a_time_and_agrees_across_ranks():
    results = run_ranks(W.powersgd_buckets_in_flight, 2)
    for result in results:
        assert result["calls"] >= 2 * W.STEPS  # several buckets a step, every step hooked
        assert result["max_in_flight"] == 0 and result["all_done"]
        assert result["compressed"]
    for a, b in zip(results[0]["grads"], results[1]["grads"]):  # every step, every layer
        for ga, gb in zip(a, b):
            torch.testing.assert_close(ga, gb, rtol=0, atol=0)
    # step 0 is dense (before start_powerSGD_iter): the exact mean of the ranks' gradients
    for got, want in zip(results[0]["grads"][0], W.local_grads(2, 0)):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


class _Options:
    def __init__(self, threads):
        self._threads = threads


class _Group:
    def __init__(self, threads):
        self.options = _Options(threads)

    def _get_backend(self, device):
        return self


def test_a_gloo_group_with_one_run_loop_thread_is_refused():
    with pytest.raises(ValueError, match=r"powersgd on gloo needs a process group with >= 2 "
                                         r"run-loop threads .*got 1"):
        grad_sync.check_gloo_threads_for_powersgd(_Group(1))
    grad_sync.check_gloo_threads_for_powersgd(_Group(2))
