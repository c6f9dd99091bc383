"""inventories/demo-gpu: Vulkan devices (Mesa's lavapipe) on the head and a worker (issue #32).

- scripts/demo.sh's reading of the inventory gives the two Vulkan hosts the Vulkan test-host image
  (demo_podman.image: vulkan) and the CPU worker the machine's own, names the Vulkan flavour so the
  mirror serves its tarball, and refuses an image key demo_images does not name;
- the release table pins ubuntu-vulkan-x64 from .cache/dist-vulkan, and the Vulkan hosts choose it
  with GGML_VK_VISIBLE_DEVICES naming lavapipe (llama.cpp skips CPU-type devices otherwise).
"""

from __future__ import annotations

from pathlib import Path

import yaml

from tests.unit.test_demo_mixed_inventory import _spec, run_demo_spec

ROOT = Path(__file__).resolve().parents[2]
GPU = ROOT / "inventories" / "demo-gpu"
VULKAN_IMAGE = "localhost/llmfleet-host:bookworm-vulkan"


def test_demo_sh_runs_the_vulkan_hosts_from_the_vulkan_image(tmp_path: Path) -> None:
    hosts = {fields[1]: fields for fields in _spec("demo-gpu", tmp_path)}
    # host name memory cpus rate shares arch image
    assert {n: f[6:] for n, f in hosts.items()} == {
        "llmfleet-gpu-head": ["-", VULKAN_IMAGE],
        "llmfleet-gpu-w1": ["-", VULKAN_IMAGE],
        "llmfleet-gpu-cpu": ["-", "localhost/llmfleet-host:bookworm"],
    }
    assert _spec("demo-gpu", tmp_path, "flavours") == [["flavours", "ubuntu-vulkan-x64"]]
    assert _spec("demo", tmp_path, "flavours") == [["flavours", "-"]]
    text = (ROOT / "scripts" / "demo.sh").read_text()
    assert '"$CACHE"/dist-vulkan/llama-*-bin-ubuntu-vulkan-x64.tar.gz' in text


def test_the_vulkan_hosts_choose_the_pinned_vulkan_build() -> None:
    inv = yaml.safe_load((GPU / "hosts.yml").read_text())["all"]["children"]
    fleet = yaml.safe_load((GPU / "group_vars" / "all" / "fleet.yml").read_text())
    release = fleet["llama_cpp_releases"][fleet["llama_cpp_build"]]["ubuntu-vulkan-x64"]
    assert release["url"].endswith("/llama-b0c1e570-bin-ubuntu-vulkan-x64.tar.gz")
    assert "-vulkan/llama-b0c1e570-bin-ubuntu-vulkan-x64.tar.gz.sha256" in release["sha256"]
    for group in ("llm_head", "llm_workers"):
        for name, hv in inv[group]["hosts"].items():
            if (hv.get("demo_podman") or {}).get("image") == "vulkan":
                assert hv["llama_cpp_flavour"] == "ubuntu-vulkan-x64", name
                assert hv["llmfleet_llama_cpp_env"] == {"GGML_VK_VISIBLE_DEVICES": "0"}, name
                assert set(hv["llmfleet_device_memory_mib"]) == {"Vulkan0"}, name


def test_demo_sh_refuses_an_image_key_without_an_image(tmp_path: Path) -> None:
    inventory = tmp_path / "inv"
    (inventory / "group_vars" / "all").mkdir(parents=True)
    for name in ("demo.yml", "fleet.yml"):
        (inventory / "group_vars" / "all" / name).write_text((GPU / "group_vars" / "all" / name).read_text())
    hosts = yaml.safe_load((GPU / "hosts.yml").read_text())
    hosts["all"]["children"]["llm_workers"]["hosts"]["llmfleet-gpu-w1"]["demo_podman"]["image"] = "rocm"
    (inventory / "hosts.yml").write_text(yaml.safe_dump(hosts))
    got = run_demo_spec(inventory, tmp_path)
    assert got.returncode != 0
    assert (
        "llmfleet-gpu-w1 has demo_podman.image rocm but demo_images has no image for it (got ['vulkan'])"
        in got.stderr
    )
