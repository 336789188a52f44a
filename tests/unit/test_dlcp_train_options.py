"""dlcp's epsilon and high share from `thinwire train`, `compare` and `bench sync` (issue 20,
item 3): defaults, the range checks naming the option, and the way into the algorithm."""

from __future__ import annotations

import argparse

import pytest

from thinwire.bench import sync as bench_sync
from thinwire.cluster import ClusterSpec
from thinwire.collectives import dlcp
from thinwire.train.config import TrainConfig, add_arguments, from_args
from thinwire.train.grad_sync import sync_options


def _parse(argv):
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return from_args(parser.parse_args(argv))


def test_train_options_reach_dlcp_and_default_to_its_defaults():
    cfg = _parse(["--algorithm", "dlcp"])
    assert (cfg.dlcp_epsilon, cfg.dlcp_high_share) == (dlcp.DEFAULTS["epsilon"],
                                                       dlcp.DEFAULTS["high_share"])
    cfg = _parse(["--algorithm", "dlcp", "--dlcp-epsilon", "0.05", "--dlcp-high-share", "0.3"])
    assert sync_options(cfg) == {"epsilon": 0.05, "high_share": 0.3}
    assert sync_options(_parse(["--algorithm", "hitopk", "--dlcp-epsilon", "0.05"])) is None


@pytest.mark.parametrize("field, value, message", [
    ("dlcp_epsilon", 0.2, r"--dlcp-epsilon must be a number in \[0, 0.1\], got 0.2"),
    ("dlcp_epsilon", -0.01, r"--dlcp-epsilon must be a number in \[0, 0.1\], got -0.01"),
    ("dlcp_epsilon", float("nan"), r"--dlcp-epsilon must be a number in \[0, 0.1\], got nan"),
    ("dlcp_high_share", 1.5, r"--dlcp-high-share must be a number in \[0, 1\], got 1.5"),
])
def test_bad_values_name_the_option_value_and_range(field, value, message):
    with pytest.raises(ValueError, match=message):
        TrainConfig(algorithm="dlcp", **{field: value}).validate()


def test_compare_offers_the_options_and_bench_sync_checks_them_before_building():
    from thinwire.cli import build_parser

    parser = build_parser()
    args = parser.parse_args(["compare", "--out", "x", "--dlcp-epsilon", "0.04"])
    assert args.dlcp_epsilon == 0.04
    args = parser.parse_args(["bench", "sync", "--dlcp-high-share", "0.2"])
    assert args.dlcp_high_share == 0.2 and args.dlcp_epsilon == 0.02
    with pytest.raises(ValueError, match=r"--dlcp-epsilon must be a number in \[0, 0.1\]"):
        bench_sync.run(ClusterSpec(2, 1, shaping=False, inter_node_bandwidth=None),
                       algorithms=["dlcp"], dlcp_epsilon=0.5)


def test_the_training_loop_registers_dlcp_with_the_given_options(tmp_path):
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from thinwire.train.grad_sync import register_sync

    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0,
                            world_size=1)
    try:
        cfg = TrainConfig(algorithm="dlcp", dlcp_epsilon=0.07, dlcp_high_share=0.25)
        sync = register_sync(cfg.validate(), DDP(torch.nn.Linear(4, 2)), 1)
        assert sync.state.algorithm_options["epsilon"] == 0.07
        assert sync.state.algorithm_options["high_share"] == 0.25
    finally:
        dist.destroy_process_group()
