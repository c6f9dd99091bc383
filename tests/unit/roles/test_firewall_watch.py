"""The firewall unit's watcher (roles/llama_rpc/files/llmfleet_firewall.py) against the real nft.

In a network namespace of its own (``unshare -rn``): the ruleset the role renders is loaded, then
flushed the way Debian's nftables.service does (``nft flush ruleset``), its chain flushed, its
rule deleted; each time the table must be back (the rpc port dropped again) within a second. A
ruleset that does not load, or one put back too often, ends the watcher with status 1 (its unit
fails, and systemd stops rpc-server with it: BindsTo=); SIGTERM ends it with 0.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.support.process_group import run_group
from tests.unit.roles.test_llama_rpc_templates import render

ROOT = Path(__file__).resolve().parents[3]
WATCHER = ROOT / "roles" / "llama_rpc" / "files" / "llmfleet_firewall.py"


def _namespaces_work() -> bool:
    if not shutil.which("unshare") or not shutil.which("nft"):
        return False
    proc = subprocess.run(
        ["unshare", "-rn", "nft", "list", "ruleset"], capture_output=True, check=False, timeout=20
    )
    return proc.returncode == 0


pytestmark = pytest.mark.skipif(not _namespaces_work(), reason="needs unshare -rn and nft")


def run_in_namespace(script: str, tmp_path: Path, timeout: float = 30) -> subprocess.CompletedProcess:
    path = tmp_path / "scenario.sh"
    path.write_text(textwrap.dedent(script))
    return run_group(["unshare", "-rn", "sh", "-eu", str(path)], timeout)


def test_a_flushed_or_edited_table_is_put_back_at_once(tmp_path: Path) -> None:
    ruleset = tmp_path / "firewall.nft"
    ruleset.write_text(render("systemd/firewall.nft.j2", "w1"))
    proc = run_in_namespace(
        f"""
        state() {{ nft -s list table inet llmfleet 2>/dev/null | md5sum; }}
        loads() {{ grep -c 'again$' {tmp_path}/watch.log || true; }}
        # back: the table as loaded, and the watcher says it loaded it again (the n-th time)
        wait_back() {{
            i=0
            while {{ [ "$(state)" != "$initial" ] || [ "$(loads)" -lt "$2" ]; }} && [ $i -lt 40 ]; do
                sleep 0.05; i=$((i+1))
            done
            echo "$1 back after $i"
        }}
        {sys.executable} {WATCHER} --nft "$(command -v nft)" {ruleset} 2>{tmp_path}/watch.log &
        pid=$!
        trap 'kill -TERM $pid 2>/dev/null || true' EXIT
        i=0; while ! grep -q watching {tmp_path}/watch.log && [ $i -lt 100 ]; do sleep 0.1; i=$((i+1)); done
        initial=$(state)
        nft -s list table inet llmfleet | grep -c 'dport 50052 counter drop' | sed 's/^/drops /'
        nft flush ruleset; wait_back flush-ruleset 1
        nft flush chain inet llmfleet input; wait_back flush-chain 2
        nft insert rule inet llmfleet input tcp dport 50052 accept; wait_back accept-inserted 3
        nft delete table inet llmfleet; wait_back delete-table 4
        nft -s list table inet llmfleet | grep -c 'dport 50052 counter drop' | sed 's/^/final drops /'
        kill -TERM $pid; set +e; wait $pid; echo "exit $?"
        """,
        tmp_path,
    )
    log = (tmp_path / "watch.log").read_text() if (tmp_path / "watch.log").exists() else ""
    print(proc.stdout, log)
    assert proc.returncode == 0, proc.stdout + proc.stderr + log
    lines = proc.stdout.split("\n")
    assert "drops 1" in lines
    for step in ("flush-ruleset", "flush-chain", "accept-inserted", "delete-table"):
        (line,) = [x for x in lines if x.startswith(step)]
        assert int(line.rsplit(" ", 1)[1]) < 40, f"{step}: the table was not back within 2 s: {log}"
    assert "final drops 1" in lines
    assert "exit 0" in lines


def test_a_ruleset_that_does_not_load_fails_the_unit(tmp_path: Path) -> None:
    ruleset = tmp_path / "firewall.nft"
    ruleset.write_text("table inet llmfleet { this is not nftables }\n")
    proc = run_in_namespace(
        f"""
        set +e
        {sys.executable} {WATCHER} --nft "$(command -v nft)" {ruleset}
        echo "exit $?"
        """,
        tmp_path,
    )
    assert "exit 1" in proc.stdout, proc.stdout + proc.stderr
    assert "nft -f" in proc.stderr and "failed" in proc.stderr


def test_a_table_removed_again_and_again_fails_the_unit(tmp_path: Path) -> None:
    ruleset = tmp_path / "firewall.nft"
    ruleset.write_text(render("systemd/firewall.nft.j2", "w1"))
    proc = run_in_namespace(
        f"""
        {sys.executable} {WATCHER} --nft "$(command -v nft)" --max-reloads 3 {ruleset} 2>{tmp_path}/watch.log &
        pid=$!
        trap 'kill -TERM $pid 2>/dev/null || true' EXIT
        i=0; while ! grep -q watching {tmp_path}/watch.log && [ $i -lt 100 ]; do sleep 0.1; i=$((i+1)); done
        for n in 1 2 3 4 5 6; do nft flush ruleset; sleep 0.2; done
        set +e; wait $pid; echo "exit $?"
        """,
        tmp_path,
    )
    log = (tmp_path / "watch.log").read_text()
    assert "exit 1" in proc.stdout, proc.stdout + proc.stderr + log
    assert "giving up" in log
