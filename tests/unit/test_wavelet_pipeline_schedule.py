"""The model-parallel tick-tock schedule (Wavelet on the pipeline engine): its operation lists
are complete, deadlock-free and message-consistent, and in the bubble model (forward 1,
backward 2, free messages) they finish a group sooner than gpipe's lists."""

from __future__ import annotations

import pytest

from thinwire.pipeline import schedules
from thinwire.pipeline.config import PipelineConfig
from thinwire.pipeline.emulate import emulate
from thinwire.pipeline import ticktock as tt


@pytest.mark.parametrize("S,M,groups", [(1, 2, 2), (2, 4, 2), (3, 2, 3), (4, 4, 2), (4, 8, 1),
                                        (5, 6, 2)])
def test_every_rank_runs_each_micro_batch_once_on_its_partition_of_the_wave(S, M, groups):
    ops = schedules.build("ticktock", S, M * groups + 1, M)  # a remainder is not trained on
    assert len(ops) == S
    for r, rank_ops in enumerate(ops):
        assert sorted(i for k, i in rank_ops if k == "F") == list(range(M * groups))
        assert sorted(i for k, i in rank_ops if k == "B") == list(range(M * groups))
        assert [i for k, i in rank_ops if k == "U"] == list(range(groups))
        for g in range(groups):  # each group's operations come before its update
            u = rank_ops.index(("U", g))
            assert all(i // M == g for k, i in rank_ops[:u] if k != "U" and i // M >= g)
            assert all(i // M > g for k, i in rank_ops[u + 1:] if k != "U")
        seen = set()
        for k, i in rank_ops:  # each wave keeps gpipe's order: a backward after its forward
            if k == "F":
                seen.add(i)
            elif k == "B":
                assert i in seen
    assert sum(tt.wave_of(i, M) == tt.TICK for i in range(M)) == M // 2
    tt.check_message_order(ops, S, M)
    tt.makespan(ops, S, M)  # raises if the lists deadlock


def test_the_tock_wave_runs_on_the_reversed_placement():
    assert [tt.partition_of(r, tt.TICK, 4) for r in range(4)] == [0, 1, 2, 3]
    assert [tt.partition_of(r, tt.TOCK, 4) for r in range(4)] == [3, 2, 1, 0]
    assert [tt.partner(r, 4) for r in range(4)] == [3, 2, 1, 0]
    assert all(tt.rank_of(tt.partition_of(r, w, 5), w, 5) == r for r in range(5) for w in (0, 1))


def _gpipe_makespan(S: int, M: int, groups: int) -> int:
    """The same bubble model run on gpipe's per-stage lists (one partition per rank)."""
    ops = schedules.build("gpipe", S, M * groups, M)
    finish, t_free, pos = {}, [0] * S, [0] * S
    remaining = sum(map(len, ops))
    while remaining:
        for s in range(S):
            while pos[s] < len(ops[s]):
                k, i = ops[s][pos[s]]
                dep = ((k, i, s - 1) if k == "F" and s > 0 else
                       (k, i, s + 1) if k == "B" and s < S - 1 else None)
                if dep is not None and dep not in finish:
                    break
                t_free[s] = max(t_free[s], finish.get(dep, 0)) + tt.COST[k]
                finish[(k, i, s)] = t_free[s]
                pos[s] += 1
                remaining -= 1
    return max(t_free)


@pytest.mark.parametrize("S,M", [(2, 4), (4, 4), (4, 8)])
def test_bubble_model_ticktock_is_shorter_than_gpipe(S, M):
    groups = 3
    ticktock = tt.makespan(tt.build(S, M * groups, M), S, M)
    assert _gpipe_makespan(S, M, groups) == 3 * groups * (M + S - 1)  # the model is gpipe's
    assert ticktock < _gpipe_makespan(S, M, groups)
    # against one wave of M/2 (twice, for the same micro-batches): Wavelet's comparison
    assert ticktock * 1.25 <= 2 * _gpipe_makespan(S, M // 2, groups)


@pytest.mark.parametrize("kwargs,message", [
    (dict(group=3), r"group \(M\) must be even for ticktock \(M/2 micro-batches per wave\), "
                    r"got 3"),
    (dict(group=1), r"group \(M\) must be even for ticktock"),
])
def test_bad_group_is_refused_clearly(kwargs, message):
    with pytest.raises(ValueError, match=message):
        PipelineConfig(schedule="ticktock", train_samples=8, **kwargs).validate()


def test_schedule_arguments_are_checked():
    with pytest.raises(ValueError, match="even number of micro-batches per update"):
        tt.build(4, 8, 3)
    with pytest.raises(ValueError, match="at least M=4 micro-batches, got 2"):
        tt.build(4, 2, 4)
    with pytest.raises(ValueError, match="stages must be an integer >= 1, got 0"):
        tt.build(0, 8, 4)


def test_emulation_refuses_ticktock():
    with pytest.raises(ValueError, match="multi-process engine only"):
        emulate(PipelineConfig(schedule="ticktock", stages=2, hidden=[8], train_samples=8), None)
