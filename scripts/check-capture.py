#!/usr/bin/env python
# Copyright: llmfleet developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""What crossed the demo's bridge during its real answer: a pcap that scripts/demo.sh wrote.

    python3 scripts/check-capture.py FILE.pcap      (FILE.pcap.json: bridge, head, workers, ...)

Reads the capture itself (pcap, Ethernet, IPv4: no tcpdump needed to count) and prints, for the
packets between the head's and the workers' LAN addresses: TCP packets, UDP packets to or from
the WireGuard port, other packets, bytes, whether the question's text is in the capture, and how
many RPC tensor names ("blk.") are. With WireGuard on it fails (exit 1) unless there is no TCP
at all between them, some tunnel UDP, and the question is absent; with WireGuard off it only
prints the figures (RPC in clear: TCP > 0).
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import struct
import sys
from dataclasses import dataclass, field
from pathlib import Path

PCAP_MAGIC = {
    b"\xd4\xc3\xb2\xa1": "<",
    b"\xa1\xb2\xc3\xd4": ">",
    b"\x4d\x3c\xb2\xa1": "<",
    b"\xa1\xb2\x3c\x4d": ">",
}
LINKTYPE_ETHERNET = 1
ETH_IPV4 = 0x0800
ETH_VLAN = 0x8100
TCP, UDP = 6, 17
# A capture of one short answer is a few tens of MB; refuse anything absurd rather than read it.
MAX_BYTES = 2 * 1024**3
TENSOR_MARK = b"blk."


class CaptureError(Exception):
    pass


@dataclass
class Figures:
    packets: int = 0
    tcp: int = 0
    tunnel_udp: int = 0
    other_udp: int = 0
    other: int = 0
    bytes: int = 0
    pairs: set = field(default_factory=set)

    def as_dict(self) -> dict:
        return {
            "packets": self.packets,
            "tcp": self.tcp,
            "tunnel_udp": self.tunnel_udp,
            "other_udp": self.other_udp,
            "other": self.other,
            "bytes": self.bytes,
        }


def packets(data: bytes):
    """(link type, frame) for every record of a classic pcap file."""
    if len(data) < 24 or data[:4] not in PCAP_MAGIC:
        raise CaptureError(f"not a pcap file (magic {data[:4].hex() or 'none'})")
    order = PCAP_MAGIC[data[:4]]
    (linktype,) = struct.unpack(order + "I", data[20:24])
    offset = 24
    while offset + 16 <= len(data):
        _sec, _frac, incl, _orig = struct.unpack(order + "IIII", data[offset : offset + 16])
        offset += 16
        if offset + incl > len(data):
            raise CaptureError(f"truncated record at byte {offset - 16} ({incl} bytes announced)")
        yield linktype, data[offset : offset + incl]
        offset += incl


def ipv4(linktype: int, frame: bytes):
    """(source, destination, protocol, payload) of an IPv4 Ethernet frame, else None."""
    if linktype != LINKTYPE_ETHERNET or len(frame) < 14:
        return None
    ethertype, start = struct.unpack("!H", frame[12:14])[0], 14
    if ethertype == ETH_VLAN and len(frame) >= 18:
        ethertype, start = struct.unpack("!H", frame[16:18])[0], 18
    if ethertype != ETH_IPV4 or len(frame) < start + 20:
        return None
    ihl = (frame[start] & 0x0F) * 4
    proto = frame[start + 9]
    src = str(ipaddress.IPv4Address(frame[start + 12 : start + 16]))
    dst = str(ipaddress.IPv4Address(frame[start + 16 : start + 20]))
    return src, dst, proto, frame[start + ihl :]


def count(data: bytes, head: str, workers: list[str], port: int) -> Figures:
    """The packets between the head and any worker, by kind (the tunnel's UDP: port ``port``)."""
    figures = Figures(bytes=len(data))
    wanted = set(workers)
    for linktype, frame in packets(data):
        parsed = ipv4(linktype, frame)
        if parsed is None:
            figures.other += 1
            continue
        src, dst, proto, payload = parsed
        if not ((src == head and dst in wanted) or (dst == head and src in wanted)):
            continue
        figures.packets += 1
        figures.pairs.add((src, dst))
        if proto == TCP:
            figures.tcp += 1
        elif proto == UDP and len(payload) >= 4 and port in struct.unpack("!HH", payload[:4]):
            figures.tunnel_udp += 1
        elif proto == UDP:
            figures.other_udp += 1
        else:
            figures.other += 1
    return figures


def check(pcap: Path) -> tuple[dict, list[str]]:
    """The figures and what is wrong with them (nothing: the answer crossed only the tunnel)."""
    meta = json.loads(Path(f"{pcap}.json").read_text())
    size = pcap.stat().st_size
    if size > MAX_BYTES:
        raise CaptureError(f"{pcap} is {size} bytes, more than {MAX_BYTES}")
    data = pcap.read_bytes()
    figures = count(data, meta["head"], meta["workers"], int(meta["wireguard_port"]))
    question = str(meta["question"]).encode()
    result = figures.as_dict() | {
        "bridge": meta["bridge"],
        "head": meta["head"],
        "workers": meta["workers"],
        "wireguard": bool(meta["wireguard"]),
        "question_seen": bool(question) and question in data,
        "tensor_names": data.count(TENSOR_MARK),
        "workers_talked_to": sorted({w for pair in figures.pairs for w in pair if w != meta["head"]}),
    }
    problems = []
    if result["wireguard"]:
        if result["tcp"]:
            problems.append(
                f"{result['tcp']} TCP packets between the head {meta['head']} and the workers in clear"
            )
        if not result["tunnel_udp"]:
            problems.append(
                f"no WireGuard UDP (port {meta['wireguard_port']}) between the head and the workers"
            )
        if result["question_seen"]:
            problems.append(f"the question {meta['question']!r} is in the capture")
        if result["tensor_names"]:
            problems.append(
                f"{result['tensor_names']} RPC tensor names ({TENSOR_MARK.decode()}) in the capture"
            )
    return result, problems


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("pcap", type=Path)
    args = parser.parse_args()
    try:
        result, problems = check(args.pcap)
    except (CaptureError, OSError, KeyError, ValueError) as exc:
        print(f"demo-check: capture {args.pcap}: {exc}", file=sys.stderr)
        return 1
    mode = "WireGuard" if result["wireguard"] else "no tunnel"
    print(
        f"demo-check: capture on {result['bridge']} during the real answer ({mode}), head {result['head']} <-> "
        f"workers {' '.join(result['workers'])}: TCP packets in clear {result['tcp']}, WireGuard UDP "
        f"{result['tunnel_udp']}, other UDP {result['other_udp']}, other {result['other']}; "
        f"{result['bytes']} bytes; question seen {result['question_seen']}; RPC tensor names "
        f"{result['tensor_names']}; workers in it {' '.join(result['workers_talked_to']) or 'none'}"
    )
    for problem in problems:
        print(f"demo-check: FAILED: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
