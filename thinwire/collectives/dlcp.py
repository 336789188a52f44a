"""DLCP (PAPERS.md section 4): top-k with error feedback, all-gathered over a loss-tolerant,
prioritised UDP transport (:mod:`thinwire.transport`) instead of gloo's TCP.

The collective is the all-gather of ``topk_allgather`` (the paper's collective-communication
variant): every rank sends its (values, indices) to every other rank, entries ordered by
magnitude so that the largest share of them travels in the high priority class. A step does not
wait for the last lost low-class datagram: what every rank holds is applied on every rank (so
replicas stay identical), and what missed its step goes back to the sender's error feedback, so
nothing is lost over time. Without loss the result equals ``topk_allgather`` bit for bit.

Settings (``SyncState(algorithm_options=...)``; `thinwire train` and `compare` take
``--dlcp-epsilon`` and ``--dlcp-high-share``):

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
from thinwire.collectives.primitives import sum_sparse
from thinwire.collectives.registry import Algorithm, register

DEFAULTS = {"epsilon": 0.02, "high_share": 0.1, "rate_bps": None, "classes": None,
            "deadline_slack": 2.0, "deadline_s": None, "pacing": None, "datagram_bytes": None}
COUNTERS = {"sent": "dlcp_sent", "lost": "dlcp_lost", "retransmitted": "dlcp_retransmitted",
            "entries": "dlcp_entries", "missed_entries": "dlcp_missed_entries"}
_TRANSPORTS: dict = {}  # (id(world group), options) -> (group, Transport)


def options(given: dict) -> dict:
    from thinwire.transport.endpoint import check_options

    unknown = sorted(set(given) - set(DEFAULTS))
    if unknown:
        raise ValueError(f"dlcp algorithm_options: unknown {unknown}; allowed: "
                         f"{', '.join(DEFAULTS)}")
    merged = {**DEFAULTS, **given}
    if merged["rate_bps"] is None and os.environ.get("THINWIRE_INTER_NODE_BPS"):
        merged["rate_bps"] = float(os.environ["THINWIRE_INTER_NODE_BPS"])
    if merged["classes"] is None and os.environ.get("THINWIRE_LINK_CLASSES"):
        merged["classes"] = int(os.environ["THINWIRE_LINK_CLASSES"])
    classes = merged["classes"]
    if classes is not None and (isinstance(classes, bool) or not isinstance(classes, int)
                                or not 2 <= classes <= 8):
        raise ValueError(f"dlcp algorithm_options['classes'] must be an int in [2, 8] or None, "
                         f"got {classes!r}")
    check_options(merged["epsilon"], merged["high_share"], merged["rate_bps"], 1.0,
                  merged["deadline_slack"], merged["deadline_s"], merged["pacing"])
    if merged["datagram_bytes"] is not None:
        from thinwire.transport.wire import check_datagram_bytes
        check_datagram_bytes(merged["datagram_bytes"])
    return merged


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
    corrected = state.feedback.add_residual(bucket_index, flat.clone())
    numel = corrected.numel()
    with state.timer("select"):
        values, indices = state.compressor.select(corrected)
    state.feedback.keep(bucket_index, corrected, indices)
    # DDP's bucket 0 holds the output layers; the highest index, the input's
    transport.max_bucket = max(getattr(transport, "max_bucket", 0), bucket_index)
    position = 1.0 - bucket_index / transport.max_bucket if transport.max_bucket else 0.5
    before = transport.counters.snapshot()
    with state.timer("inter" if topo.nodes > 1 else "intra"):
        result = transport.exchange(state.steps, bucket_index, values, indices, position)
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
    "dlcp", reduce, cost, sparse=True, options=options,
    summary="DLCP: top-k with error feedback all-gathered over loss-tolerant prioritised UDP; "
            "entries that miss their step go back to error feedback"))
