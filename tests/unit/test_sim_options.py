"""The simulator takes every algorithm's own settings and the sparse wire dtype (it used to
cost oktopk at its default tau whatever it was told, and every sparse value as fp32)."""

import argparse

import pytest

from thinwire.cliargs import algorithm_option, options_by_algorithm
from thinwire.sim.collectives import AlgorithmConfig, Cluster, SparseRates, bucket_cost
from thinwire.sim.network import network

NET, RATES = network("cloud-25g"), SparseRates(1e9, 1e9)


def _cost(cfg, elements=4_000_000):
    return bucket_cost(cfg, Cluster(4, 2), NET, elements, RATES)


def test_oktopks_tau_reaches_its_cost_model():
    often = _cost(AlgorithmConfig("oktopk", options={"tau": 1}))
    default = _cost(AlgorithmConfig("oktopk"))
    assert AlgorithmConfig("oktopk").options == {"tau": 32, "rebalance_every": 64}
    assert often.inter_bytes > default.inter_bytes  # a whole all-gather every step, not 1 in 32


def test_the_sparse_wire_dtype_reaches_the_cost_model():
    fp32 = _cost(AlgorithmConfig("hitopk"))
    fp16 = _cost(AlgorithmConfig("hitopk", sparse_wire="fp16"))
    assert fp16.inter_bytes < fp32.inter_bytes


@pytest.mark.parametrize("kwargs,message", [
    (dict(name="oktopk", options={"tau": 0}), r"algorithm 'oktopk' option 'tau' must be an "
                                             r"integer >= 1, got 0"),
    (dict(name="oktopk", options={"taus": 3}), r"algorithm 'oktopk' takes no option 'taus'; "
                                               r"its options: tau, rebalance_every"),
    (dict(name="hitopk", options={"tau": 3}), "algorithm 'hitopk' takes no option 'tau'"),
    (dict(name="hitopk", sparse_wire="fp8"), "sparse_wire must be one of fp32, fp16, bf16"),
    (dict(name="oktopk", sparse_wire="fp16"), "sparse_wire 'fp16' applies to .*not 'oktopk'"),
])
def test_a_setting_an_algorithm_does_not_take_is_refused_by_name(kwargs, message):
    with pytest.raises(ValueError, match=message):
        AlgorithmConfig(**kwargs)


def test_the_command_line_form_of_an_algorithms_setting():
    assert algorithm_option("oktopk:tau=16") == ("oktopk", "tau", 16)
    assert algorithm_option("dlcp:epsilon=0.05") == ("dlcp", "epsilon", 0.05)
    assert algorithm_option("dlcp:classes=none") == ("dlcp", "classes", None)
    for bad in ("tau=16", "oktopk:=3", "oktopk:tau", "oktopk:tau=nan", "oktopk:tau=1.5",
                "oktopk:tau=none", "hitopk:tau=3", "nope:tau=3", "dlcp:pacing=fast"):
        with pytest.raises(argparse.ArgumentTypeError):
            algorithm_option(bad)
    items = [("oktopk", "tau", 8), ("oktopk", "rebalance_every", 4)]
    assert options_by_algorithm(items, ["oktopk"]) == {"oktopk": {"tau": 8,
                                                                  "rebalance_every": 4}}
    with pytest.raises(ValueError, match="'oktopk' is not one of the algorithms run"):
        options_by_algorithm(items, ["hitopk"])
    with pytest.raises(ValueError, match="oktopk:tau is given twice"):
        options_by_algorithm(items[:1] * 2, ["oktopk"])
