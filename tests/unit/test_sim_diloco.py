"""thinwire.sim.diloco: DiLoCo's predicted step against the formula computed by hand."""

import pytest

from thinwire.sim.collectives import AlgorithmConfig, Cluster, SparseRates
from thinwire.sim.compute import TimedLayer
from thinwire.sim.diloco import fragment_sizes, simulate_diloco
from thinwire.sim.iteration import simulate
from thinwire.sim.network import Link, Network

ALPHA, BW = 50e-6, 1e9  # inter-node: 50 us a message, 1 GB/s
NET = Network(intra=Link(alpha=1e-6, bandwidth=100e9), inter=Link(alpha=ALPHA, bandwidth=BW))
RATES = SparseRates(select_rate=1e9, scatter_rate=2e9)
# two layers, 3M parameters, 60 ms of compute a step
LAYERS = [TimedLayer("a", 1_000_000, 0.01, 0.02), TimedLayer("b", 2_000_000, 0.01, 0.02)]
P, COMPUTE = 3_000_000, 0.06
BUCKET = 1 << 30  # one bucket per fragment: one alpha term per ring step, easy to write down


def row(nodes=2, per_node=1, outer="allreduce", **schedule):
    return simulate_diloco(LAYERS, Cluster(nodes, per_node), NET, AlgorithmConfig(outer), RATES,
                           bucket_bytes=BUCKET, **schedule)


def ring_2(elements):
    """A dense ring all-reduce between 2 nodes of one rank: 2 steps, each node sends all the
    bytes once (2 (w-1)/w x 4 bytes per element, w = 2)."""
    return 2 * ALPHA + 4 * elements / BW


@pytest.mark.parametrize("sync_every", [1, 10, 100])
def test_exchange_every_h_steps_amortises(sync_every):
    r = row(sync_every=sync_every)
    assert r["inner_step_s"] == pytest.approx(COMPUTE)  # one rank per node: no DDP traffic
    assert r["iteration_s"] == pytest.approx(COMPUTE + ring_2(P) / sync_every)
    assert r["inter_node_mb_per_iter"] == pytest.approx(4 * P / sync_every / 1e6)
    assert r["scaling_efficiency"] == pytest.approx(COMPUTE / r["iteration_s"])


def test_fragments_without_overlap_pay_one_alpha_each():
    r = row(sync_every=12, fragments=3)
    assert r["iteration_s"] == pytest.approx(COMPUTE + 3 * ring_2(P / 3) / 12)
    assert r["inter_node_mb_per_iter"] == pytest.approx(4 * P / 12 / 1e6)  # same bytes


def test_overlap_hides_what_fits_behind_the_delay():
    # one fragment's exchange: 2 * 50 us + 4 MB / 1 GB/s = 4.1 ms, hidden behind one 60 ms step
    hidden = row(sync_every=12, fragments=3, overlap=True)
    assert hidden["iteration_s"] == pytest.approx(COMPUTE)
    # at 10 MB/s it takes 0.4001 s: 0.3401 s stays exposed per exchange, or 0.2801 s with 2
    slow = Network(intra=NET.intra, inter=Link(alpha=ALPHA, bandwidth=1e7))
    for delay in (1, 2):
        r = simulate_diloco(LAYERS, Cluster(2, 1), slow, AlgorithmConfig("allreduce"), RATES,
                            sync_every=12, fragments=3, overlap=True, delay=delay,
                            bucket_bytes=BUCKET)
        exchange = 2 * ALPHA + 4 * (P / 3) / 1e7
        assert r["exchange_s"] == pytest.approx([exchange] * 3)
        assert r["iteration_s"] == pytest.approx(COMPUTE + 3 * (exchange - delay * COMPUTE) / 12)


