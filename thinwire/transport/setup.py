"""Opening a job's transport: every rank binds a UDP socket and learns its peers' addresses.

The addresses (and a random job id that every datagram carries, so a stray datagram of another
job on the same ports is ignored) are exchanged once over the job's torch.distributed group
(gloo). Peers may only be on loopback or on the emulated cluster's subnet: the transport sends
unthrottled UDP and must never reach beyond the machine.
"""

from __future__ import annotations

import ipaddress
import os
import secrets
import socket

import torch.distributed as dist

from thinwire.transport.endpoint import Transport

EMULATED_SUBNET = ipaddress.ip_network("10.77.0.0/24")  # thinwire.cluster.netns.SUBNET
RECEIVE_BUFFER_BYTES = 8 * 2**20  # about 0.7 s of a 100 Mbit/s link: the thread may lag


def allowed_host(host: str) -> bool:
    address = ipaddress.ip_address(host)
    return address.is_loopback or address in EMULATED_SUBNET


def local_address() -> str:
    """This rank's address toward the job: the interface that routes to MASTER_ADDR (the
    node's eth0 on the emulated cluster), or loopback."""
    master = os.environ.get("MASTER_ADDR")
    if not master:
        return "127.0.0.1"
    target = socket.gethostbyname(master)
    if ipaddress.ip_address(target).is_loopback:
        return "127.0.0.1"
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect((target, 9))  # no datagram is sent: this only picks the route
        return probe.getsockname()[0]


def bind_socket(host: str) -> socket.socket:
    if not allowed_host(host):
        raise ValueError(f"transport host must be a loopback address or in {EMULATED_SUBNET} "
                         f"(the emulated cluster), got {host!r}")
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind((host, 0))
    for option in (getattr(socket, "SO_RCVBUFFORCE", None), socket.SO_RCVBUF):
        if option is None:
            continue
        try:  # FORCE passes the system's rmem_max where root; otherwise the plain request
            sock.setsockopt(socket.SOL_SOCKET, option, RECEIVE_BUFFER_BYTES)
            break
        except OSError:
            continue
    return sock


def open_transport(group=None, **options) -> Transport:
    """Collective over ``group`` (default: the world): a Transport to every other member,
    ranks numbered as in the group. ``options`` go to :class:`Transport`."""
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    sock = bind_socket(local_address())
    try:
        mine = (*sock.getsockname()[:2], secrets.randbits(32))
        everyone = [None] * world
        dist.all_gather_object(everyone, mine, group=group)
        for member, (host, _, _) in enumerate(everyone):
            if not allowed_host(host):
                raise ValueError(f"rank {member} of the transport is at {host}, neither loopback "
                                 f"nor the emulated cluster's {EMULATED_SUBNET}")
        peers = {r: (h, p) for r, (h, p, _) in enumerate(everyone) if r != rank}
        return Transport(sock, rank, peers, everyone[0][2], **options)
    except BaseException:
        sock.close()
        raise
