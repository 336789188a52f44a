"""Model-parallel tick-tock (Wavelet) as operation lists for the pipeline engine.

Wavelet's model-parallel form (Wang et al., MLSys 2021) runs a second wave of micro-batches on
the same devices as a GPipe pipeline, with the model's partitions placed in the *reverse* order
for that wave: device r holds partition r of the tick wave and partition S-1-r of the tock wave.
The tick wave's forward fills the pipeline from device 0 while the tock wave's fills it from
device S-1, so the devices the tick leaves idle at the start and end of its fill and drain (the
bubbles) are the ones where the tock is busy, and the other way round. The two waves are one
data-parallel job: each partition exists twice (tick copy on device p, tock copy on device
S-1-p); at the end of a group both copies add their gradients (one exchange between the pair
of devices) and take the same step, so they stay bitwise equal and the update is GPipe's update
over the group's M micro-batches.

Micro-batches: group g holds ids ``g M .. g M + M - 1``; the first M/2 are the tick wave's, the
last M/2 the tock wave's, so a run trains on exactly the micro-batches of ``gpipe`` with the same
M, in the same groups.

Operation lists (per *rank*, not per partition): ``("F", i)`` / ``("B", i)`` run micro-batch i on
the rank's partition of i's wave, ``("U", g)`` exchanges gradients with the partner and updates
both partitions. The order within a rank comes from a list-scheduling simulation with a forward
costing 1 and a backward 2 (the usual ratio): whenever a rank is free it starts the ready
operation that became ready first (ties: backward before forward, then tick before tock, then
lower id). Each wave keeps GPipe's own order (its M/2 forwards, then its backwards, on every
partition). Because the lists are one valid execution of the dependency graph, the engine, which
runs each list in order with blocking receives, cannot deadlock (tested), and every stream of
messages between two ranks is sent and received in the same order (checked by ``build``).
"""

from __future__ import annotations

import functools
import heapq
import random

Op = tuple[str, int]
TICK, TOCK = 0, 1
COST = {"F": 1, "B": 2, "U": 0}
SEARCH_TRIALS = 200


def check(stages: int, micro_batches: int, group: int) -> None:
    if not isinstance(stages, int) or stages < 1:
        raise ValueError(f"stages must be an integer >= 1, got {stages!r}")
    if not isinstance(group, int) or group < 2 or group % 2:
        raise ValueError(f"ticktock needs an even number of micro-batches per update (M, half "
                         f"for each wave) >= 2, got M={group!r}")
    if not isinstance(micro_batches, int) or micro_batches < group:
        raise ValueError(f"ticktock needs at least M={group} micro-batches, got {micro_batches!r}")


def wave_of(i: int, group: int) -> int:
    """TICK for the first half of micro-batch i's group, TOCK for the second."""
    return TICK if i % group < group // 2 else TOCK


def partition_of(rank: int, wave: int, stages: int) -> int:
    """The model partition a rank runs for a wave (the tock wave's placement is reversed)."""
    return rank if wave == TICK else stages - 1 - rank


def rank_of(partition: int, wave: int, stages: int) -> int:
    return partition if wave == TICK else stages - 1 - partition


def partner(rank: int, stages: int) -> int:
    """The rank holding the other copy of this rank's tick partition (itself in the middle of
    an odd pipeline)."""
    return stages - 1 - rank


