"""Argument parsing and validation of the emulated cluster (no root, no processes started)."""

from __future__ import annotations

import pytest

import thinwire.cli
from thinwire.cluster import ClusterSpec, ShapingUnavailable, parse_latency, parse_loss, parse_rate
from thinwire.cluster import netns
from thinwire.cluster.launch import node_env, torchrun_argv, validate_command
from thinwire.cluster.spec import format_rate


@pytest.mark.parametrize("text, bps", [
    ("100mbit", 100_000_000), ("1gbit", 10**9), ("1Gbit", 10**9), ("2.5gbit", 2_500_000_000),
    ("500kbit", 500_000), (" 10gbit ", 10 * 10**9), ("100000bit", 100_000)])
def test_parse_rate(text, bps):
    assert parse_rate(text) == bps


@pytest.mark.parametrize("text, message", [
    ("fast", "must be a number followed by a unit"),
    ("1gbyte", "unknown unit 'gbyte'"),
    ("100mbps", "unknown unit 'mbps'"),  # tc's bps means bytes/s: refused, not misread
    ("100", "missing unit"),
    ("-1gbit", "must be a number followed by a unit"),
    ("0gbit", "must be between"),
    ("1tbit", "must be between")])
def test_parse_rate_errors_name_parameter_value_and_allowed(text, message):
    with pytest.raises(ValueError, match=message) as info:
        parse_rate(text, "inter_node_bandwidth")
    text_of_error = str(info.value)
    assert "inter_node_bandwidth" in text_of_error and repr(text) in text_of_error
    if "unit" in message:
        assert "mbit" in text_of_error and "gbit" in text_of_error


@pytest.mark.parametrize("text, seconds", [("0.5ms", 0.0005), ("500us", 0.0005), ("1s", 1.0),
                                           ("0ms", 0.0), ("20ms", 0.02)])
def test_parse_latency(text, seconds):
    assert parse_latency(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["slow", "5", "5min", "11s", ""])
def test_parse_latency_errors(text):
    with pytest.raises(ValueError, match="inter_node_latency"):
        parse_latency(text, "inter_node_latency")


@pytest.mark.parametrize("value, percent", [("1%", 1.0), ("0.1", 0.1), (2, 2.0), (0.5, 0.5)])
def test_parse_loss(value, percent):
    assert parse_loss(value) == percent


@pytest.mark.parametrize("value", ["100", "-1", "lots", 150, True, float("nan")])
def test_parse_loss_errors(value):
    with pytest.raises(ValueError, match=r"loss must be a percentage.*\[0, 100\)"):
        parse_loss(value)


@pytest.mark.parametrize("kwargs, message", [
    ({"nodes": 0, "ranks_per_node": 1}, "nodes must be an integer between 1 and 250, got 0"),
    ({"nodes": 2, "ranks_per_node": 0}, "ranks_per_node must be an integer between 1"),
    ({"nodes": 2.0, "ranks_per_node": 1}, "nodes must be an integer"),
    ({"nodes": True, "ranks_per_node": 1}, "nodes must be an integer"),
    ({"nodes": 2, "ranks_per_node": 1, "inter_node_bandwidth": "fast"}, "inter_node_bandwidth"),
    ({"nodes": 2, "ranks_per_node": 1, "intra_node_bandwidth": "9xbit"}, "intra_node_bandwidth"),
    ({"nodes": 2, "ranks_per_node": 1, "inter_node_latency": "soon"}, "inter_node_latency"),
    ({"nodes": 2, "ranks_per_node": 1, "shaping": "yes"}, "shaping must be True or False")])
