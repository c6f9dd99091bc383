"""Must-shows of the chat page on a real systemd head (molecule verify, in file order).

Talks only to this scenario's container: podman exec, and HTTPS to its address on the
scenario's network. The last test drives Debian's chromium against the deployed page.
"""

from __future__ import annotations

import base64
import http.client
import json
import os
import ssl
import subprocess
import sys
import time
from pathlib import Path

import pytest

HEAD = "chat-head"
NETWORK = "llmfleet-chat"
ROOT = Path(__file__).resolve().parents[3]
PORT = 8088
USER = "llmfleet"
PASSWORD = "molecule-chat-password"
UNIT = "llmfleet-chat.service"
CONFIG = "/etc/llmfleet-chat"


def sh(command: str, check: bool = True) -> str:
    proc = subprocess.run(
        ["podman", "exec", HEAD, "sh", "-c", command], capture_output=True, text=True, timeout=60, check=False
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"{HEAD}: {command!r} failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc.stdout


@pytest.fixture(scope="module")
def address() -> str:
    out = subprocess.run(
        [
            "podman",
            "inspect",
            HEAD,
            "--format",
            '{{ (index .NetworkSettings.Networks "' + NETWORK + '").IPAddress }}',
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert out, "no address on the scenario network"
    return out


@pytest.fixture(scope="module")
def api_key() -> str:
    return sh("cat /etc/llmfleet/api-key").strip()


@pytest.fixture(scope="module")
def tls_context() -> ssl.SSLContext:
    cert = sh(f"cat {CONFIG}/tls.crt")
    context = ssl.create_default_context(cadata=cert)
    context.check_hostname = False  # the certificate names chat-head; we connect by address
    return context


def request(
    address: str,
    context: ssl.SSLContext,
    method: str,
    path: str,
    body: bytes | None = None,
    auth: bool = True,
) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPSConnection(address, PORT, timeout=30, context=context)
    headers = {}
    if auth:
        headers["Authorization"] = "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
    if body is not None:
        headers["Content-Type"] = "application/json"
    conn.request(method, path, body, headers)
    resp = conn.getresponse()
    data = resp.read()
    conn.close()
    return resp.status, {k.lower(): v for k, v in resp.getheaders()}, data


def test_unit_runs_unprivileged() -> None:
    assert sh(f"systemctl is-active {UNIT}").strip() == "active"
    assert sh(f"systemctl is-enabled {UNIT}").strip() == "enabled"
    pid = sh(f"systemctl show -p MainPID --value {UNIT}").strip()
    user = sh(f"ps -o user= -p {pid}").strip()
    print(f"\n{UNIT}: pid {pid} runs as {user}")
    assert user == "llmfleet-chat"


def test_unit_passes_systemd_analyze_verify() -> None:
    out = subprocess.run(
        ["podman", "exec", HEAD, "systemd-analyze", "verify", f"/etc/systemd/system/{UNIT}"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 0, out.stdout + out.stderr


def test_secret_files_are_0600_and_owned_by_the_page() -> None:
    listing = sh(
        f"stat -c '%n %a %U' {CONFIG}/password {CONFIG}/api-key {CONFIG}/tls.key {CONFIG}/tls.crt {CONFIG}"
    )
    print("\n" + listing)
    modes = {line.split()[0]: tuple(line.split()[1:]) for line in listing.splitlines()}
    for name in ("password", "api-key", "tls.key"):
        assert modes[f"{CONFIG}/{name}"] == ("600", "llmfleet-chat"), name
    assert modes[f"{CONFIG}/tls.crt"][0] == "644"
    assert modes[CONFIG] == ("750", "root")


def test_the_key_on_the_head_was_taken_from_llama_rpc(api_key: str) -> None:
    assert sh(f"cat {CONFIG}/api-key").strip() == api_key


def test_healthz_is_open_and_everything_else_needs_the_password(
    address: str, tls_context: ssl.SSLContext
) -> None:
    assert request(address, tls_context, "GET", "/healthz", auth=False)[0] == 200
    for path in ("/chat/", "/chat/app.js", "/chat/api/config"):
        status, headers, _unused = request(address, tls_context, "GET", path, auth=False)
        assert status == 401 and headers["www-authenticate"].startswith("Basic"), path
    status, headers, body = request(address, tls_context, "GET", "/chat/")
    assert status == 200 and b'id="prompt"' in body
    assert "max-age" in headers["strict-transport-security"]


def test_plain_http_gets_nothing(address: str) -> None:
    conn = http.client.HTTPConnection(address, PORT, timeout=10)
    with pytest.raises((http.client.HTTPException, OSError)):
        conn.request("GET", "/chat/")
        status = conn.getresponse().status
        raise AssertionError(f"plain HTTP answered {status}")


def test_a_streamed_answer_through_the_page(address: str, tls_context: ssl.SSLContext, api_key: str) -> None:
    body = json.dumps({"messages": [{"role": "user", "content": "Hello?"}]}).encode()
    conn = http.client.HTTPSConnection(address, PORT, timeout=60, context=tls_context)
    auth = "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
    t0 = time.monotonic()
    conn.request("POST", "/chat/api/chat", body, {"Authorization": auth, "Content-Type": "application/json"})
    resp = conn.getresponse()
    assert resp.status == 200, resp.read()
    pieces, arrivals, raw = [], [], b""
    while True:
        line = resp.readline()
        if not line:
            break
        raw += line
        if line.startswith(b"data: {"):
            event = json.loads(line[6:])
            for choice in event.get("choices") or []:
                if (choice.get("delta") or {}).get("content"):
                    pieces.append(choice["delta"]["content"])
                    arrivals.append(round(time.monotonic() - t0, 2))
    conn.close()
    print(f"\nstreamed {len(pieces)} pieces at {arrivals} s: {''.join(pieces)!r}")
    # The fake upstream answers only with the right key and the model it serves (vLLM's rule).
    assert "".join(pieces) == "The fleet answers one token at a time."
    assert arrivals[-1] - arrivals[0] > 0.4, "the pieces arrived together, not as they were made"
    assert api_key.encode() not in raw
    status, _unused, config = request(address, tls_context, "GET", "/chat/api/config")
    assert status == 200
    assert json.loads(config)["model"] == "test-org/fake-model"


def test_the_api_over_the_pages_tls_port_needs_the_clients_own_key(
    address: str, tls_context: ssl.SSLContext, api_key: str
) -> None:
    """chat_ui_api_passthrough (on with TLS): /v1 relayed with the caller's key, never the page's."""
    assert "--api-passthrough" in sh(f"systemctl cat {UNIT}")

    def call(authorization: str | None) -> tuple[int, bytes]:
        conn = http.client.HTTPSConnection(address, PORT, timeout=30, context=tls_context)
        conn.request("GET", "/v1/models", headers={"Authorization": authorization} if authorization else {})
        resp = conn.getresponse()
        data = resp.read()
        conn.close()
        return resp.status, data

    status, body = call("Bearer " + api_key)
    assert status == 200 and json.loads(body)["data"][0]["id"] == "test-org/fake-model"
    # Without a key, or with the page's password, the upstream itself refuses: the page lends nothing.
    basic = "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
    for authorization in (None, basic, "Bearer not-the-key"):
        status, body = call(authorization)
        assert status == 401 and b"Invalid API Key" in body, (authorization and authorization[:6], body)


def test_chromium_against_the_deployed_page(address: str, api_key: str) -> None:
    env = dict(os.environ)
    env.update(
        {
            "LLMFLEET_CHAT_URL": f"https://{address}:{PORT}/chat/",
            "LLMFLEET_CHAT_USER": USER,
            "LLMFLEET_CHAT_PASSWORD": PASSWORD,
            "LLMFLEET_CHAT_API_KEY": api_key,
            "LLMFLEET_TEST_OUTPUT": str(ROOT / "tests" / "output" / "molecule-chat_ui"),
            "LLMFLEET_CHAT_TIMEOUT": "60",
        }
    )
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-s",
            "-p",
            "no:cacheprovider",
            "tests/browser/test_chat_browser.py",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    print(proc.stdout[-3000:])
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert " passed" in proc.stdout and "skipped" not in proc.stdout
