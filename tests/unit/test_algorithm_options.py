"""Every algorithm declares its own settings once (thinwire.options.Option); `thinwire train`,
`compare`, `bench sync`, `simulate` and the checkpoint identity read that declaration, and a
setting given where it would be ignored is refused by name (issue 30, item 2)."""

from __future__ import annotations

import argparse

import pytest

from thinwire import collectives
from thinwire.cli import build_parser
from thinwire.options import Option, check_options
from thinwire.train.config import TrainConfig, from_args

# (algorithm, option, command-line text, the value it means): one per declared option
DECLARED = [(a.name, o) for a in map(collectives.get, collectives.names()) for o in a.options]


def _sample(option: Option) -> tuple[str, object]:
    """A legal non-default value of ``option`` and its command-line text."""
    if option.type is bool:
        return str(not option.default).lower(), not option.default
    if option.choices:
        value = next(c for c in option.choices if c != option.default)
        return value, value
    if option.type is int:
        value = int(option.high) if option.high is not None else int(option.low or 0) + 3
        return str(value), value
    value = option.high if option.high is not None else (option.low or 0.0) + 1.5
    return repr(float(value)), float(value)


def test_every_algorithm_declares_well_formed_options():
    assert {name for name, _ in DECLARED} >= {"oktopk", "dlcp"}
    for name, option in DECLARED:
        assert option.help and option.check(option.default, name) == option.default


def test_an_option_checks_type_range_and_choices_and_parses_command_line_text():
    tau = Option("tau", int, 32, low=1, help="h")
    assert tau.parse("16", "x") == 16 and tau.check(7, "x") == 7
    for bad in (0, 1.5, True, "3", None, float("nan")):
        with pytest.raises(ValueError, match=r"x option 'tau' must be an integer >= 1, got"):
            tau.check(bad, "x")
    share = Option("share", float, 0.1, low=0.0, high=1.0, low_open=True, optional=True, help="h")
    assert share.check(1, "x") == 1.0 and isinstance(share.check(1, "x"), float)
    assert share.parse("none", "x") is None and share.parse("0.5", "x") == 0.5
    for bad in ("0", "1.5", "inf", "nan", "half"):
        with pytest.raises(ValueError, match=r"'share' must be a number in \(0, 1\] or none"):
            share.parse(bad, "x")
    flag = Option("flag", bool, False, help="h")
    assert flag.parse("TRUE", "x") is True
    with pytest.raises(ValueError, match="must be true or false, got 'yes'"):
        flag.parse("yes", "x")
    with pytest.raises(ValueError, match="must be true or false, got 1"):
        flag.check(1, "x")
    mode = Option("mode", str, "a", choices=("a", "b"), help="h")
    with pytest.raises(ValueError, match="must be one of a, b, got 'c'"):
        mode.parse("c", "x")
    with pytest.raises(ValueError, match="the default of option 'bad' must be an integer >= 1"):
        Option("bad", int, 0, low=1, help="a declaration that contradicts itself")
    assert check_options("x", (tau, flag), {"tau": 4}) == {"tau": 4, "flag": False}
    with pytest.raises(ValueError, match=r"x takes no option 'tua'; its options: tau, flag"):
        check_options("x", (tau, flag), {"tua": 4})


@pytest.mark.parametrize("algorithm, option", DECLARED, ids=lambda v: getattr(v, "name", v))
def test_every_declared_option_reaches_train_compare_bench_and_simulate(algorithm, option):
    text, value = _sample(option)
    flag = ["--algorithm-option", f"{algorithm}:{option.name}={text}"]
    parser = build_parser()

    cfg = from_args(parser.parse_args(["train", "--algorithm", algorithm, *flag]))
    assert cfg.algorithm_options[algorithm][option.name] == value
    assert set(cfg.algorithm_options[algorithm]) == {o.name for o in
                                                      collectives.get(algorithm).options}

    from thinwire.train import compare
    args = parser.parse_args(["compare", "--out", "x", "--algorithms", f"ddp,{algorithm}",
                              *flag])
    from thinwire.train.config import algorithm_options
    settings = compare.CompareSettings(algorithms=["ddp", algorithm], shaping=False,
                                       train={"algorithm_options": algorithm_options(args)})
    settings.validate()
    assert settings.run_config(algorithm).algorithm_options == {algorithm: {option.name: value}}
    assert settings.run_config("ddp").algorithm_options == {}  # the other runs do not get it

    for bench in ("sync", "ddp-hook"):
        args = parser.parse_args(["bench", bench, "--algorithms", algorithm, *flag])
        assert args.algorithm_option == [(algorithm, option.name, value)]

    args = parser.parse_args(["simulate", "--algorithm", algorithm, *flag])
    assert args.algorithm_option == [(algorithm, option.name, value)]


def test_simulate_uses_the_option_in_its_cost_model(tmp_path, capsys):
    import json

    parser = build_parser()
    results = []
    for tau in ("1", "64"):
        out = tmp_path / f"tau{tau}.json"
        args = parser.parse_args(["simulate", "--algorithm", "oktopk", "--json", str(out),
                                  "--plot", str(tmp_path / f"tau{tau}.png"),
                                  "--algorithm-option", f"oktopk:tau={tau}"])
        assert args.func(args) == 0
        results.append(json.loads(out.read_text()))
    assert results[0]["setting"]["algorithm_options"] == {"oktopk": {"tau": 1,
                                                                     "rebalance_every": 64}}
    # tau changes how often the threshold is re-estimated, so the predicted step time
    assert results[0]["breakdown"] != results[1]["breakdown"]


