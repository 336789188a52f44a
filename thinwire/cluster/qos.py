"""Priority classes on the emulated links: strict priority built from HTB + pfifo + classic BPF.

The kernel here has HTB and pfifo but no prio, fq, fq_codel or netem qdisc, so a switch port with
priority queues is built from what exists, on every shaped egress (node eth0, switch port p<i>):

    root htb 1: (default = lowest class)
      1:1  htb rate=ceil=LINK                        the wire
        1:30  htb rate=TRICKLE ceil=LINK prio 0      class 0, highest  -> pfifo limit Q0
        1:31  htb rate=TRICKLE ceil=LINK prio 1      class 1           -> pfifo limit Q1
        ...
      filter: classic BPF reading the IP precedence bits (top 3 bits of the IPv4 TOS byte, or
              of the IPv6 traffic class) and returning the class id.

Every class is guaranteed only a trickle and borrows the rest of the wire from 1:1; HTB lends
spare rate to the lowest `prio` number first, so a higher class always takes what it wants and a
lower class gets what is left: strict priority. Each class has its own FIFO of Q packets; once a
low class's queue is full its packets are dropped (counted per class by tc) while the high
class's queue stays short. (A "packet" in a queue is one skb: with GSO on veth, up to 64 KiB.)

How a program marks its traffic (the sender picks the class):

    sock.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, tos_for_class(0, classes))  # highest
    # IPv6 sockets: socket.IPPROTO_IPV6, socket.IPV6_TCLASS with the same value

Unmarked traffic (TOS 0, e.g. gloo's own sockets) is in the lowest class, K-1; precedence p maps
to class max(0, K-1-p). Loss emulation (the drop class 1:20), when asked for, filters first.
"""

from __future__ import annotations

import re

from thinwire.cluster.spec import MAX_LINK_CLASSES, MIN_LINK_CLASSES

CLASS_MINOR_BASE = 0x30   # class k is 1:(0x30 + k), i.e. "1:30".."1:37" (tc minors are hex)
PRIO_FILTER_PRIO = "2"    # after the loss filter (prio 1): a lost packet never reaches a class


def _check_classes(classes: int) -> None:
    if (isinstance(classes, bool) or not isinstance(classes, int)
            or not MIN_LINK_CLASSES <= classes <= MAX_LINK_CLASSES):
        raise ValueError(f"classes must be an integer between {MIN_LINK_CLASSES} and "
                         f"{MAX_LINK_CLASSES}, got {classes!r}")


def tos_for_class(priority_class: int, classes: int) -> int:
    """The IP_TOS byte that puts a socket's packets into `priority_class` (0 = highest) of a
    link with `classes` classes. DSCP class selector CSp, p = classes-1-priority_class."""
    _check_classes(classes)
    if (isinstance(priority_class, bool) or not isinstance(priority_class, int)
            or not 0 <= priority_class < classes):
        raise ValueError(f"priority_class must be an integer between 0 (highest) and "
                         f"{classes - 1} (lowest) for a link with {classes} classes, "
                         f"got {priority_class!r}")
    return (classes - 1 - priority_class) << 5


def class_of_tos(tos: int, classes: int) -> int:
    """The class a packet with this TOS byte lands in (what the BPF filter computes)."""
    _check_classes(classes)
    return max(0, classes - 1 - (tos >> 5))


def classid(priority_class: int) -> str:
    return f"1:{CLASS_MINOR_BASE + priority_class:x}"


def classify_bytecode(classes: int) -> str:
    """Classic BPF for cls_bpf (data starts at the Ethernet header, on veth and lo alike):
    A = precedence; return 1:(0x30 + max(0, K-1-A)); not IP -> 0 (no match: default class)."""
    _check_classes(classes)
    top = 0x10000 + CLASS_MINOR_BASE  # major 1, class 0
    k1 = classes - 1
    prog = [
        (0x28, 0, 0, 12),              # 0  ldh [12]            ethertype
        (0x15, 0, 3, 0x0800),          # 1  jeq #IPv4 ? 2 : 5
        (0x30, 0, 0, 15),              # 2  ldb [15]            TOS byte
        (0x74, 0, 0, 5),               # 3  rsh #5              precedence
        (0x05, 0, 0, 4),               # 4  ja 9
        (0x15, 0, 8, 0x86DD),          # 5  jeq #IPv6 ? 6 : 14
        (0x30, 0, 0, 14),              # 6  ldb [14]            version | tclass high nibble
        (0x74, 0, 0, 1),               # 7  rsh #1
        (0x54, 0, 0, 7),               # 8  and #7              precedence
        (0x35, 3, 0, k1),              # 9  jge #K-1 ? 13 : 10
        (0x84, 0, 0, 0),               # 10 neg                 A = -p
        (0x04, 0, 0, top + k1),        # 11 add #(1:30 + K-1)   A = 1:30 + K-1-p
        (0x16, 0, 0, 0),               # 12 ret A
        (0x06, 0, 0, top),             # 13 ret #1:30           class 0
        (0x06, 0, 0, 0),               # 14 ret #0              not IP: default (lowest) class
    ]
    return f"{len(prog)}," + ",".join(" ".join(str(x) for x in ins) for ins in prog)


