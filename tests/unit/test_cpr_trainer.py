"""The emulated CPR trainer: exact full recovery, partial restores, PLS accounting, MFU/SSU."""

import pytest
import torch

from thinwire.recsys.cpr import (CheckpointStore, CPRConfig, Failure, ShardedTrainer, TimeModel,
                                 failure_schedule, pls, run, summary)
from thinwire.recsys.data import rank_batches, synthetic
from thinwire.recsys.models import make_model
from thinwire.recsys.sharded import owner_of

N, B = 4, 64


@pytest.fixture(scope="module")
def batches():
    data = synthetic(1600, fields=4, vocab_per_field=150, mean_multi_hot=2.0, seed=1)
    return data, list(rank_batches(data, B, 0, 1, 0, 0))  # 25 steps


def _trainer(data, path):
    torch.manual_seed(0)
    return ShardedTrainer(make_model("fm", data.num_fields, k=4, seed=0), data.num_rows, N,
                          CheckpointStore(path))


def _states(trainer):
    return [s.state_dict() for s in trainer.shards]


def _equal(a, b):
    return torch.equal(a["rows"], b["rows"]) and all(
        torch.equal(a["optimizer_state"][k], b["optimizer_state"][k])
        for k in a["optimizer_state"])


def test_full_recovery_redoes_lost_work_exactly(batches, tmp_path):
    data, steps = batches
    steps = steps[:14]
    tm = TimeModel(t_step=100.0, mtbf=400.0, t_save=75.0, t_load=10.0, t_res=5.0)
    clean = _trainer(data, tmp_path / "clean")
    run(clean, steps, CPRConfig("full", n_emb=N), tm, [])
    failed = _trainer(data, tmp_path / "failed")
    failures = failure_schedule(tm.mtbf, 10 * len(steps) * tm.t_step, N, seed=5)
    stats = run(failed, steps, CPRConfig("full", n_emb=N), tm, failures)
    assert stats.failures >= 2 and stats.lost_time > 0
    assert all(_equal(a, b) for a, b in zip(_states(clean), _states(failed)))
    for p, q in zip(clean.model.dense.parameters(), failed.model.dense.parameters()):
        assert torch.equal(p, q)


def test_partial_recovery_reloads_only_the_failed_shard(batches, tmp_path):
    data, steps = batches
    steps = steps[:11]
    tm = TimeModel(t_step=1.0, mtbf=8.0, t_save=0.0, t_load=0.0, t_res=0.0)
    cfg = CPRConfig("partial", n_emb=N, pls_target=4 / (2 * N * 8.0))  # interval: 4 steps
    ref = _trainer(data, tmp_path / "ref")
    run(ref, steps, cfg, tm, [])
    at_save = _trainer(data, tmp_path / "at_save")
    run(at_save, steps[:8], cfg, tm, [])
    part = _trainer(data, tmp_path / "part")
    stats = run(part, steps, cfg, tm, [Failure(10.5, 2)])  # after step 11, last save: step 8
    got, want, saved = _states(part), _states(ref), _states(at_save)
    assert _equal(got[2], saved[2]) and not _equal(got[2], want[2])
    assert all(_equal(got[k], want[k]) for k in (0, 1, 3))
    assert stats.lost_samples == (11 - 8) * B / N
    row = summary(stats, cfg, tm, B, part.total_rows)
    assert row["pls"] == pytest.approx(3 * B / N / (11 * B))


def test_pls_accounting_matches_the_formula(batches, tmp_path):
    data, steps = batches
    steps = steps[:24]
    every, t_step = 4, 10.0
    mtbf = every * t_step  # one failure per interval, each in its middle
    tm = TimeModel(t_step=t_step, mtbf=mtbf, t_save=0.0, t_load=0.0, t_res=0.0)
    cfg = CPRConfig("partial", n_emb=N, pls_target=1 / (2 * N))
    assert cfg.interval(tm) == pytest.approx(every * t_step)
    failures = [Failure((j * every + every // 2 - 0.5) * t_step, j % N)
                for j in range(len(steps) // every)]
    stats = run(_trainer(data, tmp_path), steps, cfg, tm, failures)
    row = summary(stats, cfg, tm, B, 1)
    assert stats.failures == len(failures)
    assert row["pls"] == pytest.approx(pls(every * t_step, N, mtbf))
    assert row["pls_model"] == pytest.approx(1 / (2 * N))


def _counts(trainer, batch_list, k):
    shard = trainer.shards[k]
    ids = torch.cat([b.ids for b in batch_list])
    ids = ids[owner_of(ids, N) == k]
    return torch.bincount(shard.lookup(ids), minlength=len(shard))


def test_mfu_saves_the_most_used_rows(batches, tmp_path):
    data, steps = batches
    tm = TimeModel(t_step=1.0, mtbf=10.0, t_save=8.0, t_load=1.0, t_res=1.0)
    cfg = CPRConfig("mfu", n_emb=N, pls_target=0.25, mfu_fraction=0.1, sub_saves=4)
    every = round(cfg.interval(tm))
    assert every == 5
    trainer = _trainer(data, tmp_path)
    stats = run(trainer, steps[:every + 1], cfg, tm, [])
    counts = _counts(trainer, steps[:every], 0)
    (_, _, path), = [v for v in trainer.store.versions("shard0") if v[1] == "delta"]
    saved = trainer.shards[0].lookup(trainer.store.read(path)["ids"])
    mask = torch.zeros(len(counts), dtype=torch.bool)
    mask[saved] = True
    assert len(saved) == -(-len(counts) // 10)
    assert counts[mask].min() >= counts[~mask].max() and counts[mask].min() > 0
    assert stats.rows_written < trainer.total_rows / 5


def test_ssu_saves_rows_of_sampled_samples(batches, tmp_path):
    data, steps = batches
    tm = TimeModel(t_step=1.0, mtbf=10.0, t_save=8.0, t_load=1.0, t_res=1.0)
    cfg = CPRConfig("ssu", n_emb=N, pls_target=0.25, ssu_rate=0.1, sub_saves=4)
    trainer = _trainer(data, tmp_path)
    stats = run(trainer, steps[:6], cfg, tm, [])
    touched = _counts(trainer, steps[:5], 1) > 0
    (_, _, path), = [v for v in trainer.store.versions("shard1") if v[1] == "delta"]
    saved = trainer.shards[1].lookup(trainer.store.read(path)["ids"])
    assert 0 < len(saved) < int(touched.sum()) and bool(touched[saved].all())
    assert stats.saves == 1


def test_run_rejects_mismatched_shards(batches, tmp_path):
    data, steps = batches
    with pytest.raises(ValueError, match="n_emb=8 does not match"):
        run(_trainer(data, tmp_path), steps, CPRConfig("full", n_emb=8), TimeModel(1.0), [])
