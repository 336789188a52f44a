"""Several links per node on the real emulated cluster (issue 20, item 2; root: namespaces, tc).

The topology: node i has eth0..eth{K-1}, link k = 10.77.k.(i+1) on its own switch bridge, each
shaped at the node's rate / K, at the requested MTU; everything goes away at teardown
(`cluster_leaks`). Spraying: a dlcp exchange between two nodes over K = 2 links moves its
datagrams over both (each link's packet counters from the node's /proc/net/dev), while gloo
stays on eth0.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
import textwrap
import time

import pytest

from thinwire.cluster import ClusterSpec, run
from thinwire.cluster.launch import new_run_id
from thinwire.cluster.netns import Network


def _ip(ns: str, *args: str) -> str:
    return subprocess.run(["ip", "-n", ns, *args], capture_output=True, text=True,
                          check=True).stdout


@pytest.mark.root
def test_k_links_per_node_are_built_shaped_and_removed(cluster_leaks):
    spec = ClusterSpec(nodes=2, ranks_per_node=1, inter_node_bandwidth="100mbit",
                       links_per_node=3, link_mtu=9000, link_classes=2)
    network = Network(spec, new_run_id())
    cluster_leaks.append(network.run_id)
    try:
        network.create()
        for node in range(2):
            ns = network.node_ns(node)
            for k in range(3):
                link = _ip(ns, "-o", "addr", "show", "dev", f"eth{k}")
                assert f"10.77.{k}.{node + 1}/24" in link
                assert "mtu 9000" in _ip(ns, "-o", "link", "show", f"eth{k}")
                port = "p%d" % node if k == 0 else f"p{node}l{k}"
                assert f"master br{k}" in _ip(network.switch_ns, "-o", "link", "show", port)
                classes = subprocess.run(["tc", "-n", ns, "class", "show", "dev", f"eth{k}"],
                                         capture_output=True, text=True).stdout
                # each link at the node's rate / 3 (tc prints 33333Kbit)
                assert "rate 33333Kbit" in classes or "rate 33.3Mbit" in classes, classes
        # link k reaches the peer's link k only (one bridge per link)
        receiver = subprocess.Popen(
            ["ip", "netns", "exec", network.node_ns(1), sys.executable, "-c",
             "import socket; s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); "
             "s.bind(('10.77.2.2', 45999)); s.settimeout(10); print(s.recvfrom(100)[1][0])"],
            stdout=subprocess.PIPE, text=True)
        try:
            for _ in range(20):  # until the receiver is bound
                subprocess.run(["ip", "netns", "exec", network.node_ns(0), sys.executable, "-c",
                                "import socket; socket.socket(socket.AF_INET, socket.SOCK_DGRAM)"
                                ".sendto(b'x', ('10.77.2.2', 45999))"], check=True)
                if receiver.poll() is not None:
                    break
                time.sleep(0.1)
            assert receiver.communicate(timeout=15)[0].strip() == "10.77.2.1"
        finally:
            receiver.kill()
            receiver.wait()
        route = _ip(network.node_ns(0), "route", "get", "10.77.2.2")
        assert "dev eth2" in route and "src 10.77.2.1" in route
        assert len(network.class_stats()) == 2 * 3 * 2 * 2  # nodes x links x directions x classes
    finally:
        network.teardown()


SPRAY_JOB = textwrap.dedent("""
    import json, os
    import torch, torch.distributed as dist
    from thinwire.transport import open_transport

    def packets():
        rows = open("/proc/net/dev").read().splitlines()[2:]
        return {r.split(":")[0].strip(): int(r.split(":")[1].split()[9]) for r in rows}

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    # epsilon 0 and a long deadline: without loss, every datagram is waited for
    with open_transport(timeout_s=60, epsilon=0.0, deadline_s=30.0) as transport:
        before = packets()
        g = torch.randn(200_000, generator=torch.Generator().manual_seed(rank))
        values, indices = g.abs().topk(20_000)
        for step in range(3):
            result = transport.exchange(step, 0, g[indices], indices)
        after = packets()
        seen = {"tx": {k: after[k] - before.get(k, 0) for k in after if k.startswith("eth")},
                "link_sent": transport.link_sent, "link_received": transport.link_received,
                "sent": transport.counters.sent,
                "peer_entries": int(result.parts[1 - rank][0].numel())}
    with open(os.path.join(os.environ["OUT_DIR"], f"rank{rank}.json"), "w") as f:
        json.dump(seen, f)
    dist.destroy_process_group()
""")


@pytest.mark.root
def test_dlcp_datagrams_are_sprayed_over_every_link(cluster_leaks, tmp_path):
    script = tmp_path / "spray_job.py"
    script.write_text(SPRAY_JOB)
    out = io.StringIO()
    spec = ClusterSpec(nodes=2, ranks_per_node=1, inter_node_bandwidth="200mbit",
                       links_per_node=2)
    status = run(spec, [str(script)], env={"OUT_DIR": tmp_path}, timeout_s=180, output=out)
    assert status == 0, out.getvalue()
    for rank in range(2):
        seen = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert seen["peer_entries"] == 20_000  # no loss configured: everything applied
        data = seen["sent"]  # 3 steps x 113 datagrams of 178 8-byte entries, to the one peer
        assert data == 3 * 113
        # the link counters of the node's own interfaces: each link carried half the DATA
        assert seen["tx"]["eth1"] >= 0.45 * data and seen["tx"]["eth0"] >= 0.45 * data, seen
        assert min(seen["link_received"]) >= 0.45 * data, seen
