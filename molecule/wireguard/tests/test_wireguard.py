"""Must-shows of WireGuard on the systemd target (molecule verify, in file order).

Talks only to this scenario's containers (wg-*, network llmfleet-wg). Every figure asserted on is
printed, so the molecule log is the measurement record. Requests are sent on the head to its
loopback, so that the only traffic between hosts on the bridge is the head's to the workers.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import statistics
import subprocess
import time
from pathlib import Path

import pytest

HEAD = "wg-head"
WORKERS = ["wg-w1", "wg-w2"]
HOSTS = [HEAD, *WORKERS]
NETWORK = "llmfleet-wg"
SCENARIO = Path(__file__).resolve().parents[1]
ROOT = SCENARIO.parents[1]
IFACE = "llmfleet"
KEY_FILE = "/etc/wireguard/llmfleet.key"
RPC_PORT = 50052
AB_PORT = 50062
AB_API = 8091
PROMPT = "Tell me about the purple walrus of Zanzibar in one sentence."
LLAMA = "/opt/llmfleet/llama.cpp/current"


def sh(host: str, command: str, check: bool = True, timeout: float = 120) -> str:
    proc = subprocess.run(
        ["podman", "exec", host, "bash", "-c", command],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"{host}: {command!r} failed ({proc.returncode}): {proc.stderr.strip()[-800:]}")
    return proc.stdout


def playbook(*args: str, timeout: float = 900) -> tuple[int, str]:
    inventory = Path(os.environ["MOLECULE_EPHEMERAL_DIRECTORY"]) / "inventory"
    proc = subprocess.run(
        ["ansible-playbook", "-i", str(inventory), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        check=False,
    )
    return proc.returncode, proc.stdout + proc.stderr


def lan(host: str) -> str:
    data = json.loads(
        subprocess.run(["podman", "inspect", host], capture_output=True, text=True, check=True).stdout
    )
    return data[0]["NetworkSettings"]["Networks"][NETWORK]["IPAddress"]


def tunnel(host: str) -> str:
    data = json.loads(sh(host, f"ip -j -4 addr show dev {IFACE}"))
    return data[0]["addr_info"][0]["local"]


def public_key(host: str) -> str:
    return sh(host, f"wg show {IFACE} public-key").strip()


def private_keys() -> dict:
    return {h: sh(h, f"cat {KEY_FILE}").strip() for h in HOSTS}


@pytest.fixture(scope="module")
def plan() -> dict:
    return json.loads(sh(HEAD, "cat /etc/llmfleet/plan.json"))


def complete(port: int, key: bool, max_tokens: int = 32, prompt: str = PROMPT) -> dict:
    """One chat completion sent on the head to its own loopback (the key read there)."""
    body = json.dumps(
        {"messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens, "temperature": 0}
    )
    auth = '-H "Authorization: Bearer $(cat /etc/llmfleet/api-key)"' if key else ""
    out = sh(
        HEAD,
        f"curl -sf --max-time 600 {auth} -H 'Content-Type: application/json' -d @- "
        f"http://127.0.0.1:{port}/v1/chat/completions <<'EOF'\n{body}\nEOF",
        timeout=660,
    )
    return json.loads(out)


def bridge() -> str:
    data = json.loads(
        subprocess.run(
            ["podman", "network", "inspect", NETWORK], capture_output=True, text=True, check=True
        ).stdout
    )
    return data[0]["network_interface"]


def capture(during, path: Path) -> dict:
    """tcpdump on the bridge (head <-> workers only) while ``during()`` runs; counts and bytes."""
    workers = " or ".join(f"host {lan(w)}" for w in WORKERS)
    expr = f"host {lan(HEAD)} and ({workers})"
    proc = subprocess.Popen(
        ["tcpdump", "-i", bridge(), "-U", "-n", "-s", "0", "-w", str(path), expr],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    time.sleep(1.5)
    try:
        result = during()
    finally:
        time.sleep(1.0)
        proc.terminate()
        proc.wait(timeout=10)

    def count(flt: str) -> int:
        out = subprocess.run(
            ["tcpdump", "-r", str(path), "-n", flt], capture_output=True, text=True, check=False
        )
        return len([line for line in out.stdout.splitlines() if line.strip()])

    data = path.read_bytes()
    return {
        "result": result,
        "tcp": count("tcp"),
        "udp": count("udp"),
        "other": count("not tcp and not udp"),
        "bytes": len(data),
        "prompt_seen": PROMPT.encode() in data or b"purple walrus" in data,
        "tensor_names": data.count(b"blk."),
    }


# ----------------------------------------------------------------------------------------------


def test_the_tunnel_is_up_with_wireguard_go_and_the_plan_uses_tunnel_addresses(plan: dict) -> None:
    for host in HOSTS:
        assert sh(host, "pgrep -x wireguard-go", check=False).strip(), f"{host}: wireguard-go is not running"
        assert sh(host, f"test -S /var/run/wireguard/{IFACE}.sock && echo yes").strip() == "yes"
    endpoints = [h["endpoint"] for h in plan["hosts"] if h["name"] in plan["workers"]]
    print(f"\nplan --rpc {plan['rpc']}; tunnel addresses { ({h: tunnel(h) for h in HOSTS}) }")
    assert sorted(plan["workers"]) == WORKERS
    for worker in WORKERS:
        assert f"{tunnel(worker)}:{RPC_PORT}" in endpoints
        listening = sh(worker, f"ss -Hltn 'sport = :{RPC_PORT}'")
        assert f"{tunnel(worker)}:{RPC_PORT}" in listening and lan(worker) not in listening, listening
    head_peers = sh(HEAD, f"wg show {IFACE} peers").split()
    assert sorted(head_peers) == sorted(public_key(w) for w in WORKERS)
    for worker in WORKERS:
        assert sh(worker, f"wg show {IFACE} peers").split() == [public_key(HEAD)]


def test_rpc_server_is_unreachable_on_the_lan_from_the_head_and_the_controller() -> None:
    import socket

    for worker in WORKERS:
        probe = f"timeout 5 bash -c '</dev/tcp/{lan(worker)}/{RPC_PORT}' && echo open || echo closed"
        assert sh(HEAD, probe).strip() == "closed", f"{worker}: the RPC port answers on the LAN from the head"
        with pytest.raises(OSError):
            socket.create_connection((lan(worker), RPC_PORT), timeout=5).close()
        through = f"timeout 5 bash -c '</dev/tcp/{tunnel(worker)}/{RPC_PORT}' && echo open || echo closed"
        assert sh(HEAD, through).strip() == "open", f"{worker}: the RPC port does not answer on the tunnel"
        # the firewall admits the head's tunnel address only: the other worker is dropped
        other = next(w for w in WORKERS if w != worker)
        assert sh(other, through).strip() == "closed"
    print("\nrpc-server: closed on the workers' LAN addresses (head and controller), open on the tunnel")


def test_a_real_request_crosses_the_bridge_only_as_wireguard_udp(tmp_path: Path) -> None:
    seen = capture(lambda: complete(8080, key=True, max_tokens=48), tmp_path / "tunnel.pcap")
    tokens = seen["result"]["usage"]["completion_tokens"]
    print(
        f"\ncapture on {bridge()} during a {tokens}-token answer: TCP packets between head and workers "
        f"{seen['tcp']}, UDP {seen['udp']}, other {seen['other']}, {seen['bytes']} bytes; prompt seen "
        f"{seen['prompt_seen']}; RPC tensor names {seen['tensor_names']}"
    )
    assert tokens > 0
    assert seen["tcp"] == 0
    assert seen["udp"] > 0
    assert not seen["prompt_seen"]
    assert seen["tensor_names"] == 0


# A unit left by an earlier run (or a hand-run attempt) makes systemd-run refuse the name
# ("Unit wg-ab-rpc.service was already loaded"): stop it and forget its failure first.
_FRESH_UNIT = "systemctl stop {unit} 2>/dev/null; systemctl reset-failed {unit} 2>/dev/null; "


def _start_lan_fleet(plan: dict) -> None:
    """A second rpc-server on each worker's LAN address and a second llama-server using them."""
    for worker in WORKERS:
        binary = sh(worker, f"ls {LLAMA}/ggml-rpc-server {LLAMA}/rpc-server 2>/dev/null | head -1").strip()
        # the same threads as the unit's rpc-server
        threads = sh(
            worker, "grep -o -- '--threads [0-9]*' /etc/systemd/system/llmfleet-rpc-server.service"
        ).split()[1]
        sh(
            worker,
            f"{_FRESH_UNIT.format(unit='wg-ab-rpc')}systemd-run --unit wg-ab-rpc -p User=llmfleet "
            f"{binary} --host {lan(worker)} --port {AB_PORT} --threads {threads}",
        )
    args = list(plan["llama_server_args"])
    by_tunnel = {f"{tunnel(w)}:{RPC_PORT}": f"{lan(w)}:{AB_PORT}" for w in WORKERS}
    args[args.index("--rpc") + 1] = ",".join(by_tunnel[e] for e in args[args.index("--rpc") + 1].split(","))
    model = f"/var/lib/llmfleet/models/{Path(plan['model']['file']).name}"
    sh(
        HEAD,
        f"{_FRESH_UNIT.format(unit='wg-ab-server')}systemd-run --unit wg-ab-server -p User=llmfleet "
        f"{LLAMA}/llama-server -m {model} --host 127.0.0.1 --port {AB_API} {shlex.join(args)}",
    )
    # loading the model over RPC takes minutes on a loaded machine
    sh(
        HEAD,
        f"for i in $(seq 600); do curl -sf http://127.0.0.1:{AB_API}/health && exit 0; sleep 1; done; exit 1",
        timeout=660,
    )


