"""The emulated public-cloud cluster: network namespaces + tc, and a torchrun launcher on top.

    from thinwire.cluster import ClusterSpec, run
    spec = ClusterSpec(nodes=2, ranks_per_node=2, inter_node_bandwidth="1gbit")
    status = run(spec, ["-m", "thinwire.train", "--model", "mlp"], timeout_s=600)

`shaping=False` runs the same launch on loopback (no root needed). See docs/design.md,
section "Emulated cluster".
"""

from thinwire.cluster.launch import run
from thinwire.cluster.netns import ShapingUnavailable, cleanup_dead_runs, missing_requirements
from thinwire.cluster.spec import ClusterSpec, parse_latency, parse_loss, parse_rate

__all__ = ["ClusterSpec", "run", "ShapingUnavailable", "cleanup_dead_runs",
           "missing_requirements", "parse_rate", "parse_latency", "parse_loss"]
