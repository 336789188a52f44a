"""The wavelet benchmark's arithmetic and figure, on a hand-made two-wave summary."""

from __future__ import annotations

import pytest

from thinwire.bench.wavelet import comm_share
from thinwire.wavelet.plot import plot_runs


def _summary() -> dict:
    ranks = []
    for wave in (0, 1):
        events, memory = [], []
        for step in range(5):
            t = 10.0 + step * 1.0 + wave * 0.3
            if wave:
                events.append({"step": step, "kind": "wait", "start": t - 0.3, "end": t})
            events += [{"step": step, "kind": "forward", "start": t, "end": t + 0.1},
                       {"step": step, "kind": "backward", "start": t + 0.1, "end": t + 0.3},
                       {"step": step, "kind": "sync", "start": t + 0.3, "end": t + 0.65},
                       {"step": step, "kind": "update", "start": t + 0.65, "end": t + 0.7}]
            memory += [(t + i * 0.1, (100 + 10 * i) * 2 ** 20, 300 * 2 ** 20 if wave == 0
                        else None) for i in range(7)]
        ranks.append({"rank": wave, "wave": wave, "node": 0, "slot": 0, "events": events,
                      "memory": memory})
    return {"waves": 2, "timed_from": 12.0, "ranks": ranks}


def test_comm_share_is_the_exposed_sync_over_the_step():
    # tick: 0.35 of a 0.7 s step; tock: 0.35 of a 1.0 s step counted from its wait
    assert comm_share(_summary()) == pytest.approx((0.5 + 0.35) / 2)


def test_figure_written(tmp_path):
    path = tmp_path / "w.png"
    plot_runs([("two waves", _summary())], str(path), limit_bytes=400 * 2 ** 20)
    assert path.stat().st_size > 10_000


def test_registered_as_a_benchmark():
    import argparse

    from thinwire import bench
    parser = argparse.ArgumentParser()
    bench.register(parser.add_subparsers())
    args = parser.parse_args(["bench", "wavelet", "--fit-fractions-two", "1,0.5"])
    assert args.fit_fractions_two == [1.0, 0.5] and args.nodes == 2
