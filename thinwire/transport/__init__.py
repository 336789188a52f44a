"""thinwire.transport: a loss-tolerant, prioritised gradient transport over UDP (DLCP).

    from thinwire.transport import open_transport
    transport = open_transport(epsilon=0.02, rate_bps=100e6, classes=3)  # collective
    result = transport.exchange(step, bucket, values, indices)          # all-gather
    # result.parts[r]: what every rank applies of rank r's payload; result.own_lost: the
    # positions of this rank's payload nobody applies (return them to error feedback)

See docs/design.md, "DLCP (issue 20)".
"""

from thinwire.transport.endpoint import MAX_EPSILON, Exchanged, Transport
from thinwire.transport.setup import open_transport

__all__ = ["Transport", "Exchanged", "open_transport", "MAX_EPSILON"]
