"""The llama_rpc role's rendered systemd units and nftables ruleset, checked by the real tools.

The templates are rendered with Ansible's own templar from the role's defaults and vars (plan
values from a small plan), then `systemd-analyze verify` checks the units and `nft -c -f`
checks the ruleset (both skip when the tool is missing on this machine).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from ansible_collections.llmfleet.cluster.plugins.plugin_utils import targets

from tests.support.ansible_env import load_collection_plugins
from tests.support.fleet_lookup import inline_fleet_lookups

ROOT = Path(__file__).resolve().parents[3]
ROLE = ROOT / "roles" / "llama_rpc"

PLAN = {
    "head": "head1",
    "workers": ["w1", "w2"],
    "model": {"name": "tiny", "file": "tiny.gguf"},
    "llama_server_args": ["--rpc", "10.9.0.3:50052,10.9.0.4:50053"],
    "hosts": [
        {"name": "head1", "role": "head", "address": "10.9.0.2", "endpoint": None, "threads": 4},
        {"name": "w1", "role": "worker", "address": "10.9.0.3", "port": 50052, "endpoint": "10.9.0.3:50052"},
        {"name": "w2", "role": "worker", "address": "10.9.0.4", "port": 50053, "threads": 3},
    ],
}


def _trusted(value):
    """Mark strings as templates, the way Ansible treats a role's defaults and vars files."""
    try:
        from ansible.template import trust_as_template  # ansible-core >= 2.19
    except ImportError:  # pragma: no cover - older ansible-core trusts every string
        return value
    if isinstance(value, str):
        return trust_as_template(value)
    if isinstance(value, dict):
        return {k: _trusted(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_trusted(v) for v in value]
    return value


def render(template: str, host: str, extra: dict | None = None, role: Path = ROLE) -> str:
    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar

    load_collection_plugins()

    variables: dict = {}
    variables.update(
        _trusted(yaml.safe_load(inline_fleet_lookups((role / "defaults" / "main.yml").read_text())))
    )
    variables.update(_trusted(yaml.safe_load(inline_fleet_lookups((role / "vars" / "main.yml").read_text()))))
    variables.update(
        {
            "llmfleet_plan": PLAN,
            "llmfleet_host": {"cpus": 2},
            "inventory_hostname": host,
            "ansible_managed": "Ansible managed",
            "_llama_rpc_worker_binary_path": "/opt/llmfleet/llama.cpp/current/ggml-rpc-server",
            # The LAN mode; the WireGuard tests below turn it on.
            "llmfleet_wireguard": False,
            # What lookup('llmfleet.cluster.target', ...) returns (a bare Templar loads no
            # collection plugin): the registry's own entry for the systemd target.
            "_llama_rpc_server": targets.resolve("systemd"),
        }
    )
    variables.update(extra or {})
    templar = Templar(loader=DataLoader(), variables=variables)
    return templar.template(_trusted((role / "templates" / template).read_text()))


def directive(text: str, key: str) -> list[str]:
    return [line.split("=", 1)[1] for line in text.splitlines() if line.startswith(key + "=")]


def test_worker_unit_binds_the_plan_address_port_threads_and_hardens() -> None:
    unit = render("systemd/llmfleet-rpc-server.service.j2", "w2")
    (exec_start,) = directive(unit, "ExecStart")
    assert exec_start.split() == [
        "/opt/llmfleet/llama.cpp/current/ggml-rpc-server",
        "--host",
        "10.9.0.4",
        "--port",
        "50053",
        "--threads",
        "3",
        "--cache",
    ]
    assert directive(unit, "User") == ["llmfleet"]
    assert directive(unit, "ReadWritePaths") == ["/var/cache/llmfleet/rpc"]
    assert "GGML_NO_BACKTRACE=1" in directive(unit, "Environment")
    for key in ("NoNewPrivileges", "ProtectSystem", "ProtectHome", "PrivateTmp"):
        assert directive(unit, key), key
    assert directive(unit, "ProtectSystem") == ["strict"]


def test_worker_threads_fall_back_to_the_probe_when_the_plan_has_none() -> None:
    unit = render("systemd/llmfleet-rpc-server.service.j2", "w1", {"llmfleet_host": {"cpus": 6}})
    assert "--threads 6" in directive(unit, "ExecStart")[0]


def test_head_unit_runs_the_supervisor_with_key_file_and_metrics() -> None:
    unit = render("systemd/llmfleet-llama-server.service.j2", "head1")
    (exec_start,) = directive(unit, "ExecStart")
    args = exec_start.split()
    tail = args[args.index("--") + 1 :]
    assert tail == [
        "-m",
        "/var/lib/llmfleet/models/tiny.gguf",
        "--host",
        "0.0.0.0",
        "--port",
        "8080",
        "--api-key-file",
        "/etc/llmfleet/api-key",
        "--metrics",
    ]
    assert "--api-key" not in args
    assert args[args.index("--plan") + 1] == "/etc/llmfleet/plan.json"
    assert directive(unit, "KillMode") == ["mixed"]


def nft_rules(ruleset: str) -> list[str]:
    """The rules of the one command line (the firewall unit's `nft -i` reads a line per transaction)."""
    (line,) = [line for line in ruleset.splitlines() if line.strip() and not line.startswith("#")]
    prefix = "add rule inet llmfleet input "
    return [c.removeprefix(prefix) for c in line.split(" ; ") if c.startswith(prefix)]


def test_firewall_admits_only_the_head() -> None:
    ruleset = render("systemd/firewall.nft.j2", "w1")
    assert nft_rules(ruleset) == ["tcp dport 50052 ip saddr 10.9.0.2 accept", "tcp dport 50052 counter drop"]
    # one transaction, the table owned by the nft process that loads it (the firewall unit's)
    assert ruleset.splitlines()[-1].startswith("add table inet llmfleet { flags owner; } ; add chain")


# WireGuard: the plan's worker addresses are tunnel addresses; the head's tunnel address comes from
# the fact llmfleet.cluster.wireguard set on the head (its plan address stays its LAN address).
TUNNEL = {
    "llmfleet_wireguard": True,
    "hostvars": {"head1": {"llmfleet_wireguard_address": "10.213.0.9"}},
}


def test_firewall_admits_only_the_heads_tunnel_address_on_the_tunnel() -> None:
    ruleset = render("systemd/firewall.nft.j2", "w1", TUNNEL)
    assert nft_rules(ruleset) == [
        'iifname "llmfleet" tcp dport 50052 ip saddr 10.213.0.9 accept',
        "tcp dport 50052 counter drop",
    ]
    assert "10.9.0.2" not in ruleset


def test_worker_unit_waits_for_the_tunnel() -> None:
    unit = render("systemd/llmfleet-rpc-server.service.j2", "w1", TUNNEL)
    assert "wg-quick@llmfleet.service" in directive(unit, "After")[0].split()
    assert "wg-quick@llmfleet.service" in directive(unit, "Wants")[0].split()
    lan = render("systemd/llmfleet-rpc-server.service.j2", "w1")
    assert "wg-quick" not in lan


@pytest.mark.skipif(not shutil.which("nft") or os.geteuid() != 0, reason="needs nft and root")
def test_tunnel_firewall_ruleset_passes_nft_check(tmp_path: Path) -> None:
    path = tmp_path / "firewall.nft"
    path.write_text(render("systemd/firewall.nft.j2", "w2", TUNNEL))
    proc = subprocess.run(["nft", "-c", "-f", str(path)], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.skipif(not shutil.which("nft") or os.geteuid() != 0, reason="needs nft and root")
def test_firewall_ruleset_passes_nft_check(tmp_path: Path) -> None:
    path = tmp_path / "firewall.nft"
    path.write_text(render("systemd/firewall.nft.j2", "w2"))
    proc = subprocess.run(["nft", "-c", "-f", str(path)], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.skipif(not shutil.which("systemd-analyze"), reason="needs systemd-analyze")
@pytest.mark.parametrize(
    ("template", "host"),
    [
        ("systemd/llmfleet-rpc-server.service.j2", "w1"),
        ("systemd/llmfleet-llama-server.service.j2", "head1"),
        ("systemd/llmfleet-firewall.service.j2", "w1"),
    ],
)
def test_units_pass_systemd_analyze_verify(tmp_path: Path, template: str, host: str) -> None:
    # Point the executables at files that exist here, keep everything else as rendered.
    binary = tmp_path / "bin"
    binary.mkdir()
    for name in ("ggml-rpc-server", "llama-server"):
        (binary / name).write_text("#!/bin/sh\n")
        (binary / name).chmod(0o755)
    text = render(
        template,
        host,
        {
            "_llama_rpc_worker_binary_path": str(binary / "ggml-rpc-server"),
            "llama_rpc_llama_cpp_dir": str(binary),
        },
    )
    unit = tmp_path / Path(template).name.removesuffix(".j2")
    unit.write_text(text)
    # rpc-server requires its firewall unit (Requires=, BindsTo=): verified side by side
    firewall = tmp_path / "llmfleet-firewall.service"
    firewall.write_text(render("systemd/llmfleet-firewall.service.j2", host))
    proc = subprocess.run(
        ["systemd-analyze", "verify", "--man=no", str(unit), *([str(firewall)] if unit != firewall else [])],
        capture_output=True,
        text=True,
        check=False,
    )
    problems = [
        line
        for line in (proc.stdout + proc.stderr).splitlines()
        if line.strip() and "Failed to open" not in line and "Unit " not in line
    ]
    assert proc.returncode == 0 and not problems, proc.stdout + proc.stderr


# The firewall must not fail open (issue #31): rpc-server runs only while its firewall unit runs, the
# firewall unit keeps its table loaded, and systemd itself admits the one peer.


def test_rpc_server_runs_only_while_its_firewall_unit_runs() -> None:
    unit = render("systemd/llmfleet-rpc-server.service.j2", "w1")
    # Requires=: a table that failed to load keeps rpc-server down; BindsTo=: the firewall unit
    # stopping or failing stops rpc-server (After=: stopped before the table goes)
    assert directive(unit, "Requires") == ["llmfleet-firewall.service"]
    assert directive(unit, "BindsTo") == ["llmfleet-firewall.service"]
    assert "llmfleet-firewall.service" in directive(unit, "After")[0].split()
    off = render("systemd/llmfleet-rpc-server.service.j2", "w1", {"llama_rpc_firewall": False})
    assert not directive(off, "Requires") and not directive(off, "BindsTo")


@pytest.mark.parametrize(("extra", "peer"), [({}, "10.9.0.2"), (TUNNEL, "10.213.0.9")])
def test_systemd_itself_admits_only_the_head(extra: dict, peer: str) -> None:
    for firewall in (True, False):
        unit = render(
            "systemd/llmfleet-rpc-server.service.j2", "w2", {**extra, "llama_rpc_firewall": firewall}
        )
        assert directive(unit, "IPAddressDeny") == ["any"]
        assert directive(unit, "IPAddressAllow") == [peer]


def test_the_firewall_unit_holds_the_table_before_rpc_server() -> None:
    unit = render("systemd/llmfleet-firewall.service.j2", "w1")
    # a long-running nft -i reading the table's file (test_firewall_holder.py runs these lines)
    assert directive(unit, "Type") == ["simple"]
    (start,) = directive(unit, "ExecStart")
    assert "exec /usr/sbin/nft -i" in start and start.endswith(" /etc/llmfleet/firewall.nft")
    assert len(directive(unit, "ExecStartPost")) == 1
    assert not directive(unit, "ExecReload")  # a changed table: a restart, rpc-server with it
    assert "llmfleet-rpc-server.service" in directive(unit, "Before")[0].split()
    worker = render("systemd/llmfleet-rpc-server.service.j2", "w1")
    assert directive(worker, "PartOf") == ["llmfleet-firewall.service"]


def test_a_measuring_rpc_server_stops_by_itself() -> None:
    unit = render("systemd/llmfleet-rpc-server.service.j2", "w1", {"_llama_rpc_runtime_max_sec": 1800})
    assert directive(unit, "RuntimeMaxSec") == ["1800"]
    assert "RuntimeMaxSec" not in render("systemd/llmfleet-rpc-server.service.j2", "w1")


def test_every_unit_the_vars_name_has_its_template() -> None:
    """The unit tasks install ``systemd/<unit>.j2`` for each of ``_llama_rpc_units`` (the one home of
    the unit names): a renamed unit without its template fails here, not on a host."""
    units = yaml.safe_load((ROLE / "vars" / "main.yml").read_text())["_llama_rpc_units"]
    assert set(units) == {"head", "worker", "firewall"}
    for unit in units.values():
        assert (ROLE / "templates" / "systemd" / (unit + ".j2")).is_file(), unit
    tasks = "".join(p.read_text() for p in (ROLE / "tasks").glob("*.yml"))
    assert "service.j2" not in tasks  # no task names a unit's template by hand


def _gpu_plan() -> dict:
    """A plan from the planner: the CPU NAS heads, the NVIDIA desktop serves Vulkan0 and its CPU."""
    from ansible_collections.llmfleet.cluster.plugins.module_utils import hostinfo
    from ansible_collections.llmfleet.cluster.plugins.plugin_utils import placement as P

    from tests.support.host_trees import recorded_hosts
    from tests.unit.plugins.plugin_utils.test_placement import layout

    root = recorded_hosts()
    nas = P.host_from_fact("nas", hostinfo.probe(str(root / "celeron-nas")), address="10.9.0.2")
    desktop = P.host_from_fact("desktop", hostinfo.probe(str(root / "rtx3060-desktop")), address="10.9.0.3")
    plan = P.plan_llama_cpp(layout(n_layer=60, layer_mib=300), nas, [desktop])
    return {**plan, "model": {"name": "big", "file": "big.gguf"}}


GPU = {"llama_rpc_env": {"GGML_VK_VISIBLE_DEVICES": "0"}, "llama_cpp_flavour": "ubuntu-vulkan-x64"}


def test_a_gpu_worker_serves_its_planned_devices_with_their_nodes(tmp_path: Path) -> None:
    unit = render("systemd/llmfleet-rpc-server.service.j2", "desktop", {"llmfleet_plan": _gpu_plan(), **GPU})
    (exec_start,) = directive(unit, "ExecStart")
    assert exec_start.split()[-3:] == ["--cache", "-d", "Vulkan0,CPU"]
    assert "GGML_VK_VISIBLE_DEVICES=0" in directive(unit, "Environment")
    assert directive(unit, "PrivateDevices") == ["false"]
    assert directive(unit, "DevicePolicy") == ["closed"]
    assert "char-drm rw" in directive(unit, "DeviceAllow")
    # every other hardening line stays
    for key in ("NoNewPrivileges", "ProtectSystem", "ProtectKernelModules", "IPAddressDeny"):
        assert directive(unit, key), key
    if shutil.which("systemd-analyze"):
        path = tmp_path / "llmfleet-rpc-server.service"
        path.write_text(unit.replace("/opt/llmfleet/llama.cpp/current/ggml-rpc-server", "/bin/true"))
        proc = subprocess.run(
            ["systemd-analyze", "verify", "--man=no", str(path)], capture_output=True, text=True, check=False
        )
        assert not [
            line
            for line in (proc.stdout + proc.stderr).splitlines()
            if "Device" in line or "Environment" in line or "ExecStart" in line
        ], proc.stderr


def test_a_cpu_head_of_a_gpu_fleet_keeps_private_devices() -> None:
    unit = render("systemd/llmfleet-llama-server.service.j2", "nas", {"llmfleet_plan": _gpu_plan(), **GPU})
    assert directive(unit, "PrivateDevices") == ["true"]
    assert not directive(unit, "DeviceAllow")
    assert "GGML_VK_VISIBLE_DEVICES=0" in directive(unit, "Environment")


def test_a_cpu_plan_renders_todays_worker_line_and_sandbox() -> None:
    unit = render("systemd/llmfleet-rpc-server.service.j2", "w1")
    assert " -d " not in unit and directive(unit, "PrivateDevices") == ["true"]
    assert not directive(unit, "DevicePolicy")