def test_cluster_spec_rejects_bad_values(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ClusterSpec(**kwargs)


def test_cluster_spec_parsed_values():
    spec = ClusterSpec(4, 8, "10gbit", "1ms", "100gbit", "0.1%")
    assert (spec.world_size, spec.inter_node_bps, spec.intra_node_bps) == (32, 10**10, 10**11)
    assert spec.inter_node_latency_s == pytest.approx(1e-3) and spec.loss_percent == 0.1
    assert spec.describe() == ("4 nodes x 8 ranks, inter-node 10gbit, latency 1ms, "
                               "intra-node 100gbit, loss 0.1%")
    assert format_rate(1.5e9) == "1.5gbit"


def test_validate_command(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("")
    validate_command([str(script), "--lr", "0.1"])
    validate_command(["-m", "thinwire.cluster.probe", "allreduce"])
    with pytest.raises(ValueError, match="command is empty"):
        validate_command([])
    with pytest.raises(FileNotFoundError, match="script 'missing.py' not found"):
        validate_command(["missing.py"])
    with pytest.raises(ValueError, match="module 'no_such_module_xyz' not found"):
        validate_command(["-m", "no_such_module_xyz"])
    with pytest.raises(ValueError, match="-m needs a module name"):
        validate_command(["-m"])
    with pytest.raises(ValueError, match="option '--nproc'"):
        validate_command(["--nproc", "2"])


def test_torchrun_argv_and_env_per_node():
    spec = ClusterSpec(3, 4)
    argv = torchrun_argv(spec, 2, "10.77.0.1", 29500, "/tmp/logs", ["-m", "pkg.mod", "--x"])
    joined = " ".join(argv)
    assert "-m torch.distributed.run --nnodes 3 --node-rank 2 --master-addr 10.77.0.1 " \
        "--master-port 29500 --nproc-per-node 4 --max-restarts 0" in joined
    assert argv[-3:] == ["-m", "pkg.mod", "--x"]
    # checkpoint-restart: an elastic rendezvous on the coordinator's store gives the ranks
    elastic = " ".join(torchrun_argv(ClusterSpec(3, 4, max_restarts=5), 2, "10.77.0.1", 29500,
                                     "/tmp/logs", ["-m", "pkg.mod"], rendezvous="10.77.0.254:1",
                                     local_addr="10.77.0.3"))
    assert "--rdzv-backend c10d --rdzv-endpoint 10.77.0.254:1" in elastic
    assert "--local-addr 10.77.0.3" in elastic and "--max-restarts 5" in elastic
    assert "--node-rank" not in elastic and "--master-addr" not in elastic
    assert node_env(ClusterSpec(3, 4, max_restarts=5), 2, "eth0", None)[
        "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "1"
    env = node_env(spec, 2, "eth0", {"EXTRA": 5})
    assert env["GLOO_SOCKET_IFNAME"] == "eth0" and env["THINWIRE_RANKS_PER_NODE"] == "4"
    assert env["EXTRA"] == "5" and env["TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"].startswith("[node2")


def test_ranks_keep_the_memory_they_freed_unless_the_user_set_the_allocator(monkeypatch):
    spec = ClusterSpec(2, 2)
    env = node_env(spec, 0, "eth0", None)
    assert env["MALLOC_TRIM_THRESHOLD_"] == str(1 << 30)   # the heap's free top is kept
    assert env["MALLOC_MMAP_THRESHOLD_"] == str(32 << 20)  # not moved by the run's history
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "131072")
    assert node_env(spec, 0, "eth0", None)["MALLOC_TRIM_THRESHOLD_"] == "131072"


def test_tc_commands_shape_rate_delay_and_loss():
    assert netns.tc_commands("eth0", None) == []
    cmds = [" ".join(c) for c in netns.tc_commands("eth0", 10**9, 0.00025, 0.01)]
    assert any("htb rate 1000000000bit ceil 1000000000bit" in c for c in cmds)
    assert any("netem delay 250us" in c for c in cmds)
    assert any("parent 1:20 handle 20: pfifo limit 0" in c for c in cmds)
    bytecode = next(c for c in cmds if "bytecode" in c).split("bytecode ")[1].split(" classid")[0]
    threshold = int(bytecode.split(",")[2].split()[3])
    assert threshold == int(0.01 * 2**32)
    no_delay = " ".join(" ".join(c) for c in netns.tc_commands("lo", 10**8))
    assert "netem" not in no_delay and "pfifo limit 10000" in no_delay and "bpf" not in no_delay


def test_loss_is_split_over_two_hops():
    q = netns.hop_drop_fraction(19.0)
    assert 1 - (1 - q) ** 2 == pytest.approx(0.19)
    assert netns.hop_drop_fraction(None) is None


def test_missing_root_and_tools_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(netns.os, "geteuid", lambda: 1000)
    monkeypatch.setattr(netns.shutil, "which", lambda tool: None if tool == "tc" else "/sbin/ip")
    with pytest.raises(ShapingUnavailable) as info:
        netns.require_shaping_tools()
    message = str(info.value)
    assert "root (running as uid 1000)" in message and "`tc`" in message
    assert "`ip`" not in message and "--no-shaping" in message


def _cli(monkeypatch, argv):
    monkeypatch.setattr(thinwire.cli, "COMMAND_MODULES", ["thinwire.cluster.cli"])
    return thinwire.cli.main(argv)


@pytest.mark.parametrize("argv, expected", [
    (["--nodes", "0", "--", "x.py"], "nodes must be an integer between 1 and 250, got 0"),
    (["--inter-node-bandwidth", "fast", "--", "x.py"], "--inter-node-bandwidth must be a number"),
    (["--inter-node-bandwidth", "3furlongs", "--", "x.py"], "unknown unit 'furlongs'"),
    ([], "missing SCRIPT"),
    (["--", "missing_script.py"], "script 'missing_script.py' not found"),
    (["--timeout", "-1", "--", "x.py"], "--timeout must be >= 0")])
def test_cli_bad_arguments_one_line_exit_2(monkeypatch, capsys, argv, expected):
    assert _cli(monkeypatch, ["cluster", "run", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith("thinwire: error:") and expected in err


def test_cli_without_root_says_what_is_missing(monkeypatch, capsys, tmp_path):
    script = tmp_path / "job.py"
    script.write_text("")
    monkeypatch.setattr(netns.os, "geteuid", lambda: 1000)
    assert _cli(monkeypatch, ["cluster", "run", "--", str(script)]) == 2
    err = capsys.readouterr().err
    assert "root (running as uid 1000)" in err and "--no-shaping" in err
