"""Small measuring programs that `thinwire cluster check` starts inside the node namespaces.

    python -m thinwire.cluster.probe serve --host H --port P      (prints READY, serves one client)
    python -m thinwire.cluster.probe bandwidth --host H --port P --seconds S [--tos T]
    python -m thinwire.cluster.probe latency --host H --port P --count N
    python -m thinwire.cluster.probe flood --host H --port P --seconds S [--tos T] [--stop-file F]
    torchrun ... -m thinwire.cluster.probe allreduce --numel N --iters K --json PATH

Each client prints one JSON line with its result. All but `allreduce` use the standard library
only, so `thinwire cluster check` runs this file directly (python .../probe.py), without
importing the thinwire package and torch. Bandwidth is measured at the receiver over
the steady part of the transfer (after the first quarter of the time), so HTB's initial burst
and TCP slow start do not inflate or deflate the rate.
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import struct
import sys
import time

CHUNK = 1 << 20


def _recv_exact(conn: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        part = conn.recv(n - len(buf))
        if not part:
            raise ConnectionError("peer closed the connection")
        buf += part
    return buf


def serve(host: str, port: int) -> None:
    """One client; first byte says what it wants: b'B' bandwidth sink, b'L' latency echo."""
    with socket.create_server((host, port), reuse_port=False) as srv:
        print("READY", flush=True)
        srv.settimeout(60)
        conn, _ = srv.accept()
        with conn:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            kind = _recv_exact(conn, 1)
            if kind == b"B":
                _sink(conn)
            elif kind == b"L":
                while True:
                    data = conn.recv(1)
                    if not data:
                        break
                    conn.sendall(data)


def _sink(conn: socket.socket) -> None:
    """Receive until the sender stops; send back (bytes, seconds) of the steady part."""
    (duration,) = struct.unpack("!d", _recv_exact(conn, 8))
    buf = bytearray(CHUNK)
    total, start = 0, None
    marks: list[tuple[float, int]] = []
    while True:
        n = conn.recv_into(buf)
        if n == 0:
            break
        now = time.perf_counter()
        if start is None:
            start = now
        total += n
        marks.append((now, total))
    # Steady part: from the first mark after 25% of the sender's duration to the last mark.
    t0 = start + duration * 0.25 if start is not None else 0.0
    steady = [m for m in marks if m[0] >= t0]
    if len(steady) >= 2:
        (ta, ba), (tb, bb) = steady[0], steady[-1]
        result = {"bytes": bb - ba, "seconds": tb - ta, "total_bytes": total}
    else:
        result = {"bytes": 0, "seconds": 0.0, "total_bytes": total}
    print(json.dumps(result), flush=True)


def _connect(host: str, port: int, within_s: float = 15.0) -> socket.socket:
    """A TCP connection to host:port, tried again on "no route to host" for ``within_s``: on
    a link that drops packets (--loss) the ARP exchange itself can be lost, three tries in a
    row now and then, and the kernel then reports the host unreachable (a test failed so)."""
    import errno

    deadline = time.monotonic() + within_s
    while True:
        try:
            return socket.create_connection((host, port), timeout=30)
        except OSError as exc:
            if exc.errno != errno.EHOSTUNREACH or time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def bandwidth(host: str, port: int, seconds: float, tos: int = 0,
              stop_file: str | None = None) -> dict:
    """Send for `seconds`, or until `stop_file` exists (checked once per chunk)."""
    import os

    payload = b"\x01" * CHUNK
    with _connect(host, port) as conn:
        if tos:  # the priority class of this flow (thinwire.cluster.qos.tos_for_class)
            conn.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, tos)
        conn.sendall(b"B" + struct.pack("!d", seconds))
        end = time.perf_counter() + seconds
        sent = 0
        while time.perf_counter() < end:
            if stop_file and os.path.exists(stop_file):
                break
            conn.sendall(payload)
            sent += len(payload)
        conn.shutdown(socket.SHUT_WR)
        conn.recv(1)  # wait for the receiver to close: everything has arrived
    return {"sent_bytes": sent}


def flood(host: str, port: int, seconds: float, tos: int = 0,
          stop_file: str | None = None) -> dict:
    """UDP datagrams to host:port as fast as the socket takes them, for `seconds` or until
    `stop_file` exists: a sender that does not back off (unlike TCP), to saturate a link."""
    import os

    payload = b"\x02" * 1400
    sent = 0
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        if tos:
            sock.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, tos)
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            if stop_file and sent % 256 == 0 and os.path.exists(stop_file):
                break
            try:
                sock.sendto(payload, (host, port))  # unconnected: no ICMP errors back
                sent += 1
            except OSError:  # ENOBUFS when the local queue is full: keep pushing
                time.sleep(0.0005)
    return {"sent_datagrams": sent}


def latency(host: str, port: int, count: int) -> dict:
    with _connect(host, port) as conn:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn.sendall(b"L")
        rtts = []
        for i in range(count + 5):
            t = time.perf_counter()
            conn.sendall(b"x")
            _recv_exact(conn, 1)
            if i >= 5:  # the first round trips pay for ARP and slow paths
                rtts.append(time.perf_counter() - t)
    return {"rtt_median_s": statistics.median(rtts), "rtt_min_s": min(rtts), "count": count}


def allreduce(numel: int, iters: int, json_path: str | None) -> None:
    """Under torchrun: time a gloo all-reduce of `numel` float32 and check its result."""
    import os

    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    tensor = torch.full((numel,), float(rank + 1))
    dist.all_reduce(tensor)  # warm-up: connections, buffers
    expected = world * (world + 1) / 2
    ok = bool(torch.all(tensor == expected))
    times = []
    for _ in range(iters):
        tensor.fill_(float(rank + 1))
        dist.barrier()
        t = time.perf_counter()
        dist.all_reduce(tensor)
        times.append(time.perf_counter() - t)
        ok = ok and bool(torch.all(tensor == expected))
    flags = torch.tensor([0 if ok else 1])
    dist.all_reduce(flags)
    result = {"world_size": world, "numel": numel, "bytes": numel * 4,
              "seconds_median": statistics.median(times), "correct": int(flags) == 0,
              "nodes": int(os.environ.get("GROUP_WORLD_SIZE", "1")),
              "ranks_per_node": int(os.environ.get("LOCAL_WORLD_SIZE", "1"))}
    if rank == 0:
        print(json.dumps(result), flush=True)
        if json_path:
            with open(json_path, "w") as handle:
                json.dump(result, handle)
    dist.destroy_process_group()
    if not result["correct"]:
        sys.exit(1)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m thinwire.cluster.probe")
    sub = parser.add_subparsers(dest="what", required=True)
    for name in ("serve", "bandwidth", "latency", "flood"):
        p = sub.add_parser(name)
        p.add_argument("--host", required=True)
        p.add_argument("--port", type=int, required=True)
        if name in ("bandwidth", "flood"):
            p.add_argument("--seconds", type=float, default=1.0)
            p.add_argument("--tos", type=int, default=0)
            p.add_argument("--stop-file", default=None)
        if name == "latency":
            p.add_argument("--count", type=int, default=200)
    p = sub.add_parser("allreduce")
    p.add_argument("--numel", type=int, default=1 << 20)
    p.add_argument("--iters", type=int, default=3)
    p.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    if args.what == "serve":
        serve(args.host, args.port)
    elif args.what == "bandwidth":
        print(json.dumps(bandwidth(args.host, args.port, args.seconds, args.tos,
                                          args.stop_file)), flush=True)
    elif args.what == "flood":
        print(json.dumps(flood(args.host, args.port, args.seconds, args.tos, args.stop_file)),
              flush=True)
    elif args.what == "latency":
        print(json.dumps(latency(args.host, args.port, args.count)), flush=True)
    else:
        allreduce(args.numel, args.iters, args.json)


if __name__ == "__main__":
    from thinwire.rank_exit import exit_rank

    main()
    exit_rank()
