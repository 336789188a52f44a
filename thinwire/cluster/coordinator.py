"""The coordinator of a fault-tolerant job on the emulated cluster: torchft's Lighthouse and a
job store, in a process of their own beside the nodes, so that losing any node loses neither.

`thinwire cluster run --fault-tolerant` starts it in the switch's namespace (address
``COORDINATOR_HOST`` on the switch's bridge, reached by every node over its own link), or on
127.0.0.1 without shaping. Each node is then its own torchrun world; its ranks find the
coordinator through ``THINWIRE_FT_LIGHTHOUSE`` (``http://HOST:PORT``) and ``THINWIRE_FT_STORE``
(``HOST:PORT``, a TCPStore: the start barrier of ``thinwire.ft.per_step.wait_for_nodes``).
It prints one line ``ready LIGHTHOUSE_PORT STORE_PORT`` when both listen (port 0 asks the OS
for free ones), and runs until it is terminated.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading

LIGHTHOUSE_ENV = "THINWIRE_FT_LIGHTHOUSE"
STORE_ENV = "THINWIRE_FT_STORE"
NODE_ENV = "THINWIRE_NODE"  # which node a rank's torchrun world is (its own world says 0)
COORDINATOR_HOST = "10.77.0.254"  # on the switch's bridge br0, beside the nodes' 10.77.0.<i+1>
LIGHTHOUSE_PORT, STORE_PORT = 29510, 29511
HEARTBEAT_TIMEOUT_MS = 1000  # a lost node leaves the quorum this long after its last heartbeat
# How long a quorum waits for a live node (heartbeating) that has not asked yet. At 1 s a step
# slower than that (4 x 1 on 2 host cores while a returning node imports torch) split the
# nodes into successive quorums of some of them; healing between them timed out and a 45 s run
# took 130-150 s. A dead node leaves after its heartbeat timeout, so this does not slow a loss.
JOIN_TIMEOUT_MS = 10_000


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m thinwire.cluster.coordinator")
    p.add_argument("--host", required=True)
    p.add_argument("--lighthouse-port", type=int, required=True)
    p.add_argument("--store-port", type=int, required=True)
    args = p.parse_args(argv)
    from torch.distributed import TCPStore
    from torchft.coordination import LighthouseServer

    lighthouse = LighthouseServer(bind=f"{args.host}:{args.lighthouse_port}", min_replicas=1,
                                  join_timeout_ms=JOIN_TIMEOUT_MS,
                                  heartbeat_timeout_ms=HEARTBEAT_TIMEOUT_MS)
    store = TCPStore(args.host, args.store_port, is_master=True, wait_for_workers=False)
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    # the ports it listens on (0 given: the OS chose them, with no window for another
    # process to take one between choosing and binding)
    print(f"ready {lighthouse.address().rsplit(':', 1)[1]} {store.port}", flush=True)
    try:
        stop.wait()
    finally:
        lighthouse.shutdown()
        del store
    return 0


if __name__ == "__main__":
    sys.exit(main())
