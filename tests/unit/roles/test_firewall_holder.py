"""The firewall unit's own commands, run against the real kernel in a network namespace.

Issue #31 item 3: the table must not fail open. The rendered llmfleet-firewall.service's
ExecStartPre=, ExecStart= and ExecStartPost= are taken from the unit as systemd would run them
(quotes split, `$$` made `$`) and run in a fresh network namespace (`unshare -n`), with a real
listener on the rpc port behind the table: after `nft flush ruleset` the port still drops, a
foreign `nft delete table` is refused, and the table goes when the unit's process ends. With
main's oneshot `nft -f` unit the flush removed the table and the port opened.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

from tests.unit.roles.test_llama_rpc_templates import directive, render

pytestmark = pytest.mark.skipif(
    not shutil.which("nft")
    or not shutil.which("unshare")
    or os.geteuid() != 0
    or subprocess.run(["unshare", "-n", "true"], capture_output=True, check=False).returncode != 0,
    reason="needs nft, root and unshare -n",
)

PORT = 50052  # w1's port in the templates' plan; the head is 10.9.0.2, so loopback is not admitted


def systemd_argv(value: str) -> list[str]:
    """An Exec line's command as systemd runs it: quotes split, `$$` a literal `$`."""
    assert "%" not in value, value  # no specifiers in these lines
    return [word.replace("$$", "$") for word in shlex.split(value)]


def unit_commands(tmp_path: Path, table: str | None = None) -> dict[str, str]:
    """The unit's start commands as shell words, reading the table from tmp_path/firewall.nft."""
    unit = render("systemd/llmfleet-firewall.service.j2", "w1", {"llama_rpc_config_dir": str(tmp_path)})
    (tmp_path / "firewall.nft").write_text(
        table if table is not None else render("systemd/firewall.nft.j2", "w1")
    )
    (tmp_path / "run").mkdir()
    commands = {}
    for key in ("ExecStartPre", "ExecStart", "ExecStartPost"):
        (value,) = directive(unit, key)
        commands[key] = shlex.join(systemd_argv(value))
    assert str(tmp_path / "firewall.nft") in commands["ExecStart"]
    return commands


def in_namespace(tmp_path: Path, script: str, **commands: str) -> subprocess.CompletedProcess:
    """Run a bash script in a new network namespace (loopback up, a listener on PORT)."""
    prologue = f"""
set -u
export RUNTIME_DIRECTORY={shlex.quote(str(tmp_path / "run"))}
ip link set lo up
python3 -c 'import socket, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", {PORT})); s.listen(8); time.sleep(60)' >/dev/null 2>&1 &
probe() {{ python3 -c 'import socket
try:
    socket.create_connection(("127.0.0.1", {PORT}), timeout=1).close(); print("open")
except OSError as e:
    print("closed", type(e).__name__)'; }}
sleep 0.3
"""
    for name, command in commands.items():
        # start runs in the background: exec, so that its pid is the holder's (systemd's MainPID)
        prologue += f"{name}() {{ {'exec ' if name == 'start' else ''}{command}; }}\n"
    # Its own session: whatever it leaves running (the listener, a holder) is killed with it.
    proc = subprocess.Popen(
        ["unshare", "-n", "bash", "-c", prologue + script],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=60)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def test_the_table_survives_a_flush_and_a_foreign_delete_and_goes_with_the_unit(tmp_path: Path) -> None:
    c = unit_commands(tmp_path)
    proc = in_namespace(
        tmp_path,
        """
echo "before: $(probe)"
pre || { echo "pre failed"; exit 1; }
start >"$RUNTIME_DIRECTORY/../holder.log" 2>&1 & holder=$!
post; echo "post rc=$?"
echo "loaded: $(probe)"
nft flush ruleset
echo "after flush: $(probe)"
nft list table inet llmfleet | grep -c 'counter .* drop' | sed 's/^/drop rules after flush: /'
nft delete table inet llmfleet 2>/dev/null; echo "foreign delete rc=$?"
echo "after foreign delete: $(probe)"
kill "$holder"; wait "$holder"
nft list table inet llmfleet >/dev/null 2>&1; echo "table after the holder ended rc=$?"
echo "after the holder ended: $(probe)"
""",
        pre=c["ExecStartPre"],
        start=c["ExecStart"],
        post=c["ExecStartPost"],
    )
    out = proc.stdout
    print(out, proc.stderr)
    assert "before: open" in out
    assert "post rc=0" in out
    assert "loaded: closed TimeoutError" in out
    assert "after flush: closed TimeoutError" in out, out  # main's oneshot `nft -f`: open
    assert "drop rules after flush: 1" in out
    assert "foreign delete rc=1" in out
    assert "after foreign delete: closed" in out
    assert "table after the holder ended rc=1" in out
    assert "after the holder ended: open" in out


@pytest.mark.parametrize(
    "bad",
    [
        "add table inet llmfleet { flags owner; } ; add chain inet llmfleet input { nonsense }",
        # parsed, refused by the kernel on its last command: nothing of the line may stay
        "add table inet llmfleet { flags owner; } ; add chain inet llmfleet input"
        " { type filter hook input priority filter; policy accept; } ;"
        f" add rule inet llmfleet input tcp dport {PORT} counter drop ; add rule inet llmfleet input jump nosuch",
    ],
)
def test_a_table_that_does_not_load_is_never_ready(tmp_path: Path, bad: str) -> None:
    c = unit_commands(tmp_path, table=f"# broken\n{bad}\n")
    proc = in_namespace(
        tmp_path,
        """
pre; start >"$RUNTIME_DIRECTORY/../holder.log" 2>&1 & holder=$!
post; echo "post rc=$?"
nft list table inet llmfleet >/dev/null 2>&1; echo "table rc=$?"
kill "$holder"
""",
        pre=c["ExecStartPre"],
        start=c["ExecStart"],
        post=c["ExecStartPost"],
    )
    print(proc.stdout, proc.stderr)
    # ExecStartPost= fails: the unit fails, and rpc-server (Requires=) never starts
    assert "post rc=1" in proc.stdout
    assert "table rc=1" in proc.stdout
    assert "did not load" in proc.stderr


def test_a_table_left_without_owner_is_replaced_by_an_owned_one(tmp_path: Path) -> None:
    # what main's oneshot unit left loaded (`nft -f`, no owner): an upgrade replaces it
    c = unit_commands(tmp_path)
    proc = in_namespace(
        tmp_path,
        """
nft add table inet llmfleet
pre; echo "pre rc=$?"
start >"$RUNTIME_DIRECTORY/../holder.log" 2>&1 & holder=$!
post; echo "post rc=$?"
nft flush ruleset
echo "after flush: $(probe)"
kill "$holder"
""",
        pre=c["ExecStartPre"],
        start=c["ExecStart"],
        post=c["ExecStartPost"],
    )
    print(proc.stdout, proc.stderr)
    assert "pre rc=0" in proc.stdout
    assert "post rc=0" in proc.stdout
    assert "after flush: closed" in proc.stdout


def test_a_table_another_process_owns_fails_the_start(tmp_path: Path) -> None:
    c = unit_commands(tmp_path)
    proc = in_namespace(
        tmp_path,
        """
(echo 'add table inet llmfleet { flags owner; }'; sleep 20) | nft -i >/dev/null 2>&1 & sleep 0.5
pre; echo "pre rc=$?"
""",
        pre=c["ExecStartPre"],
    )
    print(proc.stdout, proc.stderr)
    assert "pre rc=1" in proc.stdout
