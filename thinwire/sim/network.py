"""Alpha-beta links and the network presets of the simulator.

A message of ``b`` bytes over a link costs ``alpha + b / bandwidth`` (alpha: per-message latency
in seconds; bandwidth: bytes per second actually achieved, i.e. goodput, not the wire rate).
A cluster has two link classes, as thinwire's ``Topology`` does:

* ``intra``: between the ranks of one node (NVLink, PCIe, or the emulator's loopback), one link
  per rank: ``bandwidth`` is what one rank can send while all ranks of the node send at once;
* ``inter``: each node's NIC, *shared by all ranks of the node*: ``bandwidth`` is what the whole
  node can send, as on a cloud instance and on the emulated cluster (HTB on the node's veth).

Preset figures are assumptions (stated per preset), not measurements; fit them to a real
cluster with ``thinwire simulate --calibrate``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

GBIT = 1e9 / 8  # bytes per second in one Gbit/s


PHASE_FORMS = ("sum", "max")


def combine(fixed_s: float, wire_s: float, form: str) -> float:
    """A phase's time from its fixed cost (latency per message, the ranks' CPU work around the
    transfer) and its wire time: their ``sum`` (the alpha-beta model) or the larger of the two
    (``max``: the fixed work overlaps the transfer, as measured on the emulator, where a phase
    costs about its fixed cost on a fast link and about its wire time on a slow one)."""
    return max(fixed_s, wire_s) if form == "max" else fixed_s + wire_s


@dataclass(frozen=True)
class Link:
    alpha: float       # seconds per message (one ring step)
    bandwidth: float   # bytes per second; math.inf for a link that costs no time per byte
    form: str = "sum"  # how a phase's fixed cost and wire time combine (PHASE_FORMS)

    def __post_init__(self):
        if self.form not in PHASE_FORMS:
            raise ValueError(f"form must be one of {', '.join(PHASE_FORMS)}, got {self.form!r}")
        if not (isinstance(self.alpha, (int, float)) and self.alpha >= 0
                and math.isfinite(self.alpha)):
            raise ValueError(f"alpha must be a finite number >= 0 (seconds), got {self.alpha!r}")
        if not (isinstance(self.bandwidth, (int, float)) and self.bandwidth > 0):
            raise ValueError(f"bandwidth must be > 0 bytes/s (math.inf allowed), "
                             f"got {self.bandwidth!r}")

    def time(self, messages: float, nbytes: float) -> float:
        """``messages * alpha`` and ``nbytes / bandwidth``, combined by the link's form."""
        return combine(messages * self.alpha, nbytes / self.bandwidth, self.form)


@dataclass(frozen=True)
class Network:
    intra: Link
    inter: Link
    description: str = ""

    def with_inter_bandwidth(self, bandwidth: float) -> "Network":
        return replace(self, inter=replace(self.inter, bandwidth=bandwidth))


# Assumptions behind the presets:
# - Ethernet goodput is 90% of the line rate (TCP/IP headers, NCCL/Gloo over sockets), and one
#   ring step over a cloud network costs ~30 us (kernel TCP stack, a switch hop, NCCL protocol).
# - NVLink inside a V100 node (DGX-1/p3-style hybrid cube mesh): ~120 GB/s per GPU of ring
#   bandwidth as NCCL reports it (bus bandwidth), ~5 us per step.
NVLINK = Link(alpha=5e-6, bandwidth=120e9)
NETWORKS: dict[str, Network] = {
    "cloud-25g": Network(intra=NVLINK, inter=Link(alpha=30e-6, bandwidth=0.9 * 25 * GBIT),
                         description="25 Gbit/s cloud Ethernet between nodes, NVLink inside"),
    "cloud-100g": Network(intra=NVLINK, inter=Link(alpha=10e-6, bandwidth=0.9 * 100 * GBIT),
                          description="100 Gbit/s Ethernet/RDMA between nodes, NVLink inside"),
    "nvlink": Network(intra=NVLINK, inter=NVLINK,
                      description="NVLink-class links everywhere (one NVSwitch domain)"),
}
NETWORKS["100g"] = NETWORKS["cloud-100g"]  # the short name


def network(name: str) -> Network:
    if name not in NETWORKS:
        raise ValueError(f"network must be one of {', '.join(NETWORKS)}, got {name!r}")
    return NETWORKS[name]
