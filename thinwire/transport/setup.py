"""Opening a job's transport: every rank binds a UDP socket and learns its peers' addresses.

The addresses (and a random job id that every datagram carries, so a stray datagram of another
job on the same ports is ignored) are exchanged once over the job's torch.distributed group
(gloo). Peers may only be on loopback or on the emulated cluster's subnets: the transport sends
unthrottled UDP and must never reach beyond the machine.

With several links per node (``THINWIRE_LINKS_PER_NODE`` K, exported by the cluster launcher),
a rank binds one socket on each of its node's links (10.77.k.<n> for link k) and the datagrams
are sprayed over them; the datagram size follows the links' MTU (``THINWIRE_LINK_MTU``), the
smallest any rank reports.
"""

from __future__ import annotations

import ipaddress
import os
import secrets
import socket

import torch.distributed as dist

from thinwire.transport.endpoint import Transport

# thinwire.cluster.netns: link k of node n is 10.77.k.(n+1), k < 8 (spec.MAX_LINKS_PER_NODE)
EMULATED_SUBNET = ipaddress.ip_network("10.77.0.0/21")
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


def link_addresses(host: str, links: int) -> list[str]:
    """This rank's address on each of its node's links: 10.77.0.n -> 10.77.k.n (k < links)."""
    if links == 1:
        return [host]
    if ipaddress.ip_address(host).is_loopback:
        raise ValueError(f"THINWIRE_LINKS_PER_NODE={links} needs the emulated cluster, but this "
                         f"rank's address toward the job is {host} (loopback)")
    first, second, _, last = host.split(".")
    return [f"{first}.{second}.{k}.{last}" for k in range(links)]


def _env_int(name: str, default: int) -> int:
    text = os.environ.get(name, "")
    try:
        return int(text) if text else default
    except ValueError:
        raise ValueError(f"{name} must be an integer, got {text!r}") from None


def open_transport(group=None, **options) -> Transport:
    """Collective over ``group`` (default: the world): a Transport to every other member,
    ranks numbered as in the group. ``options`` go to :class:`Transport`."""
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    links = _env_int("THINWIRE_LINKS_PER_NODE", 1)
    datagram_bytes = _env_int("THINWIRE_LINK_MTU", 1500) - 28  # IPv4 + UDP headers
    asked = options.pop("datagram_bytes", None)
    if asked is not None:  # smaller than the links allow (e.g. to compare); never larger
        if asked > datagram_bytes:
            raise ValueError(f"datagram_bytes={asked} does not fit the links' MTU: at most "
                             f"{datagram_bytes} (THINWIRE_LINK_MTU - 28)")
        datagram_bytes = asked
    socks = []
    try:
        for host in link_addresses(local_address(), links):
            socks.append(bind_socket(host))
        mine = ([s.getsockname()[:2] for s in socks], secrets.randbits(32), datagram_bytes)
        everyone = [None] * world
        dist.all_gather_object(everyone, mine, group=group)
        for member, (addresses, _, _) in enumerate(everyone):
            for host, _ in addresses:
                if not allowed_host(host):
                    raise ValueError(f"rank {member} of the transport is at {host}, neither "
                                     f"loopback nor the emulated cluster's {EMULATED_SUBNET}")
        peers = {r: [tuple(a) for a in addresses] if links > 1 else tuple(addresses[0])
                 for r, (addresses, _, _) in enumerate(everyone) if r != rank}
        smallest = min(d for _, _, d in everyone)  # every rank must cut payloads alike
        return Transport(socks if links > 1 else socks[0], rank, peers, everyone[0][1],
                         datagram_bytes=smallest, **options)
    except BaseException:
        for sock in socks:
            sock.close()
        raise
