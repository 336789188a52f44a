"""`thinwire train --resume` end to end on loopback with a damaged checkpoint: two ranks agree
on a step both can resume from, or every rank ends with the same clear error (exit 2, no
traceback, no hang); a world of one through the `thinwire` command."""

from __future__ import annotations

import shutil

import procs
import pytest

import ckpt_helpers as H
from thinwire.train import checkpoint
from thinwire.train.checkpoint import previous_file, rank_file


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    directory = tmp_path_factory.mktemp("e2e") / "run"
    results = H.launch(2, ["--checkpoint", str(directory), "--checkpoint-every", "2",
                           "--stop-after", "4"])
    assert [status for status, _ in results] == [0, 0], results
    return directory


def _copy(source, tmp_path):
    target = tmp_path / "run"
    shutil.copytree(source, target)
    return target


def test_one_rank_damaged_both_resume_from_the_common_step(two_ranks, tmp_path):
    run = _copy(two_ranks, tmp_path)
    H.flip_bytes(rank_file(run, 1))
    results = H.launch(2, ["--checkpoint", str(run), "--resume", str(run)])
    assert [status for status, _ in results] == [0, 0], results
    assert "rank1.pt: checksum mismatch" in results[1][1]
    assert "resuming from the checkpoint of step 2, not 4" in results[0][1]
    assert all("Traceback" not in err for _, err in results)
    assert [checkpoint.read(rank_file(run, r), r)["step"] for r in range(2)] == [6, 6]


def test_no_usable_checkpoint_on_one_rank_ends_every_rank_clearly(two_ranks, tmp_path):
    run = _copy(two_ranks, tmp_path)
    for path in (rank_file(run, 1), previous_file(run, 1)):
        path.write_bytes(path.read_bytes()[:5000])
    results = H.launch(2, ["--checkpoint", str(run), "--resume", str(run)], timeout_s=300)
    assert [status for status, _ in results] == [2, 2], results
    assert all("Traceback" not in err and "error: --resume" in err for _, err in results)
    assert "checksum mismatch" in results[1][1] and "rank(s) [1]" in results[0][1]


@pytest.mark.parametrize("damage", ["flipped"])
def test_thinwire_train_resume_command(two_ranks, tmp_path, damage):
    """A world of one resuming rank 0's files of the two-rank run is refused (world size), so
    a one-rank checkpoint is made first; then the newest is damaged. (A truncated file takes
    the same fallback through the command; its detection is test_checkpoint_faults': one
    damage here, 10 s, is what the command path needs.)"""
    run = tmp_path / "one"
    H.make(run)
    if damage == "flipped":
        H.flip_bytes(rank_file(run, 0))
    else:
        path = rank_file(run, 0)
        path.write_bytes(path.read_bytes()[:777])
    done = procs.run_python(["-m", "thinwire.cli", "train", *H.CLI_ARGS,
                             "--checkpoint", str(run), "--resume", str(run)], timeout_s=180)
    assert done.returncode == 0, done.stderr
    assert f"not resuming from {rank_file(run, 0)}" in done.stderr
    assert "fell back to the previous checkpoint (step 2)" in done.stderr
    assert checkpoint.read(rank_file(run, 0), 0)["step"] == 6
    previous_file(run, 0).write_bytes(b"")
    rank_file(run, 0).write_bytes(b"junk")
    done = procs.run_python(["-m", "thinwire.cli", "train", *H.CLI_ARGS,
                             "--checkpoint", str(run), "--resume", str(run)], timeout_s=180)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert "thinwire: error: --resume" in done.stderr and "empty file" in done.stderr