def _stop_lan_fleet() -> None:
    sh(HEAD, "systemctl stop wg-ab-server", check=False)
    for worker in WORKERS:
        sh(worker, "systemctl stop wg-ab-rpc", check=False)


def test_tokens_per_second_with_and_without_the_tunnel(plan: dict, tmp_path: Path) -> None:
    _start_lan_fleet(plan)
    try:
        # the control: the same capture sees the LAN fleet's RPC in clear
        lan_seen = capture(lambda: complete(AB_API, key=False, max_tokens=8), tmp_path / "lan.pcap")
        print(
            f"\ncontrol (RPC on the LAN, no tunnel): TCP {lan_seen['tcp']}, UDP {lan_seen['udp']}, "
            f"RPC tensor names {lan_seen['tensor_names']}"
        )
        assert lan_seen["tcp"] > 0
        rates: dict = {"tunnel": [], "lan": []}
        pair = [("tunnel", 8080, True), ("lan", AB_API, False)]
        for round_ in range(4):
            # ABBA: each side goes first as often as the other (a warm cache, the load)
            for name, port, key in pair if round_ % 2 == 0 else pair[::-1]:
                reply = complete(port, key=key, max_tokens=32)
                rates[name].append(float(reply["timings"]["predicted_per_second"]))
    finally:
        _stop_lan_fleet()
    tun, clear = statistics.median(rates["tunnel"]), statistics.median(rates["lan"])
    assert tun > 0 and clear > 0
    print(
        f"tokens/s (A/B alternating ABBA, 4 rounds, 32 tokens): tunnel {rates['tunnel']} median {tun:.2f}; "
        f"LAN {rates['lan']} median {clear:.2f}; ratio tunnel/LAN {tun / clear:.3f}, "
        f"tunnel overhead {100 * (clear - tun) / clear:.1f} %"
    )


