"""scripts/check-capture.py: make demo-check's judgement of the bridge capture made during the
demo's real answer. The pcap files are built here byte by byte (classic pcap, Ethernet, IPv4 with
TCP/UDP headers, as tcpdump -w writes them), not with the script's own reader: a TCP packet
between the head and a worker fails the check, the tunnel's UDP alone passes it, the question's
text in a payload fails it, traffic with anyone else (the gateway) is not counted, and without
WireGuard the figures are printed but nothing fails.
"""

from __future__ import annotations

import importlib.util
import json
import struct
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("check_capture", ROOT / "scripts" / "check-capture.py")
assert _spec is not None and _spec.loader is not None
cc = importlib.util.module_from_spec(_spec)
sys.modules["check_capture"] = cc  # the dataclass looks its module up
_spec.loader.exec_module(cc)

HEAD, W1, W2, GATEWAY = "10.89.60.2", "10.89.60.3", "10.89.60.4", "10.89.60.1"
WG_PORT = 51871
QUESTION = "Name three colours."


def _ip(address: str) -> bytes:
    return bytes(int(part) for part in address.split("."))


def _frame(src: str, dst: str, proto: int, l4: bytes, vlan: bool = False) -> bytes:
    ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(l4), 1, 0, 64, proto, 0, _ip(src), _ip(dst)) + l4
    macs = b"\x02" * 6 + b"\x04" * 6
    if vlan:
        return macs + b"\x81\x00\x00\x05" + b"\x08\x00" + ip
    return macs + b"\x08\x00" + ip


def _tcp(sport: int, dport: int, payload: bytes = b"") -> bytes:
    return struct.pack("!HHIIBBHHH", sport, dport, 1, 0, 0x50, 0x18, 65535, 0, 0) + payload


def _udp(sport: int, dport: int, payload: bytes = b"") -> bytes:
    return struct.pack("!HHHH", sport, dport, 8 + len(payload), 0) + payload


def _arp() -> bytes:
    return b"\xff" * 6 + b"\x02" * 6 + b"\x08\x06" + b"\x00" * 28


def _pcap(tmp_path: Path, frames: list[bytes], wireguard: bool = True) -> Path:
    data = struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 262144, 1)
    for i, frame in enumerate(frames):
        data += struct.pack("<IIII", 1000 + i, 0, len(frame), len(frame)) + frame
    path = tmp_path / "capture.pcap"
    path.write_bytes(data)
    meta = {
        "bridge": "podman9",
        "head": HEAD,
        "workers": [W1, W2],
        "wireguard": wireguard,
        "wireguard_port": WG_PORT,
        "question": QUESTION,
    }
    Path(f"{path}.json").write_text(json.dumps(meta))
    return path


def _tunnel_traffic() -> list[bytes]:
    return [
        _frame(HEAD, W1, 17, _udp(WG_PORT, WG_PORT, b"\x04" + b"\x00" * 40)),
        _frame(W1, HEAD, 17, _udp(WG_PORT, WG_PORT, b"\x04" + b"\x00" * 40)),
        _frame(HEAD, W2, 17, _udp(WG_PORT, WG_PORT, b"\x04" + b"\x00" * 40), vlan=True),
        _arp(),
    ]


def test_only_tunnel_udp_between_the_head_and_the_workers_passes(tmp_path: Path) -> None:
    result, problems = cc.check(_pcap(tmp_path, _tunnel_traffic()))
    assert problems == []
    assert (result["tcp"], result["tunnel_udp"], result["other_udp"], result["other"]) == (0, 3, 0, 1)
    assert result["workers_talked_to"] == [W1, W2]
    assert result["question_seen"] is False and result["tensor_names"] == 0


def test_one_tcp_packet_in_clear_between_the_head_and_a_worker_fails(tmp_path: Path) -> None:
    frames = [*_tunnel_traffic(), _frame(HEAD, W2, 6, _tcp(40000, 50052, b"\x00" * 16))]
    result, problems = cc.check(_pcap(tmp_path, frames))
    assert result["tcp"] == 1
    assert any("1 TCP packets" in p and HEAD in p for p in problems), problems


def test_tcp_with_the_gateway_is_not_counted(tmp_path: Path) -> None:
    frames = [*_tunnel_traffic(), _frame(GATEWAY, HEAD, 6, _tcp(40000, 8088)), _frame(W1, W2, 6, _tcp(1, 2))]
    result, problems = cc.check(_pcap(tmp_path, frames))
    assert result["tcp"] == 0 and problems == []


def test_no_tunnel_udp_fails(tmp_path: Path) -> None:
    frames = [_frame(HEAD, W1, 17, _udp(5353, 5353)), _arp()]
    result, problems = cc.check(_pcap(tmp_path, frames))
    assert result["tunnel_udp"] == 0 and result["other_udp"] == 1
    assert any(f"port {WG_PORT}" in p for p in problems), problems


def test_the_question_or_tensor_names_in_the_capture_fail(tmp_path: Path) -> None:
    leak = _frame(HEAD, W1, 17, _udp(WG_PORT, WG_PORT, QUESTION.encode() + b" blk.0.attn_q.weight"))
    result, problems = cc.check(_pcap(tmp_path, [*_tunnel_traffic(), leak]))
    assert result["question_seen"] is True and result["tensor_names"] == 1
    assert len(problems) == 2, problems


def test_without_wireguard_the_figures_are_printed_and_nothing_fails(tmp_path: Path, capsys) -> None:
    frames = [_frame(HEAD, W1, 6, _tcp(40000, 50052, b"blk.3.ffn_up.weight")), _arp()]
    path = _pcap(tmp_path, frames, wireguard=False)
    result, problems = cc.check(path)
    assert result["tcp"] == 1 and problems == []
    monkey_argv = ["check-capture.py", str(path)]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("sys.argv", monkey_argv)
        assert cc.main() == 0
    out = capsys.readouterr().out
    assert "no tunnel" in out and "TCP packets in clear 1" in out


def test_a_file_that_is_not_a_pcap_is_refused(tmp_path: Path) -> None:
    path = _pcap(tmp_path, [])
    path.write_bytes(b"PK\x03\x04 not a capture at all.....")
    with pytest.raises(cc.CaptureError, match="not a pcap"):
        cc.check(path)


def test_a_truncated_record_is_refused(tmp_path: Path) -> None:
    path = _pcap(tmp_path, _tunnel_traffic())
    path.write_bytes(path.read_bytes()[:-10])
    with pytest.raises(cc.CaptureError, match="truncated"):
        cc.check(path)


def test_the_demo_runs_over_the_tunnel_and_demo_check_captures_it() -> None:
    """The wiring around the check: the demo inventory turns WireGuard on, demo.sh gives its
    containers the tun device wireguard-go needs, and demo-check captures and checks the pcap."""
    import yaml

    fleet = yaml.safe_load((ROOT / "inventories/demo/group_vars/all/fleet.yml").read_text())
    assert fleet["llmfleet_wireguard"] is True and fleet["llmfleet_target"] == "systemd"
    demo_sh = (ROOT / "scripts" / "demo.sh").read_text()
    run = demo_sh[demo_sh.index("podman run -d") :].split("/sbin/init")[0]
    assert "--device /dev/net/tun" in run and "--cap-add NET_ADMIN" in run
    demo_check = (ROOT / "scripts" / "demo-check.sh").read_text()
    assert 'DEMO_CAPTURE=$state/capture.pcap bash scripts/demo.sh up "$inventory"' in demo_check
    assert 'python3 scripts/check-capture.py "$state/capture.pcap"' in demo_check