def test_h1_without_latency_is_per_step_ddp_without_overlap():
    """DiLoCo with H = 1, outer lr 1 is DDP on parameters: the same bytes and, with no
    per-message cost, the same time as a per-step all-reduce after the backward pass."""
    net = Network(intra=NET.intra, inter=Link(alpha=0.0, bandwidth=BW))
    d = simulate_diloco(LAYERS, Cluster(2, 1), net, AlgorithmConfig("allreduce"), RATES,
                        sync_every=1)
    ddp = simulate(LAYERS, Cluster(2, 1), net, AlgorithmConfig("allreduce"), RATES, overlap=False)
    assert d["iteration_s"] == pytest.approx(ddp["iteration_s"])
    assert d["inter_node_mb_per_iter"] == pytest.approx(ddp["inter_node_mb_per_iter"])


def test_ranks_in_a_node_add_their_all_reduce_to_the_inner_step():
    r = row(per_node=2, outer="hier_allreduce", sync_every=10)
    node = simulate(LAYERS, Cluster(1, 2), NET, AlgorithmConfig("allreduce"), RATES)
    assert r["inner_step_s"] == pytest.approx(node["iteration_s"]) and node["comm_s"] > 0
    assert r["intra_node_mb_per_iter"] > node["intra_node_mb_per_iter"]


def test_fragment_sizes_cover_the_model():
    assert fragment_sizes(10, 3) == [4, 3, 3]
    with pytest.raises(ValueError, match="fragments must be at most the parameter count"):
        fragment_sizes(2, 3)


@pytest.mark.parametrize("schedule,message", [
    (dict(sync_every=0), "sync_every must be an integer >= 1, got 0"),
    (dict(sync_every=4, fragments=5), "fragments must be at most sync_every (4)"),
    (dict(sync_every=4, fragments=4, overlap=True), "no room to overlap"),
    (dict(sync_every=4, delay=1), "delay must be 0 without overlap"),
])
def test_bad_schedules_are_named(schedule, message):
    with pytest.raises(ValueError) as info:
        row(**schedule)
    assert message in str(info.value)


def test_cli_simulate_adds_diloco_rows(tmp_path, capsys):
    import json

    from thinwire.cli import main as thinwire_main

    out = tmp_path / "sim.json"
    argv = ["simulate", "--nodes", "4", "--gpus-per-node", "8", "--model", "bert-base",
            "--algorithm", "hier_allreduce", "--diloco-sync-every", "50", "--outer-algorithm",
            "hier_allreduce", "--outer-algorithm", "hitopk", "--diloco-fragments", "2",
            "--diloco-overlap", "--scaling-nodes", "2,8", "--no-plot", "--json", str(out)]
    assert thinwire_main(argv) == 0
    result = json.loads(out.read_text())
    names = [r["algorithm"] for r in result["breakdown"]]
    assert names == ["hier_allreduce", "diloco-hier_allreduce-H50", "diloco-hitopk-H50"]
    per_step, dense, sparse = result["breakdown"]
    # every 50 steps instead of every step: 1/50 of the bytes; hitopk's outer step far fewer
    assert dense["inter_node_mb_per_iter"] == pytest.approx(
        per_step["inter_node_mb_per_iter"] / 50, rel=0.01)
    assert sparse["inter_node_mb_per_iter"] < dense["inter_node_mb_per_iter"] / 10
    assert dense["fragments"] == 2 and dense["overlap"] is True
    assert len(result["scaling"]) == 6
    assert "diloco-hitopk-H50" in capsys.readouterr().out