def test_site_again_with_v_changes_nothing_and_shows_no_private_key() -> None:
    keys = private_keys()
    start = time.monotonic()
    code, log = playbook("-v", str(SCENARIO / "converge.yml"))
    took = time.monotonic() - start
    eph = Path(os.environ["MOLECULE_EPHEMERAL_DIRECTORY"])
    (eph / "site-v.log").write_text(log)
    leaked = [h for h, k in keys.items() if k in log]
    assert not leaked, f"private keys of {leaked} in the -v output"
    assert code == 0, log[-3000:]
    recap = re.findall(r"^(\S+)\s+: ok=(\d+)\s+changed=(\d+)", log, re.M)
    print(
        f"\nsite.yml -v second run: {took:.1f} s; recap {recap}; {len(log)} characters, private keys in it: 0"
    )
    assert {h for h, _o, _c in recap} >= set(HOSTS)
    assert all(c == "0" for _h, _o, c in recap), recap
    # nor in any file of the controller's side (output dir, inventory, logs); the model is skipped
    for path in eph.rglob("*"):
        if path.is_file() and path.stat().st_size < 20 * 1024 * 1024:
            data = path.read_bytes()
            assert not [h for h, k in keys.items() if k.encode() in data], f"a private key in {path}"
    for host in HOSTS:
        assert sh(host, f"stat -c '%a %U' {KEY_FILE}").split() == ["600", "root"]
        assert sh(host, f"grep -c PrivateKey /etc/wireguard/{IFACE}.conf", check=False).strip() == "0"


