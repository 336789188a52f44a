"""The algorithm registry: one declaration makes an algorithm reachable everywhere."""

from __future__ import annotations

import argparse
import json

import procs
import pytest

from thinwire import collectives
from thinwire.collectives import costs
from thinwire.collectives.primitives import dense_allreduce
from thinwire.collectives.registry import Algorithm, register, unregister
from thinwire.sim.collectives import AlgorithmConfig, Cluster, SparseRates, bucket_cost
from thinwire.sim.network import network
from thinwire.state import SyncState
from thinwire.train import checkpoint, config, grad_sync


def _reduce(state, bucket_index, flat):
    return dense_allreduce(state, flat)


def _cost(cfg, cluster, net, elements, rates):
    return costs.BucketCost(comm_s=1.5, inter_bytes=float(elements))


@pytest.fixture
def dummy():
    algorithm = register(Algorithm("dummy_sparse", _reduce, _cost, sparse=True, summary="test"))
    yield algorithm
    unregister("dummy_sparse")


def test_the_builtin_algorithms_declare_themselves():
    assert collectives.names()[:2] == ("allreduce", "hier_allreduce")
    assert {"hitopk", "topk_allgather"} <= set(collectives.sparse_names())
    assert not set(collectives.sparse_names()) & {"allreduce", "hier_allreduce"}
    for name in collectives.names():
        assert collectives.get(name).summary


def test_a_registered_algorithm_is_reachable_without_other_edits(dummy):
    # thinwire train --algorithm, its help, and the sparse-only options
    parser = argparse.ArgumentParser()
    config.add_arguments(parser)
    assert "dummy_sparse" in parser.format_help()
    args = parser.parse_args(["--algorithm", "dummy_sparse", "--density", "0.2",
                              "--dense-warmup-steps", "3"])
    cfg = config.from_args(args)
    assert grad_sync.is_sparse("dummy_sparse") and "dummy_sparse" in grad_sync.algorithm_names()
    # the checkpoint identity keeps what matters to a sparse algorithm
    ident = checkpoint.identity(cfg)
    assert ident["algorithm"] == "dummy_sparse" and ident["density"] == 0.2
    assert ident["dense_warmup_steps"] == 3
    # the simulator
    cost = bucket_cost(AlgorithmConfig("dummy_sparse", dense_below_bytes=0), Cluster(2, 2),
                       network("cloud-25g"), 1000, SparseRates(1e9, 1e9))
    assert cost.comm_s == 1.5 and cost.inter_bytes == 1000.0
    # ... and, like every sparse algorithm, all-reduces a small bucket densely (no code of its own)
    small = bucket_cost(AlgorithmConfig("dummy_sparse"), Cluster(2, 2), network("cloud-25g"),
                        1000, SparseRates(1e9, 1e9))
    dense = bucket_cost(AlgorithmConfig("allreduce"), Cluster(2, 2), network("cloud-25g"), 1000,
                        SparseRates(1e9, 1e9))
    assert small == dense
    # SyncState takes the sparse settings
    assert SyncState(None, "dummy_sparse", momentum_correction=0.9).feedback.enabled
    # compare and bench sync offer it by default
    from thinwire.train import compare
    assert "dummy_sparse" in compare.default_algorithms()
    assert "dummy_sparse" in collectives.names()


def test_a_registered_algorithm_trains_through_thinwire_train(tmp_path):
    """End to end in a fresh interpreter: register, then the real `thinwire train` command."""
    summary = tmp_path / "summary.json"
    program = (
        "from thinwire.collectives import costs, registry\n"
        "from thinwire.collectives.primitives import dense_allreduce\n"
        "registry.register(registry.Algorithm('plugin_avg', lambda s, i, f: "
        "dense_allreduce(s, f), lambda *a: costs.BucketCost(), sparse=False))\n"
        "from thinwire.cli import main\n"
        f"raise SystemExit(main(['train', '--algorithm', 'plugin_avg', '--model', 'mlp', "
        f"'--max-iters', '3', '--batch-size', '16', '--compute-probe-iters', '0', "
        f"'--no-progress', '--summary', {str(summary)!r}]))\n")
    done = procs.run_python(["-c", program], timeout_s=300)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(summary.read_text())
    assert result["algorithm"] == "plugin_avg" and result["steps"] == 3


def test_registry_refuses_bad_declarations(dummy):
    with pytest.raises(ValueError, match="'dummy_sparse' is already registered"):
        register(Algorithm("dummy_sparse", _reduce, _cost))
    with pytest.raises(ValueError, match="must be a Python identifier"):
        Algorithm("top-k", _reduce, _cost)
    with pytest.raises(TypeError, match="cost must be callable"):
        Algorithm("fine_name", _reduce, None)
    with pytest.raises(ValueError, match=r"algorithm must be one of allreduce, .*got 'nope'"):
        collectives.get("nope")
