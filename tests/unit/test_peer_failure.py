"""A lost peer is said in one line (thinwire.peer_failure, rank_exit.failure_status); any
other error keeps its traceback. The texts are the ones gloo, DDP and dlcp's transport raise
(copied from the survivors of tests/faults/peer_failure.py)."""

from __future__ import annotations

import pytest
import torch.distributed as dist

from thinwire import peer_failure
from thinwire.rank_exit import failure_status

GLOO_RESET = ("[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:537] Read "
              "error [127.0.0.1]:5522: Connection reset by peer. This is typically caused by a "
              "remote worker hanging or bugs in the application. Check the logs of the remote "
              "worker before reporting an error. GLHF!")
GLOO_TIMEOUT = ("[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:78]"
                " Timed out waiting 10000ms for recv operation to complete")


def _raised(exc: Exception, *notes: str) -> Exception:
    for note in notes:
        exc.add_note(note)
    return exc


def test_a_hook_failure_through_ddp_names_rank_phase_bucket_step_and_reason():
    # DDP's C++ side keeps only the text: "Got the following error when running the callback"
    exc = _raised(RuntimeError("Got the following error when running the callback: "
                               f"RuntimeError: {GLOO_RESET}"),
                  peer_failure.where_note("hitopk", "inter-node", 2, 32),
                  peer_failure.step_note(3, "in a training step", 33))
    line = peer_failure.describe(exc, rank=0)
    assert line == ("rank 3 lost a peer in the inter-node phase of bucket 2 of hitopk at step "
                    "33: Read error [127.0.0.1]:5522: Connection reset by peer")


def test_a_timeout_outside_thinwires_collectives_names_what_the_loop_was_doing():
    exc = _raised(dist.DistBackendError(GLOO_TIMEOUT), peer_failure.step_note(1, "evaluating", 8))
    assert peer_failure.describe(exc) == ("rank 1 lost a peer evaluating at step 8: Timed out "
                                          "waiting 10000ms for recv operation to complete")


def test_the_phase_note_alone_counts_steps_from_one():
    exc = _raised(TimeoutError("dlcp: no datagram from rank 1 for 10 s (round 4)"),
                  peer_failure.where_note("dlcp", "inter-node", 0, 6))
    assert peer_failure.describe(exc, rank=0).startswith(
        "rank 0 lost a peer in the inter-node phase of bucket 0 of dlcp at step 7: dlcp: no ")


def test_the_cause_is_found_through_the_chain():
    try:
        try:
            raise ConnectionResetError("Connection reset by peer")
        except ConnectionResetError as inner:
            raise RuntimeError("exchange failed") from inner
    except RuntimeError as exc:
        assert peer_failure.describe(exc, rank=2) == \
            "rank 2 lost a peer in a collective: Connection reset by peer"


@pytest.mark.parametrize("exc", [ValueError("timed out is not a shape"),
                                 RuntimeError("mat1 and mat2 shapes cannot be multiplied"),
                                 FloatingPointError("NaN in bucket 0 on rank(s) [1]"),
                                 KeyError("timeout")])
def test_anything_else_is_not_a_lost_peer(exc):
    assert peer_failure.describe(exc, rank=0) is None


def test_noting_adds_the_loops_note_and_reraises():
    with pytest.raises(OSError) as caught:
        with peer_failure.noting(0, "saving a checkpoint", 12):
            raise OSError("Broken pipe")
    assert caught.value.__notes__ == ["thinwire: rank 0 was saving a checkpoint at step 12"]


def test_failure_status(capsys, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    lost = RuntimeError(GLOO_TIMEOUT)
    assert failure_status(lost, "thinwire train") == 1
    # kept alive until the process ends: freeing its traceback could tear the failed model
    # down on a dead peer
    from thinwire import rank_exit
    assert rank_exit._REPORTED[-1] is lost
    err = capsys.readouterr().err
    assert err.splitlines() == ["thinwire train: error: rank 1 lost a peer in a collective: "
                                "Timed out waiting 10000ms for recv operation to complete"]
    assert failure_status(ValueError("--lr must be > 0, got -1"), "thinwire") == 2
    assert capsys.readouterr().err == "thinwire: error: --lr must be > 0, got -1\n"
    # a bug keeps its traceback: printed by a rank (which then ends through exit_rank),
    # raised by a plain command
    assert failure_status(ZeroDivisionError("division by zero"), "thinwire train") == 1
    assert "ZeroDivisionError: division by zero" in capsys.readouterr().err
    with pytest.raises(ZeroDivisionError):
        failure_status(ZeroDivisionError("division by zero"), "thinwire", rank_process=False)
    # a command that is not a rank says what failed, not which rank lost a peer
    assert failure_status(ConnectionRefusedError(111, "Connection refused"), "thinwire",
                          rank_process=False) == 1
    assert capsys.readouterr().err == "thinwire: error: [Errno 111] Connection refused\n"


def test_a_bug_raised_while_a_timeout_was_handled_is_a_bug():
    try:
        try:
            raise TimeoutError("no answer for 10 s")
        except TimeoutError:
            raise KeyError("a bug in the handler")
    except KeyError as exc:
        assert exc.__context__ is not None and peer_failure.describe(exc, 0) is None


def test_a_pipeline_note_counts_micro_batches():
    exc = RuntimeError(GLOO_TIMEOUT)
    exc.add_note(peer_failure.step_note(1, "in a backward", 3391, "micro-batch"))
    assert peer_failure.describe(exc) == ("rank 1 lost a peer in a backward at micro-batch "
                                          "3391: Timed out waiting 10000ms for recv operation "
                                          "to complete")
