"""Values from the inventory in systemd units: quoted by systemd's rules, control characters refused.

A unit file is line-based: a newline in an inventory value (a chat title, an extra argument of
llama-server) became a new directive of the unit, ``ExecStartPre=+...`` (run as root) included.
Every unit template quotes through ``llmfleet.cluster.systemd_quote`` (plugins/plugin_utils/
systemd_unit.py), and the roles' preflights name every such value before anything is written.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from ansible_collections.llmfleet.cluster.plugins.plugin_utils import systemd_unit

from tests.support.ansible_env import ansible_env
from tests.unit.roles.test_llama_rpc_templates import PLAN, directive, render

ROOT = Path(__file__).resolve().parents[3]
CHAT = ROOT / "roles" / "chat_ui"
INJECTION = "innocent\nExecStartPre=+/bin/sh -c 'id > /tmp/pwned'"


# ------------------------------------------------------------------------------ the quoting


@pytest.mark.parametrize(
    ("value", "mode", "quoted"),
    [
        ("--threads", "exec", "--threads"),
        (3, "exec", "3"),
        ("/opt/llmfleet/llama.cpp/current", "exec", "/opt/llmfleet/llama.cpp/current"),
        ("my model", "exec", '"my model"'),
        ("$HOME", "exec", '"$$HOME"'),
        ("50%", "exec", '"50%%"'),
        ('say "hi"', "exec", '"say \\"hi\\""'),
        ("back\\slash", "exec", '"back\\\\slash"'),
        (";", "exec", '";"'),
        ("", "exec", '""'),
        ("LLAMA_CACHE=/var/cache/a b$x", "env", '"LLAMA_CACHE=/var/cache/a b$x"'),
        ("llmfleet chat 100%", "line", "llmfleet chat 100%%"),
    ],
)
def test_values_are_quoted_by_systemd_rules(value, mode: str, quoted: str) -> None:
    assert systemd_unit.quote(value, mode) == quoted


@pytest.mark.parametrize("bad", ["a\nb", "a\rb", "tab\there", "nul\x00", "del\x7f", "c1\x85"])
def test_control_characters_are_refused_naming_the_value(bad: str) -> None:
    for mode in systemd_unit.MODES:
        with pytest.raises(systemd_unit.UnitValueError, match=r"chat_ui_title: .* control character U\+00"):
            systemd_unit.quote(bad, mode, name="chat_ui_title")


def test_the_executable_must_be_an_absolute_path() -> None:
    # systemd reads the prefixes of ExecStart's command ('+' runs it as root) before unquoting
    with pytest.raises(systemd_unit.UnitValueError, match="not an absolute path"):
        systemd_unit.quote("+/bin/sh", executable=True, name="chat_ui_python")
    assert systemd_unit.quote("/usr/bin/python3", executable=True) == "/usr/bin/python3"


def test_unsafe_names_every_variable_index_and_key() -> None:
    problems = systemd_unit.unsafe(
        {
            "chat_ui_title": "ok",
            "llama_rpc_server_extra_args": ["--alias", "a\nb"],
            "plan": {"model": {"name": "x\r"}},
        }
    )
    assert problems == [
        "llama_rpc_server_extra_args[1]='a\\nb' has a control character U+000A at position 1",
        "plan.model.name='x\\r' has a control character U+000D at position 1",
    ]
    assert systemd_unit.unsafe({"a": "fine", "b": [1, "two"], "c": None}) == []


# ------------------------------------------------------------------------- the unit templates


def test_a_newline_in_an_extra_argument_never_becomes_a_line_of_the_head_unit() -> None:
    with pytest.raises(Exception, match=r"llama_rpc_server_extra_args\[1\].*control character U\+000A"):
        unit = render(
            "systemd/llmfleet-llama-server.service.j2",
            "head1",
            {"llama_rpc_server_extra_args": ["--alias", INJECTION]},
        )
        # the old template: the value's second line is a directive of its own
        assert not directive(unit, "ExecStartPre"), unit


def test_extra_arguments_are_quoted_in_the_head_unit() -> None:
    unit = render(
        "systemd/llmfleet-llama-server.service.j2",
        "head1",
        {
            "llama_rpc_server_extra_args": [
                "--alias",
                "my model",
                "--chat-template-kwargs",
                '{"a": "$HOME 5%"}',
            ]
        },
    )
    (exec_start,) = directive(unit, "ExecStart")
    assert exec_start.endswith(
        ' --metrics --log-verbosity 4 --alias "my model" --chat-template-kwargs "{\\"a\\": \\"$$HOME 5%%\\"}"'
    ), exec_start


@pytest.mark.parametrize(
    ("template", "host", "extra", "named"),
    [
        ("systemd/llmfleet-rpc-server.service.j2", "w1", {"llama_rpc_user": INJECTION}, "llama_rpc_user"),
        (
            "systemd/llmfleet-rpc-server.service.j2",
            "w1",
            {"llama_rpc_cache_root": INJECTION},
            "llama_rpc_cache_root",
        ),
        (
            "systemd/llmfleet-llama-server.service.j2",
            "head1",
            {"llmfleet_plan": {**PLAN, "model": {"name": INJECTION, "file": "tiny.gguf"}}},
            "the plan model name",
        ),
        (
            "systemd/llmfleet-firewall.service.j2",
            "w1",
            {"llama_rpc_config_dir": INJECTION},
            "llama_rpc_config_dir",
        ),
    ],
)
def test_every_llama_rpc_unit_refuses_a_control_character(
    template: str, host: str, extra: dict, named: str
) -> None:
    with pytest.raises(Exception, match=f"{named}: .*control character U\\+000A"):
        text = render(template, host, extra)
        assert "\nExecStartPre=+" not in text, text


def _chat_vars(extra: dict) -> dict:
    return {"chat_ui_password": "correct horse battery", "chat_ui_target": "systemd", **extra}


def test_a_newline_in_the_chat_title_never_becomes_a_line_of_the_chat_unit() -> None:
    good = render(
        "systemd/llmfleet-chat.service.j2", "head1", _chat_vars({"chat_ui_title": 'Our "fleet" 100%'}), CHAT
    )
    assert '--title "Our \\"fleet\\" 100%%"' in good
    with pytest.raises(Exception, match=r"chat_ui_title: .*control character U\+000A"):
        text = render(
            "systemd/llmfleet-chat.service.j2", "head1", _chat_vars({"chat_ui_title": INJECTION}), CHAT
        )
        assert "\nExecStartPre=+" not in text, text


# ------------------------------------------------------------------------ the preflights (input)


def _preflight(tmp_path: Path, role: str, variables: dict) -> subprocess.CompletedProcess:
    playbook = tmp_path / "preflight.yml"
    playbook.write_text(
        json.dumps(
            [
                {
                    "hosts": "head1",
                    "gather_facts": False,
                    "tasks": [{"ansible.builtin.include_role": {"name": role, "tasks_from": "preflight"}}],
                }
            ]
        )
    )
    (tmp_path / "vars.json").write_text(json.dumps(variables))
    inventory = tmp_path / "hosts.yml"
    inventory.write_text("all:\n  hosts:\n    head1:\n      ansible_connection: local\n")
    return subprocess.run(
        ["ansible-playbook", "-i", str(inventory), "-e", f"@{tmp_path / 'vars.json'}", str(playbook)],
        capture_output=True,
        text=True,
        env=ansible_env(),
        cwd=ROOT,
        timeout=300,
        check=False,
    )


needs_playbook = pytest.mark.skipif(
    shutil.which("ansible-playbook") is None
    and not os.path.exists(ROOT / ".venv" / "bin" / "ansible-playbook"),
    reason="ansible-playbook not on PATH",
)


@needs_playbook
def test_the_llama_rpc_preflight_names_the_variable_and_the_host(tmp_path: Path) -> None:
    proc = _preflight(
        tmp_path,
        "llmfleet.cluster.llama_rpc",
        {
            "llmfleet_plan": PLAN,
            "llmfleet_wireguard": False,
            "llama_rpc_server_extra_args": ["--alias", INJECTION],
        },
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    assert "head1: llama_rpc_server_extra_args[1]=" in out
    assert "control character U+000A" in out


@needs_playbook
def test_the_chat_ui_preflight_names_the_variable_and_the_host(tmp_path: Path) -> None:
    proc = _preflight(tmp_path, "llmfleet.cluster.chat_ui", _chat_vars({"chat_ui_title": INJECTION}))
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    assert "head1: chat_ui_title=" in out
    assert "control character U+000A" in out
    clean = _preflight(tmp_path, "llmfleet.cluster.chat_ui", _chat_vars({"chat_ui_title": "llmfleet chat"}))
    assert clean.returncode == 0, clean.stdout + clean.stderr
