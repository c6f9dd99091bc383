"""inventories/demo-mixed: an x86_64 head and worker beside an arm64 worker (issue #33).

- scripts/demo.sh's reading of the inventory (the embedded program, run on ``ansible-inventory
  --list``) gives the arm64 host ``--arch arm64`` and the arm64 image, the others the machine's own,
  and it mirrors the ubuntu-arm64 tarball only for a fleet with an arm64 host;
- the release table has the ubuntu-arm64 flavour of the same build, pinned from .cache/dist-arm64;
- the planner, given the hosts' memory caps less what an idle container uses at probe time, puts
  layers on every host, the arm64 worker included (so make demo-mixed-check's verify finds it working).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
MIXED = ROOT / "inventories" / "demo-mixed"
CACHE = Path(os.environ.get("CACHE", ROOT / ".cache"))
SMOLLM2 = CACHE / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"


def run_demo_spec(inventory: Path, tmp_path: Path) -> subprocess.CompletedProcess:
    """scripts/demo.sh's embedded program (its reading of the inventory) run on ``inventory``."""
    text = (ROOT / "scripts" / "demo.sh").read_text()
    program = text.split("<<'EOF'\n", 1)[1].split("\nEOF\n", 1)[0]
    listed = tmp_path / f"{inventory.name}.json"
    listed.write_text(
        subprocess.run(
            ["ansible-inventory", "-i", str(inventory), "--list"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
    )
    return subprocess.run(
        [sys.executable, "-c", program, str(listed)], capture_output=True, text=True, check=False
    )


def _spec(inventory: str, tmp_path: Path, kind: str = "host") -> list[list[str]]:
    spec = run_demo_spec(ROOT / "inventories" / inventory, tmp_path)
    assert spec.returncode == 0, spec.stderr
    return [line.split() for line in spec.stdout.splitlines() if line.startswith(kind + " ")]


def test_demo_sh_runs_the_arm64_host_from_the_arm64_image(tmp_path: Path) -> None:
    hosts = {fields[1]: fields for fields in _spec("demo-mixed", tmp_path)}
    assert (
        yaml.safe_load((MIXED / "hosts.yml").read_text())["all"]["children"]["llm_workers"]["hosts"][
            "llmfleet-mixed-arm64"
        ]["llama_rpc_firewall"]
        is False
    )
    # host name memory cpus rate shares arch image
    assert hosts["llmfleet-mixed-arm64"][6:] == ["arm64", "localhost/llmfleet-host:bookworm-arm64"]
    for name in ("llmfleet-mixed-head", "llmfleet-mixed-x86"):
        assert hosts[name][6:] == ["-", "localhost/llmfleet-host:bookworm"]
    # the plain demo is all the machine's own architecture
    assert {tuple(f[6:]) for f in _spec("demo", tmp_path)} == {("-", "localhost/llmfleet-host:bookworm")}
    text = (ROOT / "scripts" / "demo.sh").read_text()
    assert 'platform=(--arch "$arch")' in text and '"${platform[@]}"' in text
    assert '"$CACHE"/dist-arm64/llama-*-bin-ubuntu-arm64.tar.gz' in text


def test_demo_sh_refuses_an_arch_without_an_image(tmp_path: Path) -> None:
    inventory = tmp_path / "inv"
    (inventory / "group_vars" / "all").mkdir(parents=True)
    for name in ("demo.yml", "fleet.yml"):
        (inventory / "group_vars" / "all" / name).write_text(
            (MIXED / "group_vars" / "all" / name).read_text()
        )
    hosts = yaml.safe_load((MIXED / "hosts.yml").read_text())
    hosts["all"]["children"]["llm_workers"]["hosts"]["llmfleet-mixed-arm64"]["demo_podman"]["arch"] = (
        "riscv64"
    )
    (inventory / "hosts.yml").write_text(yaml.safe_dump(hosts))
    spec = run_demo_spec(inventory, tmp_path)
    assert spec.returncode != 0
    assert (
        "llmfleet-mixed-arm64 has demo_podman.arch riscv64 but demo_images has no image for it" in spec.stderr
    )


def test_the_release_table_pins_the_arm64_build_of_the_same_tag() -> None:
    fleet = yaml.safe_load((MIXED / "group_vars" / "all" / "fleet.yml").read_text())
    build = fleet["llama_cpp_build"]
    flavours = fleet["llama_cpp_releases"][build]
    assert set(flavours) == {"ubuntu-x64", "ubuntu-arm64", "source"}
    arm64 = flavours["ubuntu-arm64"]
    assert arm64["url"].endswith(f"/llama-{build}-bin-ubuntu-arm64.tar.gz")
    assert f"'-arm64/llama-{build}-bin-ubuntu-arm64.tar.gz.sha256'" in arm64["sha256"]
    assert fleet["llmfleet_output_dir"].endswith("/demo/demo-mixed/out")


@pytest.mark.skipif(not SMOLLM2.is_file(), reason="needs make test-artifacts (SmolLM2 in .cache/models)")
# An idle x86 host container uses 10-90 MiB (tests/unit/test_demo_inventory.py); the arm64 one
# under qemu-user used 103 MB (systemd, journald, dbus and logind each 20-35 MB there).
@pytest.mark.parametrize(("idle_mib", "arm64_idle_mib"), [(10, 100), (40, 110), (80, 130)])
def test_every_host_of_the_mixed_fleet_holds_layers(idle_mib: int, arm64_idle_mib: int) -> None:
    from ansible_collections.llmfleet.cluster.plugins.module_utils.gguf_layout import read_layout
    from ansible_collections.llmfleet.cluster.plugins.plugin_utils.placement import make_plan

    layout = read_layout(str(SMOLLM2)).to_dict()
    fleet = yaml.safe_load((MIXED / "group_vars" / "all" / "fleet.yml").read_text())
    children = yaml.safe_load((MIXED / "hosts.yml").read_text())["all"]["children"]

    def host(name: str, hv: dict, i: int) -> dict:
        memory = int(str(hv["demo_podman"]["memory"]).rstrip("m"))
        idle = arm64_idle_mib if hv["demo_podman"].get("arch") == "arm64" else idle_mib
        return {"name": name, "usable_mib": memory - idle, "cpus": 1, "address": f"10.89.64.{i}"}

    (head,) = [host(n, hv, 2) for n, hv in children["llm_head"]["hosts"].items()]
    workers = [host(n, hv, 3 + i) for i, (n, hv) in enumerate(children["llm_workers"]["hosts"].items())]
    options = {"context": fleet["llmfleet_context"], "min_workers": fleet["llmfleet_min_workers"]}
    model = {"name": "smollm2", "file": SMOLLM2.name, "sha256": fleet["llmfleet_model"]["sha256"]}
    plan = make_plan(layout, model, head, workers, options, 64.0, "llama_cpp", "systemd")
    layers = {h["name"]: h["layers"] for h in plan["hosts"]}
    assert set(layers) == {"llmfleet-mixed-head", "llmfleet-mixed-arm64", "llmfleet-mixed-x86"}
    for name, (start, end) in layers.items():
        assert end > start, f"{name} holds no layer: {layers}"
    first, last = layers["llmfleet-mixed-arm64"]
    # the emulated host is about 10x slower: a share, not most of the model
    assert last - first <= layout["n_layer"] // 3, layers
