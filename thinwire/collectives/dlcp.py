"""DLCP (PAPERS.md section 4): top-k with error feedback, all-gathered over a loss-tolerant,
prioritised UDP transport (:mod:`thinwire.transport`) instead of gloo's TCP.

The collective is the all-gather of ``topk_allgather`` (the paper's collective-communication
variant): every rank sends its (values, indices) to every other rank, entries ordered by
magnitude so that the largest share of them travels in the high priority class. A step does not
wait for the last lost low-class datagram: what every rank holds is applied on every rank (so
replicas stay identical), and what missed its step goes back to the sender's error feedback, so
nothing is lost over time. Without loss the result equals ``topk_allgather`` bit for bit.

Settings (``OPTIONS``; ``SyncState(algorithm_options=...)``, or
``--algorithm-option dlcp:NAME=VALUE`` in `thinwire train`, `compare`, `bench sync`, `bench ddp-hook` and
`simulate`):

* ``epsilon`` (0.02, in [0, 0.1]): share of a payload's low-class datagrams a receiver may give
  up on;
* ``high_share`` (0.1, in [0, 1]): share of each payload's datagrams in the high class (the
  largest entries), the only ones retransmitted;
* ``rate_bps``: the sender's pacing and the deadline's link rate; default: the emulated
  cluster's inter-node rate (``THINWIRE_INTER_NODE_BPS``), unpaced where none is known;
* ``classes``: the link's priority classes (default ``THINWIRE_LINK_CLASSES``, none: no marks);
* ``deadline_slack`` (2.0): after a sender's POLL (it has sent everything), a receiver waits
  at most this times the wire time of that sender's payload for missing datagrams;
  ``deadline_s`` sets that wait in seconds instead (default without a rate: 0.05 s);
* ``pacing`` ("socket" on the emulated cluster's shaped links, "sleep" elsewhere): who holds
  the sender to the link rate, the link's qdisc through the socket's send buffer, or the
  sender's own sleeps;
* ``datagram_bytes``: the datagram size, default the links' MTU - 28 (1472, or 8972 with
  ``--link-mtu 9000``); smaller only.

Counters per step in ``state.last_step``: ``dlcp_sent``, ``dlcp_lost``, ``dlcp_retransmitted``
(datagrams), ``dlcp_entries`` and ``dlcp_missed_entries`` (see :func:`missed_share`).
"""

from __future__ import annotations

import atexit
import os

import torch

from thinwire.collectives import costs, traffic
from thinwire.collectives.primitives import corrected_copy, select_for_wire, sum_sparse
from thinwire.collectives.registry import Algorithm, register
from thinwire.options import Option
from thinwire.transport import endpoint as transport_options
from thinwire.transport import wire

COUNTERS = {"sent": "dlcp_sent", "lost": "dlcp_lost", "retransmitted": "dlcp_retransmitted",
            "entries": "dlcp_entries", "missed_entries": "dlcp_missed_entries"}
_TRANSPORTS: dict = {}  # (id(world group), options) -> (group, Transport)


OPTIONS = transport_options.OPTIONS + (
    Option("classes", int, None, low=2, high=8, optional=True,
           help="the link's priority classes (none: THINWIRE_LINK_CLASSES, else no marks)"),
    Option("datagram_bytes", int, None, low=wire.MIN_DATAGRAM_BYTES,
           high=wire.JUMBO_DATAGRAM_BYTES, optional=True,
           help="the datagram size, at most the links' MTU - 28 (none: the MTU's)"),
)
DEFAULTS = {option.name: option.default for option in OPTIONS}


def fill_from_cluster(options: dict) -> dict:
    """The emulated cluster's link rate and priority classes where the user left them
    automatic (the launcher sets THINWIRE_INTER_NODE_BPS and THINWIRE_LINK_CLASSES)."""
    options = dict(options)
    if options["rate_bps"] is None and os.environ.get("THINWIRE_INTER_NODE_BPS"):
        options["rate_bps"] = float(os.environ["THINWIRE_INTER_NODE_BPS"])
    if options["classes"] is None and os.environ.get("THINWIRE_LINK_CLASSES"):
        options["classes"] = int(os.environ["THINWIRE_LINK_CLASSES"])
    return options


def missed_share(step: dict) -> float:
    """Share of this rank's selected entries that missed their step (``state.last_step``)."""
    entries = step.get("dlcp_entries", 0.0)
    return step.get("dlcp_missed_entries", 0.0) / entries if entries else 0.0


def _transport(state):
    from thinwire.transport import open_transport

    world = state.topology.world
    key = (id(world), tuple(sorted(state.algorithm_options.items())))
    cached = _TRANSPORTS.get(key)
    if cached is None or cached[0] is not world:
        timeout = state.topology.timeout
        cached = (world, open_transport(world, timeout_s=timeout.total_seconds() if timeout
                                        else 300.0, **state.algorithm_options))
        _TRANSPORTS[key] = cached
    return cached[1]


@atexit.register
def _close_transports() -> None:
    for _, transport in _TRANSPORTS.values():
        transport.close()
    _TRANSPORTS.clear()


def reduce(state, bucket_index: int, flat: torch.Tensor) -> torch.Tensor:
    topo = state.topology
    transport = _transport(state)
    corrected = corrected_copy(state, bucket_index, flat)
    numel = corrected.numel()
    # the shared selection + error feedback (dlcp sends fp32 values: nothing is rounded)
    values, indices = select_for_wire(state, bucket_index, corrected)
    # DDP's bucket 0 holds the output layers; the highest index, the input's
    transport.max_bucket = max(getattr(transport, "max_bucket", 0), bucket_index)
    position = 1.0 - bucket_index / transport.max_bucket if transport.max_bucket else 0.5
    before = transport.counters.snapshot()
    with state.timer("inter" if topo.nodes > 1 else "intra"):
        result = transport.exchange(state.steps, bucket_index, values, indices, position,
                                    index_limit=numel)
    lost = result.own_lost
    if lost.numel() and state.feedback.enabled:  # back to error feedback: nothing is lost
        state.feedback.residuals[bucket_index].index_add_(0, indices[lost], values[lost])
    after = transport.counters.snapshot()
    for name, key in COUNTERS.items():
        state.count(key, after[name] - before[name])
    if topo.world_size > 1:
        state.record(traffic.world_allgather(topo, result.wire_bytes / (topo.world_size - 1)))
    return sum_sparse(result.parts, numel, values.dtype, values.device).div_(topo.world_size)


# the lossless model of topk_allgather's exchange: the same bytes, sent directly
def cost(cfg, cluster, net, elements: int, rates) -> costs.BucketCost:
    return costs.world_sparse_allgather(cfg, cluster, net, elements, rates)


ALGORITHM = register(Algorithm(
    "dlcp", reduce, cost, sparse=True, options=OPTIONS, fill=fill_from_cluster,
    # measured at 50 Mbit/s: its bytes over its whole exchange came to 0.92-0.94 of the
    # nominal rate, where TCP's goodput fitted 0.84-0.88 on the same links
    paced_datagrams=True,
    summary="DLCP: top-k with error feedback all-gathered over loss-tolerant prioritised UDP; "
            "entries that miss their step go back to error feedback"))