def run_classify(tos: int, classes: int, ethertype: int = 0x0800) -> int:
    """A tiny interpreter of `classify_bytecode` on a synthetic packet: what the kernel would
    return. Lets the unit tests check the bytecode itself, not a copy of its logic."""
    prog = [tuple(int(x) for x in ins.split())
            for ins in classify_bytecode(classes).split(",")[1:]]
    pkt = bytearray(40)
    pkt[12:14] = ethertype.to_bytes(2, "big")
    if ethertype == 0x0800:
        pkt[14], pkt[15] = 0x45, tos
    else:
        pkt[14], pkt[15] = 0x60 | (tos >> 4), (tos & 0x0F) << 4
    a, pc = 0, 0
    while True:
        code, jt, jf, k = prog[pc]
        pc += 1
        if code == 0x28:
            a = int.from_bytes(pkt[k:k + 2], "big")
        elif code == 0x30:
            a = pkt[k]
        elif code == 0x74:
            a >>= k
        elif code == 0x54:
            a &= k
        elif code == 0x84:
            a = -a & 0xFFFFFFFF
        elif code == 0x04:
            a = (a + k) & 0xFFFFFFFF
        elif code == 0x05:
            pc += k
        elif code in (0x15, 0x35):
            hit = a == k if code == 0x15 else a >= k
            pc += jt if hit else jf
        elif code == 0x06:
            return k
        elif code == 0x16:
            return a
        else:
            raise AssertionError(f"opcode {code:#x} not interpreted")


def htb_class(verb: str, dev: str, parent: str, cid: str, rate: str, ceil: str, burst: str,
              prio: int | None = None) -> list[str]:
    """`class add|change` argv of one HTB class (the same arguments when it is created and
    when a bandwidth schedule changes its rate)."""
    return (["class", verb, "dev", dev, "parent", parent, "classid", cid, "htb", "rate", rate,
             "ceil", ceil, "burst", burst, "cburst", burst]
            + (["prio", str(prio)] if prio is not None else []) + ["quantum", "200000"])


def _trickle(rate_bps: int) -> str:
    # The guaranteed trickle: 1/1000 of the wire (at least 8 kbit), so borrowing decides.
    return f"{max(rate_bps // 1000, 8000)}bit"


def priority_rate_commands(dev: str, rate_bps: int, burst: str, classes: int
                           ) -> list[list[str]]:
    """tc argv lists that move the wire of an existing priority tree to ``rate_bps``."""
    rate = f"{rate_bps}bit"
    return [htb_class("change", dev, "1:", "1:1", rate, rate, burst)] + [
        htb_class("change", dev, "1:1", classid(k), _trickle(rate_bps), rate, burst, prio=k)
        for k in range(classes)]


def priority_tc_commands(dev: str, rate_bps: int, burst: str, queues: tuple[int, ...],
                         leaf_delay_us: int | None = None) -> list[list[str]]:
    """tc argv lists (without `tc -n NS`) for the classes under an existing `root htb 1:`.
    The root must have been created with `default <lowest class minor>`."""
    rate = f"{rate_bps}bit"
    cmds = [htb_class("add", dev, "1:", "1:1", rate, rate, burst)]
    for k, limit in enumerate(queues):
        cid = classid(k)
        minor = cid.split(":")[1]
        cmds.append(htb_class("add", dev, "1:1", cid, _trickle(rate_bps), rate, burst, prio=k))
        if leaf_delay_us:
            cmds.append(["qdisc", "add", "dev", dev, "parent", cid, "handle", f"{minor}:",
                         "netem", "delay", f"{leaf_delay_us}us", "limit", str(limit)])
        else:
            cmds.append(["qdisc", "add", "dev", dev, "parent", cid, "handle", f"{minor}:",
                         "pfifo", "limit", str(limit)])
    cmds.append(["filter", "add", "dev", dev, "parent", "1:", "protocol", "all",
                 "prio", PRIO_FILTER_PRIO, "bpf", "bytecode", classify_bytecode(len(queues)),
                 "classid", classid(len(queues) - 1)])
    return cmds


def default_minor(classes: int) -> str:
    return classid(classes - 1).split(":")[1]


_CLASS_LINE = re.compile(r"class htb (1:[0-9a-f]+) .*?Sent (\d+) bytes (\d+) pkt "
                         r"\(dropped (\d+), overlimits (\d+)", re.S)


def parse_class_stats(tc_output: str, classes: int) -> list[dict]:
    """Per priority class (highest first): bytes/packets sent and packets dropped, from
    `tc -s class show dev X`. The drops of a class are those of its leaf pfifo (which HTB
    reports on the class)."""
    found = {m.group(1): m for m in _CLASS_LINE.finditer(tc_output)}
    rows = []
    for k in range(classes):
        m = found.get(classid(k))
        rows.append({"class": k, "sent_bytes": int(m.group(2)) if m else None,
                     "sent_packets": int(m.group(3)) if m else None,
                     "dropped": int(m.group(4)) if m else None})
    return rows
