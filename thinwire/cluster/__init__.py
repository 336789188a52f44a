"""The emulated public-cloud cluster: network namespaces + tc, and a torchrun launcher on top.

    from thinwire.cluster import ClusterSpec, run
    spec = ClusterSpec(nodes=2, ranks_per_node=2, inter_node_bandwidth="1gbit",
                       node_cpus=0.5, node_memory="2g", link_classes=2)
    status = run(spec, ["-m", "thinwire.train", "--model", "mlp"], timeout_s=600,
                 stats_path="stats.json")

`shaping=False` runs the same launch on loopback (no root needed). Node CPU/memory budgets are
per-node cgroups; a node killed for memory raises `NodeOutOfMemory`. A rank puts its traffic in
a priority class with `IP_TOS = tos_for_class(k, classes)`. See docs/design.md, sections
"Emulated cluster" and "Node budgets and priority classes".
"""

from thinwire.cluster.accounting import NodeOutOfMemory
from thinwire.cluster.cgroups import CgroupsUnavailable
from thinwire.cluster.launch import run
from thinwire.cluster.netns import ShapingUnavailable, cleanup_dead_runs, missing_requirements
from thinwire.cluster.qos import tos_for_class
from thinwire.cluster.spec import ClusterSpec, parse_latency, parse_loss, parse_rate

__all__ = ["ClusterSpec", "run", "ShapingUnavailable", "CgroupsUnavailable", "NodeOutOfMemory",
           "tos_for_class", "cleanup_dead_runs", "missing_requirements", "parse_rate",
           "parse_latency", "parse_loss"]
