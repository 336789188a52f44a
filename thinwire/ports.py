"""A free TCP port on the loopback, for rendezvous and local servers."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A port nothing listens on right now (the OS picks it; another process may still take it
    before it is used, which every caller tolerates by failing clearly)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