def test_wireguard_in_check_mode_reports_no_change() -> None:
    code, log = playbook("--check", "playbooks/wireguard.yml")
    recap = re.findall(r"^(\S+)\s+: ok=(\d+)\s+changed=(\d+)", log, re.M)
    print(f"\nwireguard.yml --check: recap {recap}")
    assert code == 0, log[-3000:]
    assert all(c == "0" for _h, _o, c in recap), recap


def test_verify_names_a_worker_whose_key_the_head_does_not_know() -> None:
    # wg-w2 gets a key the head has never seen (made on it, as an intruder or a rebuilt host would)
    sh("wg-w2", f"wg genkey > {KEY_FILE} && systemctl restart wg-quick@{IFACE}")
    head_tunnel = tunnel(HEAD)
    reach = sh(
        "wg-w2", f"ping -c 2 -W 2 {head_tunnel} >/dev/null && echo reached || echo unreachable"
    ).strip()
    code, log = playbook("playbooks/verify.yml")
    named = re.findall(r"(wg-w\d): its public key \S+ is not known to the head", log)
    print(
        f"\nwg-w2 with an unknown key: ping to the head's tunnel address {reach}; verify.yml rc {code}, names {named}"
    )
    assert reach == "unreachable"
    assert code != 0 and set(named) == {"wg-w2"}
    # site's wireguard step gives the head the new key: the worker is back
    code, log = playbook("playbooks/wireguard.yml")
    assert code == 0, log[-3000:]
    assert public_key("wg-w2") in sh(HEAD, f"wg show {IFACE} peers").split()
    assert "reached" in sh("wg-w2", f"ping -c 3 -W 2 {head_tunnel} >/dev/null && echo reached || echo no")


def test_a_host_removed_and_re_added_keeps_its_key_and_address() -> None:
    key, address = public_key("wg-w1"), tunnel("wg-w1")
    code, log = playbook("playbooks/wireguard.yml", "--limit", "wg-w1", "-e", "wireguard_state=absent")
    assert code == 0, log[-3000:]
    assert sh("wg-w1", f"ip link show {IFACE} >/dev/null 2>&1 && echo up || echo gone").strip() == "gone"
    code, log = playbook("playbooks/wireguard.yml")
    assert code == 0, log[-3000:]
    print(
        f"\nwg-w1 re-added: key kept {public_key('wg-w1') == key}, address kept {tunnel('wg-w1') == address}"
    )
    assert public_key("wg-w1") == key and tunnel("wg-w1") == address


def test_rotation_gives_every_host_a_new_key_and_the_fleet_still_answers() -> None:
    before = {h: public_key(h) for h in HOSTS}
    addresses = {h: tunnel(h) for h in HOSTS}
    code, log = playbook("playbooks/wireguard_rotate.yml")
    assert code == 0, log[-3000:]
    after = {h: public_key(h) for h in HOSTS}
    assert all(after[h] != before[h] for h in HOSTS), (before, after)
    assert {h: tunnel(h) for h in HOSTS} == addresses
    code, log = playbook("playbooks/verify.yml")
    Path(os.environ["MOLECULE_EPHEMERAL_DIRECTORY"]).joinpath("verify-after-rotate.log").write_text(log)
    print(f"\nrotation: {len(HOSTS)} new public keys, addresses unchanged; verify.yml after it rc {code}")
    assert code == 0, log[-3000:]


@pytest.fixture(autouse=True, scope="module")
def _tcpdump() -> None:
    if not shutil.which("tcpdump"):
        pytest.fail("tcpdump is missing on the controller (scripts/host-setup.sh installs it)")