def test_sparseloco_sends_its_payload_between_nodes_and_gathers_inside():
    """SparseOuterState.reduce: each of the n ranks compresses 1/n of the pseudo-gradient,
    all-gathers its payload with the other node (one ring step; the node's n payloads share its
    link), then the node all-gathers the dense average. At density 1/64 in chunks of 4096 (64 kept a chunk), 2-bit values: a chunk
    costs 64 int16 indices + 16 bytes of codes + a float32 scale = 148 bytes."""
    from thinwire.local_sgd import chunked
    from thinwire.sim.diloco import SparseLoCoConfig

    outer = SparseLoCoConfig(density=1 / 64, chunk=4096, bits=2)
    r = simulate_diloco(LAYERS, Cluster(2, 2), NET, outer, RATES, sync_every=10,
                        bucket_bytes=BUCKET)
    shard = P // 2
    payload = chunked.payload_bytes(shard, 1 / 64, 4096, 2)
    assert payload == -(-shard // 4096) * 148
    assert r["inter_node_mb_per_iter"] == pytest.approx(2 * payload / 10 / 1e6)
    exchange = r["exchange_s"][0]
    inner = row(nodes=1, per_node=2, sync_every=10)["inner_step_s"]
    intra = NET.intra.time(1, 4 * shard)  # the dense average's all-gather: one block each
    select = RATES.select_alpha + shard / RATES.select_rate \
        + 64 * -(-shard // 4096) / RATES.scatter_rate
    assert exchange == pytest.approx(ALPHA + 2 * payload / BW + intra + select)
    assert r["iteration_s"] == pytest.approx(inner + exchange / 10)
    assert r["algorithm"] == "diloco-sparseloco-H10" and r["density"] == 1 / 64
    # against the dense outer step on the same cluster: about 4 / (148 / 4096) / 2 times fewer
    dense = simulate_diloco(LAYERS, Cluster(2, 2), NET, AlgorithmConfig("hier_allreduce"),
                            RATES, sync_every=10, bucket_bytes=BUCKET)
    assert dense["inter_node_mb_per_iter"] / r["inter_node_mb_per_iter"] > 50


@pytest.mark.parametrize("kwargs, message", [
    ({"chunk": 40_000}, "chunk"), ({"bits": 3}, "bits"), ({"density": 0.0}, "density")])
def test_sparseloco_settings_are_checked_as_the_trainer_checks_them(kwargs, message):
    from thinwire.sim.diloco import SparseLoCoConfig

    with pytest.raises(ValueError, match=message):
        SparseLoCoConfig(**kwargs)


def test_cli_simulate_takes_sparseloco_with_its_declared_settings(tmp_path):
    import json

    from thinwire.cli import main as thinwire_main

    out = tmp_path / "sim.json"
    base = ["simulate", "--nodes", "4", "--model", "bert-base", "--algorithm", "allreduce",
            "--diloco-sync-every", "20", "--scaling-nodes", "2", "--no-plot"]
    rows = {}
    for bits in ("2", "8"):
        assert thinwire_main(base + ["--outer-algorithm", "sparseloco", "--outer-bits", bits,
                                     "--outer-chunk", "1024", "--json", str(out)]) == 0
        rows[bits] = json.loads(out.read_text())["breakdown"][1]
    assert rows["2"]["algorithm"] == "diloco-sparseloco-H20"
    assert 0 < rows["2"]["inter_node_mb_per_iter"] < rows["8"]["inter_node_mb_per_iter"]


@pytest.mark.parametrize("argv, message", [
    (["--outer-bits", "4"], "--outer-bits applies to --outer-algorithm sparseloco"),
    (["--diloco-sync-every", "5", "--outer-chunk", "64"], "--outer-chunk applies to"),
    (["--outer-algorithm", "hitopk"], "--outer-algorithm applies to --diloco-sync-every H > 0"),
    (["--diloco-overlap"], "--diloco-overlap applies to --diloco-sync-every H > 0"),
    (["--diloco-sync-every", "5", "--outer-algorithm", "nope"],
     "--outer-algorithm must be one of allreduce"),
])
def test_cli_simulate_refuses_a_diloco_setting_it_would_ignore(argv, message, capsys):
    from thinwire.cli import main as thinwire_main

    assert thinwire_main(["simulate", "--no-plot", *argv]) != 0
    assert message in capsys.readouterr().err