@pytest.mark.parametrize("argv, message", [
    (["--algorithm", "hitopk", "--algorithm-option", "oktopk:tau=4"],
     r"oktopk:tau: this run \(--algorithm hitopk\) uses hitopk, so oktopk's options would be "
     r"ignored"),
    (["--algorithm", "ddp", "--algorithm-option", "dlcp:epsilon=0.05"],
     r"uses none of thinwire's algorithms"),
    (["--algorithm", "diloco", "--sync-every", "4", "--outer-algorithm", "allreduce",
      "--algorithm-option", "oktopk:tau=4"], r"uses allreduce, so oktopk's options"),
])
def test_train_refuses_an_option_its_run_would_ignore(argv, message):
    parser = build_parser()
    with pytest.raises(ValueError, match=message):
        from_args(parser.parse_args(["train", *argv]))


@pytest.mark.parametrize("text, message", [
    ("oktopk:tau=0", "algorithm 'oktopk' option 'tau' must be an integer >= 1, got 0"),
    ("hitopk:tau=3", "algorithm 'hitopk' takes no option 'tau'"),
    ("dlcp:epsilon=0.5", r"'epsilon' must be a number in \[0, 0.1\], got 0.5"),
    ("nope:tau=3", "ALGORITHM must be one of"),
])
@pytest.mark.parametrize("command", [["train"], ["compare", "--out", "x"], ["bench", "sync"],
                                     ["bench", "ddp-hook"], ["simulate"]])
def test_every_command_refuses_a_bad_option_before_anything_runs(command, text, message, capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args([*command, "--algorithm-option", text])
    assert message.replace("\\", "").split(" must")[0].split("[")[0] \
        in capsys.readouterr().err.replace("\\", "")


def test_compare_and_bench_refuse_options_for_algorithms_they_do_not_run():
    from thinwire.bench import sync as bench_sync
    from thinwire.cluster import ClusterSpec
    from thinwire.train import compare

    with pytest.raises(ValueError, match=r"no run of this race uses oktopk"):
        compare.CompareSettings(algorithms=["ddp", "hitopk"], shaping=False,
                                train={"algorithm_options": {"oktopk": {"tau": 4}}}).validate()
    with pytest.raises(ValueError, match=r"'oktopk', which is not one of the algorithms timed"):
        bench_sync.run(ClusterSpec(2, 1, shaping=False, inter_node_bandwidth=None),
                       algorithms=["hitopk"], algorithm_options={"oktopk": {"tau": 4}})
    with pytest.raises(ValueError, match=r"option 'tau' must be an integer >= 1"):
        bench_sync.run(ClusterSpec(2, 1, shaping=False, inter_node_bandwidth=None),
                       algorithms=["oktopk"], algorithm_options={"oktopk": {"tau": 0}})


def test_a_config_file_and_the_command_line_combine(tmp_path):
    import json

    from thinwire.train.config import add_arguments, add_config_file

    config = tmp_path / "c.json"
    config.write_text(json.dumps({"algorithm": "oktopk",
                                  "algorithm_options": {"oktopk": {"tau": 8,
                                                                   "rebalance_every": 2}}}))
    argv = ["--config", str(config), "--algorithm-option", "oktopk:tau=16"]
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    add_config_file(parser, argv)
    cfg = from_args(parser.parse_args(argv))
    assert cfg.algorithm_options == {"oktopk": {"tau": 16, "rebalance_every": 2}}
    with pytest.raises(ValueError, match="algorithm_options must be a dict of algorithm"):
        TrainConfig(algorithm="oktopk", algorithm_options={"oktopk": 3}).validate()


def test_the_run_and_its_checkpoint_identity_carry_the_options(tmp_path):
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from thinwire.train.grad_sync import register_sync

    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0,
                            world_size=1)
    try:
        cfg = TrainConfig(algorithm="oktopk",
                          algorithm_options={"oktopk": {"tau": 3}}).validate()
        sync = register_sync(cfg, DDP(torch.nn.Linear(4, 2)), 1)
        assert sync.state.settings["algorithm_options"] == {"tau": 3, "rebalance_every": 64}
    finally:
        dist.destroy_process_group()


def test_diloco_passes_the_outer_algorithms_options_to_its_sync_state(tmp_path):
    import torch
    import torch.distributed as dist

    from thinwire.local_sgd.train_adapter import DiLoCoSync
    from thinwire.topology import Topology

    cfg = TrainConfig(algorithm="diloco", sync_every=4, outer_algorithm="oktopk",
                      algorithm_options={"oktopk": {"tau": 5}}).validate()
    assert cfg.algorithm_options == {"oktopk": {"tau": 5, "rebalance_every": 64}}
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0,
                            world_size=1)
    try:
        module = torch.nn.Linear(4, 2)
        sync = DiLoCoSync(cfg, module, Topology.build(1))
        sync.attach(torch.optim.SGD(sync.model.parameters(), lr=0.1))
        assert sync.diloco.state.algorithm_options == {"tau": 5, "rebalance_every": 64}
    finally:
        dist.destroy_process_group()
