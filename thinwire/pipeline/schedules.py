"""The three schedules as per-stage operation lists, and the delays they imply.

An operation is ``("F", i)`` (forward of micro-batch i), ``("B", i)`` (its backward) or
``("U", k)`` (the k-th weight update of that stage). Each stage runs its list in order; the
multi-process engine and the single-process emulation execute the same lists, which is what makes
them equal: a stage's result depends only on the order of its own operations and the contents of
the messages it receives, never on when they arrive.

* ``pb`` (fine-grained pipelined backpropagation): in time slot t stage s runs the forward of
  micro-batch ``t - s`` and the backward of micro-batch ``t - (2S - 2 - s)``, then updates. The
  last stage runs forward and backward of the same micro-batch in one slot. No flush ever.
* ``gpipe``: for each group of M micro-batches every stage runs the M forwards, then the M
  backwards, then one update (fill and drain).
* ``1f1b`` (PipeDream-flush): stage s runs ``min(S-1-s, M)`` warm-up forwards, then alternates
  one forward and one backward, then the remaining backwards, then one update per group.
* ``ticktock`` (Wavelet's model-parallel tick-tock, ``thinwire/pipeline/ticktock.py``):
  gpipe's groups of M micro-batches as two waves of M/2, the second on the model placed in
  reverse order so that it runs in the first one's bubbles. Its lists are per *rank* (each
  rank holds two partitions) and run on ``thinwire.pipeline.ticktock_engine``.
"""

from __future__ import annotations

Op = tuple[str, int]
SCHEDULES = ("pb", "gpipe", "1f1b", "ticktock")


def check_schedule(schedule: str, stages: int, micro_batches: int, group: int) -> None:
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {', '.join(SCHEDULES)}, got {schedule!r}")
    if not isinstance(stages, int) or stages < 1:
        raise ValueError(f"stages must be an integer >= 1, got {stages!r}")
    if not isinstance(micro_batches, int) or micro_batches < 1:
        raise ValueError(f"number of micro-batches to train on must be >= 1, got {micro_batches!r}")
    if schedule != "pb":
        if not isinstance(group, int) or group < 1:
            raise ValueError(f"micro-batches per update (M) must be an integer >= 1, got {group!r}")
        if micro_batches < group:
            raise ValueError(f"{schedule} needs at least M={group} micro-batches, got "
                             f"{micro_batches}")


def build(schedule: str, stages: int, micro_batches: int, group: int = 1) -> list[list[Op]]:
    """Per-stage operation lists for ``micro_batches`` micro-batches (``gpipe``/``1f1b`` use
    ``micro_batches // group`` whole groups; a remainder is not trained on)."""
    check_schedule(schedule, stages, micro_batches, group)
    if schedule == "pb":
        return _pb(stages, micro_batches)
    if schedule == "ticktock":
        from thinwire.pipeline import ticktock

        return ticktock.build(stages, micro_batches, group)
    return _flushed(schedule, stages, micro_batches // group, group)


def _pb(S: int, T: int) -> list[list[Op]]:
    ops: list[list[Op]] = [[] for _ in range(S)]
    updates = [0] * S
    for t in range(T + 2 * S - 2):
        for s in range(S):
            if 0 <= t - s < T:
                ops[s].append(("F", t - s))
            b = t - (2 * S - 2 - s)
            if 0 <= b < T:
                ops[s].append(("B", b))
                ops[s].append(("U", updates[s]))
                updates[s] += 1
    return ops


def _flushed(schedule: str, S: int, groups: int, M: int) -> list[list[Op]]:
    ops: list[list[Op]] = [[] for _ in range(S)]
    for g in range(groups):
        ids = list(range(g * M, (g + 1) * M))
        for s in range(S):
            if schedule == "gpipe":
                ops[s] += [("F", i) for i in ids] + [("B", i) for i in ids]
            else:
                warm = min(S - 1 - s, M)
                ops[s] += [("F", i) for i in ids[:warm]]
                for k in range(M - warm):
                    ops[s] += [("F", ids[warm + k]), ("B", ids[k])]
                ops[s] += [("B", i) for i in ids[M - warm:]]
            ops[s].append(("U", g))
    return ops


def delay_formula(schedule: str, stages: int, stage: int) -> int:
    """D_s: weight updates a stage applies between reading its weights for a micro-batch's
    forward and applying that micro-batch's gradient. ``2 (S - 1 - s)`` for ``pb`` (s from 0:
    the micro-batch still has S-1-s stages to go forward and as many to come back), 0 for the
    flushed schedules."""
    if not 0 <= stage < stages:
        raise ValueError(f"stage must be in 0..{stages - 1}, got {stage}")
    return 2 * (stages - 1 - stage) if schedule == "pb" else 0


def measured_delays(ops: list[list[Op]]) -> list[int]:
    """Each stage's largest delay, counted on its operation list: updates between F(i) and B(i)
    (the update right after B(i) is the one that applies micro-batch i's gradient)."""
    delays = []
    for stage_ops in ops:
        seen_updates, at_forward, worst = 0, {}, 0
        for kind, i in stage_ops:
            if kind == "F":
                at_forward[i] = seen_updates
            elif kind == "B":
                worst = max(worst, seen_updates - at_forward.pop(i))
            else:
                seen_updates += 1
        delays.append(worst)
    return delays
