"""The k3s role's pinned install on the controller itself (ansible_connection=local), no container.

Runs the role's preflight and install tags against the stand-in served by tests.support's HTTP
mirror on loopback, into a temporary directory: a good build installs and the symlink points at
it; a build whose pinned sha256 does not match fails naming both hashes, leaves no directory of
its own and keeps the symlink on the previous build; a build missing from the table is refused
before anything is downloaded.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.support.http_mirror import HttpMirror

ROOT = Path(__file__).resolve().parents[3]
STANDIN = ROOT / "tests" / "fixtures" / "k3s" / "k3s-standin"

pytestmark = pytest.mark.slow


def _playbook(tmp: Path, url: str, version: str) -> subprocess.CompletedProcess:
    good = hashlib.sha256(STANDIN.read_bytes()).hexdigest()
    inventory = {
        "all": {
            "children": {
                "k3s_server": {
                    "hosts": {
                        "drill": {
                            "ansible_connection": "local",
                            "ansible_python_interpreter": shutil.which("python3") or "/usr/bin/python3",
                            "llmfleet_host": {"kube_arch": "amd64", "isa": [], "memory": {"usable_mib": 100}},
                            "k3s_node_ip": "127.0.0.1",
                            "k3s_install_dir": str(tmp / "opt"),
                            "k3s_bin_path": str(tmp / "bin" / "k3s"),
                            "k3s_releases": {
                                "good": {"amd64": {"url": url, "sha256": good}},
                                "bad": {"amd64": {"url": url, "sha256": "ab" * 32}},
                            },
                        }
                    }
                }
            }
        }
    }
    (tmp / "inventory.yml").write_text(yaml.safe_dump(inventory))
    (tmp / "play.yml").write_text(
        "- name: Install\n  hosts: all\n  gather_facts: false\n  roles:\n    - role: llmfleet.cluster.k3s\n"
    )
    env = dict(os.environ, ANSIBLE_CALLBACK_RESULT_FORMAT="json", ANSIBLE_NOCOLOR="1")
    env.pop("ANSIBLE_LOG_PATH", None)
    return subprocess.run(
        [
            "ansible-playbook",
            "-i",
            str(tmp / "inventory.yml"),
            str(tmp / "play.yml"),
            "--tags",
            "k3s_preflight,k3s_install",
            "-e",
            f"k3s_version={version}",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=600,
        check=False,
    )


@pytest.mark.skipif(shutil.which("ansible-playbook") is None, reason="ansible-playbook not on PATH")
def test_pinned_install_wrong_hash_and_missing_entry(tmp_path: Path) -> None:
    served = tmp_path / "mirror"
    served.mkdir()
    shutil.copy(STANDIN, served / "k3s")
    (tmp_path / "bin").mkdir()
    with HttpMirror(str(served)) as mirror:
        url = mirror.url_for("k3s")
        ok = _playbook(tmp_path, url, "good")
        assert ok.returncode == 0, ok.stdout[-3000:]
        link = tmp_path / "bin" / "k3s"
        assert os.readlink(link) == str(tmp_path / "opt" / "good" / "k3s")
        version = subprocess.run([str(link), "--version"], capture_output=True, text=True, check=True)
        assert "stand-in" in version.stdout

        again = _playbook(tmp_path, url, "good")
        assert again.returncode == 0
        assert re.search(r"^drill\s+: ok=\d+\s+changed=0\s", again.stdout, re.M), again.stdout[-1000:]

        bad = _playbook(tmp_path, url, "bad")
        assert bad.returncode != 0
        good = hashlib.sha256(STANDIN.read_bytes()).hexdigest()
        assert "host drill: k3s bad (amd64)" in bad.stdout
        assert "ab" * 32 in bad.stdout and good in bad.stdout  # expected and actual
        assert not (tmp_path / "opt" / "bad").exists()
        assert os.readlink(link) == str(tmp_path / "opt" / "good" / "k3s")

        requests_before = len(mirror.requests)
        missing = _playbook(tmp_path, url, "v9.9.9")
        assert missing.returncode != 0
        assert "host drill: k3s_releases has no url + sha256" in missing.stdout
        assert "v9.9.9" in missing.stdout
        assert len(mirror.requests) == requests_before  # refused before any download
