"""llmfleet.cluster.wireguard_key and wireguard_status, run in-process with a stand-in `wg`.

The stand-in makes random 32-byte keys (genkey) and a deterministic 'public' key (pubkey: the
sha256 of the private key); the modules only need wg's interface, not its curve.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import stat
import textwrap
from pathlib import Path

import pytest
from ansible.module_utils.testing import patch_module_args
from ansible_collections.llmfleet.cluster.plugins.module_utils.wireguard import (
    WireguardError,
    parse_dump,
    read_key_file,
    valid_key,
)
from ansible_collections.llmfleet.cluster.plugins.modules import wireguard_key, wireguard_status

FAKE_WG = textwrap.dedent(
    """\
    #!/usr/bin/env python3
    import base64, hashlib, os, sys
    cmd = sys.argv[1]
    if cmd == "genkey":
        print(base64.b64encode(os.urandom(32)).decode())
    elif cmd == "pubkey":
        priv = sys.stdin.read().strip()
        print(base64.b64encode(hashlib.sha256(priv.encode()).digest()).decode())
    elif cmd == "show":
        path = os.environ.get("FAKE_WG_DUMP", "")
        if not path or not os.path.exists(path):
            sys.stderr.write("Unable to access interface: No such device\\n")
            sys.exit(1)
        sys.stdout.write(open(path).read())
    """
)


def fake_public(private: str) -> str:
    return base64.b64encode(hashlib.sha256(private.encode()).digest()).decode()


@pytest.fixture
def wg(tmp_path: Path) -> str:
    path = tmp_path / "wg"
    path.write_text(FAKE_WG)
    path.chmod(0o755)
    return str(path)


def run(module, capsys: pytest.CaptureFixture, **args: object) -> tuple[int, dict, str]:
    with patch_module_args(args), pytest.raises(SystemExit) as exc:
        module.main()
    out = capsys.readouterr().out
    return int(exc.value.code or 0), json.loads(out), out


def test_makes_a_0600_key_returns_only_the_public_key_then_keeps_it(
    wg: str, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    path = tmp_path / "etc" / "llmfleet.key"
    code, result, raw = run(wireguard_key, capsys, path=str(path), wg=wg)
    assert code == 0 and result["changed"] is True and result["created"] is True
    private = path.read_text().strip()
    assert valid_key(private)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert result["public_key"] == fake_public(private)
    assert private not in raw
    # a second run (a re-added host) keeps the key: no change, same public key
    code, again, raw = run(wireguard_key, capsys, path=str(path), wg=wg)
    assert code == 0 and again["changed"] is False and again["created"] is False
    assert again["public_key"] == result["public_key"]
    assert path.read_text().strip() == private and private not in raw


def test_rotate_replaces_the_key(wg: str, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    path = tmp_path / "k"
    _code, first, _raw = run(wireguard_key, capsys, path=str(path), wg=wg)
    old = path.read_text()
    _code, rotated, raw = run(wireguard_key, capsys, path=str(path), wg=wg, rotate=True)
    assert rotated["changed"] is True and rotated["public_key"] != first["public_key"]
    assert path.read_text() != old and old.strip() not in raw and path.read_text().strip() not in raw


def test_check_mode_writes_nothing(wg: str, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    path = tmp_path / "k"
    _code, result, _raw = run(wireguard_key, capsys, path=str(path), wg=wg, _ansible_check_mode=True)
    assert result["changed"] is True and result["public_key"] is None and not path.exists()


def test_a_loose_mode_is_tightened(wg: str, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    path = tmp_path / "k"
    run(wireguard_key, capsys, path=str(path), wg=wg)
    os.chmod(path, 0o644)
    _code, result, _raw = run(wireguard_key, capsys, path=str(path), wg=wg)
    assert result["changed"] is True and stat.S_IMODE(path.stat().st_mode) == 0o600


def test_a_file_that_is_not_a_key_fails_without_showing_it(
    wg: str, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    path = tmp_path / "k"
    path.write_text("hunter2-not-a-key\n")
    code, result, raw = run(wireguard_key, capsys, path=str(path), wg=wg)
    assert code == 1 and str(path) in result["msg"] and "hunter2" not in raw
    with pytest.raises(WireguardError, match="does not hold a WireGuard key"):
        read_key_file(str(path))


PRIV = base64.b64encode(b"\x07" * 32).decode()
PUB = base64.b64encode(b"\x08" * 32).decode()
PEER = base64.b64encode(b"\x09" * 32).decode()
PSK = base64.b64encode(b"\x0a" * 32).decode()
DUMP = (
    f"{PRIV}\t{PUB}\t51871\toff\n"
    f"{PEER}\t{PSK}\t10.89.0.3:51871\t10.213.0.7/32\t1764626400\t1200\t3400\t25\n"
    f"{PUB}\t(none)\t(none)\t(none)\t0\t0\t0\toff\n"
)


def test_parse_dump_drops_the_private_and_preshared_keys() -> None:
    out = parse_dump(DUMP)
    assert PRIV not in json.dumps(out) and PSK not in json.dumps(out)
    assert out["public_key"] == PUB and out["listen_port"] == 51871
    assert out["peers"][0] == {
        "public_key": PEER,
        "endpoint": "10.89.0.3:51871",
        "allowed_ips": ["10.213.0.7/32"],
        "latest_handshake": 1764626400,
        "rx_bytes": 1200,
        "tx_bytes": 3400,
        "persistent_keepalive": 25,
    }
    assert out["peers"][1]["endpoint"] is None and out["peers"][1]["allowed_ips"] == []
    assert parse_dump("") is None


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("a\tb\n", "4"),
        (f"{PRIV}\t{PUB}\t1\toff\nx\ty\n", "peer line 2"),
        (f"{PRIV}\t{PUB}\tport\toff\n", "listen port"),
    ],
)
def test_parse_dump_refuses_odd_text(text: str, words: str) -> None:
    with pytest.raises(WireguardError, match=words):
        parse_dump(text)


def test_status_reports_the_interface_without_its_secrets(
    wg: str, tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    dump = tmp_path / "dump"
    dump.write_text(DUMP)
    monkeypatch.setenv("FAKE_WG_DUMP", str(dump))
    code, result, raw = run(wireguard_status, capsys, wg=wg)
    assert code == 0 and result["changed"] is False
    assert result["wireguard"]["up"] is True and result["wireguard"]["public_key"] == PUB
    assert [p["public_key"] for p in result["wireguard"]["peers"]] == [PEER, PUB]
    assert PRIV not in raw and PSK not in raw


def test_status_of_a_missing_interface_is_down(
    wg: str, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("FAKE_WG_DUMP", raising=False)
    code, result, _raw = run(wireguard_status, capsys, wg=wg, interface="nothere")
    assert code == 0 and result["wireguard"]["up"] is False and result["wireguard"]["peers"] == []
