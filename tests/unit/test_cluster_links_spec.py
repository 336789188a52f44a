"""--links-per-node and --link-mtu of the emulated cluster: checked before anything is built,
exported to the ranks (the transport reads them), each link at the node's rate / K."""

from __future__ import annotations

import argparse

import pytest

from thinwire.cluster import ClusterSpec
from thinwire.cluster.cli import add_resource_options, resource_kwargs
from thinwire.cluster.launch import node_env
from thinwire.cluster.netns import Network, rail_address


@pytest.mark.parametrize("kwargs, message", [
    ({"links_per_node": 0}, r"links_per_node must be an integer between 1 and 8, got 0"),
    ({"links_per_node": 9}, r"links_per_node must be an integer between 1 and 8, got 9"),
    ({"links_per_node": 2, "shaping": False, "inter_node_bandwidth": None},
     r"links_per_node=2 needs the shaped cluster"),
    ({"links_per_node": 8, "inter_node_bandwidth": "500kbit"},
     r"links_per_node=8 splits inter_node_bandwidth='500kbit' into links below 100kbit"),
    ({"link_mtu": 1000}, r"link_mtu must be an integer between 1280 and 9000 bytes, got 1000"),
    ({"link_mtu": 9001}, r"link_mtu must be an integer between 1280 and 9000 bytes, got 9001"),
    ({"link_mtu": 9000, "shaping": False, "inter_node_bandwidth": None},
     r"link_mtu=9000 needs the shaped cluster"),
])
def test_bad_link_settings_name_the_parameter_value_and_range(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ClusterSpec(nodes=2, ranks_per_node=1, **kwargs)


def test_links_split_the_node_rate_and_reach_the_ranks():
    spec = ClusterSpec(nodes=3, ranks_per_node=1, inter_node_bandwidth="100mbit",
                       links_per_node=4, link_mtu=9000)
    assert spec.link_bps == 25_000_000
    assert "4 links per node of 25mbit" in spec.describe() and "MTU 9000" in spec.describe()
    env = node_env(spec, 0, "eth0", None)
    assert env["THINWIRE_LINKS_PER_NODE"] == "4" and env["THINWIRE_LINK_MTU"] == "9000"
    assert env["GLOO_SOCKET_IFNAME"] == "eth0"  # gloo stays on link 0
    assert env["THINWIRE_INTER_NODE_BPS"] == "100000000"  # dlcp paces at the node's rate
    plain = node_env(ClusterSpec(nodes=2, ranks_per_node=1), 0, "eth0", None)
    assert "THINWIRE_LINKS_PER_NODE" not in plain and "THINWIRE_LINK_MTU" not in plain
    net = Network(spec, "x")
    assert net.links(2, 3) == [("p2", "eth0", "br0"), ("p2l1", "eth1", "br1"),
                               ("p2l2", "eth2", "br2")]
    assert net.link_addr(2, 3) == "10.77.3.3" and rail_address("10.77.0.9", 0) == "10.77.0.9"


def test_the_options_default_to_one_standard_link_and_are_left_out_when_default():
    parser = argparse.ArgumentParser()
    add_resource_options(parser)
    assert "links_per_node" not in resource_kwargs(parser.parse_args([]))
    assert "link_mtu" not in resource_kwargs(parser.parse_args([]))
    given = resource_kwargs(parser.parse_args(["--links-per-node", "2", "--link-mtu", "9000"]))
    assert given["links_per_node"] == 2 and given["link_mtu"] == 9000
