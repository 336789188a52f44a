"""The benchmarks refuse bad values in argparse, before any cluster is built (issue 33, item 5):
they used to reach the launched ranks and end in a RuntimeError traceback."""

from __future__ import annotations

import pytest

from thinwire.cli import build_parser


@pytest.mark.parametrize("argv, message", [
    (["bench", "dlcp", "--steps", "0"], "argument --steps: must be an integer >= 1, got '0'"),
    (["bench", "dlcp", "--density", "2"], "argument --density: must be a number in (0, 1]"),
    (["bench", "dlcp", "--size", "-5"], "argument --size: must be an integer >= 1"),
    (["bench", "dlcp", "--epsilon", "0.5"], "argument --epsilon: must be a number in [0, 0.1]"),
    (["bench", "dlcp", "--nodes", "1"], "argument --nodes: must be an integer in [2, 250]"),
    (["bench", "sync", "--size", "0"], "argument --size: must be an integer >= 1"),
    (["bench", "sync", "--repeats", "0"], "argument --repeats: must be an integer >= 1"),
    (["bench", "sync", "--density", "nan"], "argument --density: must be a number in (0, 1], "
                                            "got nan"),
    (["bench", "sync", "--selector", "nope"], "argument --selector: must be one of auto, "),
    (["bench", "sync", "--wire", "fp8"], "argument --wire: must be one of none, fp16, bf16"),
    (["bench", "diloco", "--steps", "0"], "argument --steps: must be an integer >= 1"),
    (["bench", "diloco", "--outer-bits", "9"],
     "argument --outer-bits: must be an integer in [0, 8]"),
    (["bench", "diloco", "--sparse-outer-lr", "1e30"], "argument --sparse-outer-lr"),
    (["bench", "diloco", "--sync-every", "0"], "argument --sync-every: must be an integer >= 1"),
    (["bench", "wavelet", "--wave-turn", "sideways"],
     "argument --wave-turn: must be one of forward, backward, got 'sideways'"),
])
def test_a_bad_benchmark_value_ends_in_argparse(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args(argv)
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err


def test_bench_wavelet_hands_the_wave_turn_to_its_two_wave_runs(tmp_path, monkeypatch):
    """The waves mode's own setting reaches the runs that have two waves, not the others."""
    import thinwire.cluster
    from thinwire.bench import wavelet

    commands = []
    monkeypatch.setattr(thinwire.cluster, "run",
                        lambda spec, command, **kw: commands.append(command) or 1)
    args = build_parser().parse_args(["bench", "wavelet", "--wave-turn", "forward"])
    for waves in (1, 2):
        assert wavelet._launch(args, waves, 8, 2, None, tmp_path, f"w{waves}")["fits"] is False
    one, two = commands
    assert "--wave-turn" not in one and two[two.index("--wave-turn") + 1] == "forward"