def build(stages: int, micro_batches: int, group: int) -> list[list[Op]]:
    """Per-rank operation lists for ``micro_batches // group`` whole groups."""
    check(stages, micro_batches, group)
    S, M = stages, group
    template = _best_group(S, M)
    ops: list[list[Op]] = [[] for _ in range(S)]
    for g in range(micro_batches // M):
        for r in range(S):
            ops[r] += [(k, g if k == "U" else i + g * M) for k, i in template[r]]
    check_message_order(ops, S, M)
    return ops


@functools.lru_cache(maxsize=32)
def _best_group(S: int, M: int, trials: int = SEARCH_TRIALS) -> tuple[tuple[Op, ...], ...]:
    """One group's lists (micro-batches 0..M-1): the list scheduler with its plain tie-break
    first, then with seeded random tie-breaks, keeping the shortest makespan. Greedy list
    scheduling alone leaves the middle ranks (which hold two partitions whose backwards meet)
    badly ordered. The seed is fixed, so every rank builds the same lists."""
    rng = random.Random(0)
    best, best_len = None, None
    for trial in range(trials):
        tie = {} if trial == 0 else {(r, k, i): rng.random() for r in range(S) for k in "FB"
                                     for i in range(M)}
        order = _one_group(S, M, tie)
        # scored on two groups back to back: where one group ends shapes the next one's start
        twice = [ops + [(k, 1 if k == "U" else i + M) for k, i in ops] for ops in order]
        length = makespan(twice, S, M)
        if best_len is None or length < best_len:
            best, best_len = order, length
    return tuple(tuple(rank_ops) for rank_ops in best)


def _one_group(S: int, M: int, tie: dict) -> list[list[Op]]:
    """Simulate group 0: returns each rank's operations in the order they started."""
    ids = {TICK: range(0, M // 2), TOCK: range(M // 2, M)}
    done: dict[tuple[str, int, int], int] = {}  # (kind, micro-batch, partition) -> finish time

    def ready_at(kind: str, i: int, p: int) -> int | None:
        """When (kind, i) on partition p may start, or None while a dependency is unfinished."""
        w = wave_of(i, M)
        if kind == "F":
            deps = [("F", i, p - 1)] if p > 0 else []
        elif p == S - 1:  # GPipe: the last partition's backwards follow all the wave's forwards
            deps = [("F", j, p) for j in ids[w]]
        else:
            deps = [("B", i, p + 1), ("F", i, p)]
        times = [done.get(d) for d in deps]
        return None if any(t is None for t in times) else max(times, default=0)

    pending = [[(k, i) for w in (TICK, TOCK) for k in ("F", "B") for i in ids[w]]
               for _ in range(S)]
    order: list[list[Op]] = [[] for _ in range(S)]
    free = [0] * S
    events: list[tuple[int, int]] = [(0, r) for r in range(S)]  # (time, rank) a rank is free
    while events:
        t, r = heapq.heappop(events)
        if t < free[r] or not pending[r]:
            continue
        best = None
        for k, i in pending[r]:
            w = wave_of(i, M)
            at = ready_at(k, i, partition_of(r, w, S))
            if at is not None and at <= t:
                key = (at, tie.get((r, k, i), 0.0), k != "B", w, i)
                if best is None or key < best[0]:
                    best = (key, k, i)
        if best is None:  # nothing ready: every operation that starts wakes it at its end
            continue
        _, k, i = best
        pending[r].remove((k, i))
        end = t + COST[k]
        done[(k, i, partition_of(r, wave_of(i, M), S))] = end
        order[r].append((k, i))
        free[r] = end
        heapq.heappush(events, (end, r))
        for other in range(S):  # an idle rank may now have something ready
            if other != r and pending[other]:
                heapq.heappush(events, (end, other))
    stuck = [r for r in range(S) if pending[r]]
    if stuck:
        raise RuntimeError(f"tick-tock schedule stuck at rank {stuck[0]}: {pending[stuck[0]][:4]}")
    for r in range(S):
        order[r].append(("U", 0))
    return order


def check_message_order(ops: list[list[Op]], S: int, M: int) -> None:
    """Every (sender, receiver, wave, kind) stream must be received in the order it is sent:
    the engine matches point-to-point messages by (source, tag) in order."""
    sent: dict[tuple, list[int]] = {}
    received: dict[tuple, list[int]] = {}
    for r, rank_ops in enumerate(ops):
        for k, i in rank_ops:
            if k == "U":
                continue
            w = wave_of(i, M)
            p = partition_of(r, w, S)
            if k == "F":
                if p < S - 1:
                    sent.setdefault((r, rank_of(p + 1, w, S), w, k), []).append(i)
                if p > 0:
                    received.setdefault((rank_of(p - 1, w, S), r, w, k), []).append(i)
            else:
                if p > 0:
                    sent.setdefault((r, rank_of(p - 1, w, S), w, k), []).append(i)
                if p < S - 1:
                    received.setdefault((rank_of(p + 1, w, S), r, w, k), []).append(i)
    if sent != received:
        bad = sorted(k for k in set(sent) | set(received) if sent.get(k) != received.get(k))
        raise RuntimeError(f"tick-tock schedule sends and receives in different orders on "
                           f"streams {bad[:3]}")


def makespan(ops: list[list[Op]], S: int, M: int) -> int:
    """Length of the lists' execution with the simulation's costs and free messages (an update
    waits for the partner's operations before it): the bubble model of the benchmark."""
    pos, t_free, finish = [0] * S, [0] * S, {}
    remaining = sum(map(len, ops))
    while remaining:
        progressed = False
        for r in range(S):
            while pos[r] < len(ops[r]):
                k, i = ops[r][pos[r]]
                if k == "U":  # starts when this rank and its partner both reach it
                    mate = partner(r, S)
                    if ("U", i, mate) in finish:
                        start = max(t_free[r], finish[("U", i, mate)])
                    elif mate == r or (pos[mate] < len(ops[mate]) and ops[mate][pos[mate]] == (k, i)):
                        start = max(t_free[r], t_free[mate])
                    else:
                        break
                    finish[("U", i, r)] = start
                    t_free[r] = start
                else:
                    w = wave_of(i, M)
                    p = partition_of(r, w, S)
                    dep = ((k, i, p - 1) if k == "F" and p > 0 else
                           (k, i, p + 1) if k == "B" and p < S - 1 else None)
                    if dep is not None and dep not in finish:
                        break
                    t_free[r] = max(t_free[r], finish.get(dep, 0)) + COST[k]
                    finish[(k, i, p)] = t_free[r]
                pos[r] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            raise RuntimeError("tick-tock lists deadlock")
    return max(t_free)

