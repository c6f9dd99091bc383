"""The k3s stand-in and the molecule scenario's release table agree, and the stand-in behaves.

The molecule scenario `k3s` pins tests/fixtures/k3s/k3s-standin by sha256; an edit to the stand-in
without updating the table would only show up as a download failure deep in a molecule run.
The behaviour tests run the stand-in on loopback: a server, an agent with the right token, one
with the wrong token, and a token file readable by others.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[3]
STANDIN = ROOT / "tests" / "fixtures" / "k3s" / "k3s-standin"
MOLECULE = ROOT / "molecule" / "k3s" / "molecule.yml"


def test_release_table_pins_the_standin() -> None:
    scenario = yaml.safe_load(MOLECULE.read_text())
    group_vars = scenario["provisioner"]["inventory"]["group_vars"]["all"]
    table = group_vars["k3s_releases"][group_vars["k3s_version"]]
    digest = hashlib.sha256(STANDIN.read_bytes()).hexdigest()
    assert {arch: entry["sha256"] for arch, entry in table.items()} == {"amd64": digest, "arm64": digest}


def test_standin_says_what_it_is() -> None:
    out = subprocess.run(
        [sys.executable, str(STANDIN), "--version"], capture_output=True, text=True, check=True
    )
    assert out.stdout.startswith("k3s version v1.33.4+standin1 ")
    assert "stand-in, not k3s" in out.stdout


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _config(tmp: Path, name: str, token_file: Path, **extra: object) -> Path:
    data = {
        "node-name": name,
        "node-ip": "127.0.0.1",
        "token-file": str(token_file),
        "data-dir": str(tmp / name),
        **extra,
    }
    path = tmp / (name + ".yaml")
    path.write_text("# Ansible managed\n" + json.dumps(data))
    return path


def _run(args: list[str], timeout: float = 20) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env.pop("NOTIFY_SOCKET", None)
    return subprocess.run(
        [sys.executable, str(STANDIN), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        check=False,
    )


@pytest.mark.slow
def test_server_and_agents_on_loopback(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("s3cret-token\n")
    token.chmod(0o600)
    wrong = tmp_path / "wrong"
    wrong.write_text("other\n")
    wrong.chmod(0o600)
    port = _free_port()
    kubeconfig = tmp_path / "k3s.yaml"
    server_cfg = _config(
        tmp_path,
        "s1",
        token,
        **{"https-listen-port": port, "bind-address": "127.0.0.1", "write-kubeconfig": str(kubeconfig)},
    )
    server = subprocess.Popen([sys.executable, str(STANDIN), "server", "--config", str(server_cfg)])
    try:
        deadline = time.monotonic() + 10
        while not (tmp_path / "s1" / "standin" / "server-started").exists():
            assert time.monotonic() < deadline, "server did not start"
            assert server.poll() is None, "server exited"
            time.sleep(0.1)
        assert oct(kubeconfig.stat().st_mode & 0o777) == "0o600"
        assert f"server: https://127.0.0.1:{port}" in kubeconfig.read_text()

        bad = _run(
            ["agent", "--config", str(_config(tmp_path, "a2", wrong, server=f"https://127.0.0.1:{port}"))]
        )
        assert bad.returncode == 1
        assert "refused the join" in bad.stderr

        good = subprocess.Popen(
            [
                sys.executable,
                str(STANDIN),
                "agent",
                "--config",
                str(_config(tmp_path, "a1", token, server=f"https://127.0.0.1:{port}")),
            ]
        )
        try:
            deadline = time.monotonic() + 10
            while not (tmp_path / "a1" / "standin" / "agent-started").exists():
                assert time.monotonic() < deadline, "agent did not join"
                time.sleep(0.1)
        finally:
            good.terminate()
            good.wait(5)
        joined = (tmp_path / "s1" / "standin" / "joined").read_text().split()
        assert joined[1:] == ["a1", "127.0.0.1"]
        assert "s3cret-token" not in (tmp_path / "s1" / "standin" / "joined").read_text()
    finally:
        server.terminate()
        server.wait(5)


def test_refuses_unsafe_token_file_and_inline_token(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("t\n")
    token.chmod(0o644)
    out = _run(["agent", "--config", str(_config(tmp_path, "a", token, server="https://127.0.0.1:1"))])
    assert out.returncode == 1
    assert "mode 0644" in out.stderr
    out = _run(["server", "--config", str(_config(tmp_path, "s", token, token="inline"))])
    assert out.returncode == 1
    assert "carries the token itself" in out.stderr
