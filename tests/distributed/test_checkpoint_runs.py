"""Ranks resume only from files of one run (issue 33, item 4): every checkpoint carries the run's
id, and a step whose files belong to different runs (another run's rank-1 file copied in) is
not resumed from; the older step of the same run is, or every rank fails with a clear error."""

from __future__ import annotations

import pytest

from harness import run_ranks


def _agree(rank, world, runs_by_rank):
    from thinwire.train import checkpoint

    runs = runs_by_rank[rank]
    refused: list[str] = []
    try:
        return checkpoint._agree(sorted(runs), False, "ck", refused, runs), refused
    except checkpoint.NoUsableCheckpoint as exc:
        return str(exc), refused


def test_a_step_whose_files_belong_to_different_runs_is_not_resumed_from():
    results = run_ranks(_agree, 2, [{2: 11, 4: 11}, {2: 11, 4: 22}])
    for step, refused in results:
        assert step == 2
        assert any("step 4 belong to different runs" in r for r in refused)


def test_no_common_run_is_a_clear_error_on_every_rank():
    results = run_ranks(_agree, 2, [{2: 11, 4: 11}, {2: 22, 4: 22}])
    for message, _ in results:
        assert "no usable checkpoint" in message and "different runs" in message


@pytest.mark.parametrize("runs", [[{2: 11, 4: 11}, {2: 11, 4: 11}],
                                  [{2: 11, 4: 0}, {2: 11, 4: 33}]],  # 0: before run ids
                         ids=["same-run", "an-old-file"])
def test_files_of_one_run_resume_from_the_newest_step(runs):
    for step, refused in run_ranks(_agree, 2, runs):
        assert step == 4 and refused == []


def _ids(rank, world):
    import torch

    from thinwire.train import checkpoint
    return checkpoint.run_id(None, torch.device("cpu")), checkpoint.run_id(
        {"run": 77}, torch.device("cpu"))


def test_a_new_run_gets_one_id_on_every_rank():
    results = run_ranks(_ids, 3)
    assert len({new for new, _ in results}) == 1 and all(old == 77 for _, old in results)


def _resume_directory(rank, world, directories, with_file):
    from pathlib import Path

    from thinwire.train import TrainConfig, checkpoint

    if with_file[rank]:
        Path(directories[rank], f"rank{rank}.pt").write_bytes(b"")
    cfg = TrainConfig(checkpoint=directories[rank], resume_if_present=True)
    try:
        return checkpoint.agreed_resume_directory(cfg)
    except checkpoint.NoUsableCheckpoint as exc:
        return str(exc)


@pytest.mark.parametrize("with_file", [(True, False), (False, False), (True, True)])
def test_resume_if_present_on_some_ranks_only_ends_every_rank(tmp_path, with_file):
    """Node-local checkpoint directories, one of them empty (a replacement node): the rank
    that found files would load and gather while the other built its model (a hang). Every
    rank raises instead; where all or none found files, each goes on alike."""
    directories = [tmp_path / "node0", tmp_path / "node1"]
    for directory in directories:
        directory.mkdir()
    results = run_ranks(_resume_directory, 2, [str(d) for d in directories], with_file)
    if all(with_file):
        assert results == [str(d) for d in directories]
    elif not any(with_file):
        assert results == [None, None]
    else:
        for message in results:
            assert "rank(s) [0] found a checkpoint" in message and "rank(s) [1] did not" \
                in message
