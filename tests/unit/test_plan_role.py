"""The llmfleet.cluster.plan role end to end on a what-if inventory (no host is contacted)."""

import json
import os
import subprocess

import jsonschema
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CACHE = os.environ.get("CACHE", os.path.join(ROOT, ".cache"))
GEMMA = os.path.join(CACHE, "models", "gemma-3-270m-Q4_K_M.gguf")
INVENTORY = os.path.join(ROOT, "tests", "fixtures", "plan", "whatif.yml")

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not os.path.exists(GEMMA), reason="make test-artifacts writes the Gemma model"),
]


def play(tmp_path, *extra):
    env = dict(os.environ, LLMFLEET_TEST_MODEL=GEMMA, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"))
    env.setdefault("ANSIBLE_COLLECTIONS_PATH", os.path.join(CACHE, "collections"))
    cmd = ["ansible-playbook", os.path.join(ROOT, "playbooks", "plan.yml"), "-i", INVENTORY]
    cmd += ["-e", f"llmfleet_output_dir={tmp_path}", *extra]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300, check=False)


@pytest.fixture(scope="module")
def planned(tmp_path_factory):
    """One run of plan.yml with the inventory's defaults, read by the tests that only look at it."""
    out = tmp_path_factory.mktemp("planned")
    # pinned to a build without a memory calibration (test_plan_records_the_pinned_build...): the
    # figures are the default calibration's, so the other tests read the same plan
    return out, play(out, "-e", "llama_cpp_build=b6000")


def test_plan_writes_a_valid_plan_and_the_table(planned):
    out, result = planned
    assert result.returncode == 0, result.stdout[-3000:]
    plan = json.loads((out / "plan.json").read_text())
    with open(os.path.join(ROOT, "docs", "plan.schema.json"), encoding="utf-8") as handle:
        jsonschema.validate(plan, json.load(handle))
    # w1 and w2 (160 MiB) cannot take the 170 MiB output layer; w3 (480 MiB, port 50053) can hold it all
    assert plan["workers"] == ["w3"]
    assert plan["rpc"] == "10.89.0.5:50053"
    assert {u["name"] for u in plan["unused"]} == {"w1", "w2"}
    assert plan["model"]["sha256"].startswith("a5fd3b62")
    md = (out / "plan.md").read_text()
    assert "| w3 | worker | 10.89.0.5:50053 | 0-17 | yes |" in md
    assert "host   role    layers" in result.stdout


def test_plan_refuses_before_any_change_with_missing_mib(tmp_path):
    result = play(tmp_path, "-e", "llmfleet_context=131072")
    assert result.returncode != 0
    assert "the model does not fit on this fleet" in result.stdout
    assert "missing: head1" in result.stdout and "MiB" in result.stdout
    assert not (tmp_path / "plan.json").exists()


def test_plan_objective_reaches_the_planner_and_the_plan(planned, tmp_path):
    out, result = planned
    assert result.returncode == 0, result.stdout[-3000:]
    plan = json.loads((out / "plan.json").read_text())
    # no host of the what-if inventory carries speed figures: auto plans for memory, no prediction
    assert plan["objective"] == "memory" and plan["speed"] is None
    assert plan["planned_with"]["options"]["objective"] == "auto"
    md = (out / "plan.md").read_text()
    assert "Objective: memory." in md and "no speed figures" in md
    forced = play(tmp_path, "-e", "llmfleet_plan_objective=speed")
    assert forced.returncode != 0
    assert "objective speed: host(s) head1" in forced.stdout and "have no speed figures" in forced.stdout


def test_plan_records_the_pinned_build_and_warns_about_one_without_calibration(planned):
    tmp_path, result = planned
    assert result.returncode == 0, result.stdout[-3000:]
    plan = json.loads((tmp_path / "plan.json").read_text())
    assert plan["llama_cpp"]["build"] == "b6000" and plan["llama_cpp"]["calibrated"] is False
    assert plan["llama_cpp"]["calibration"] == "b0c1e570"
    assert plan["planned_with"]["options"]["llama_cpp_build"] == "b6000"
    assert (
        len(plan["warnings"]) == 1
        and "llama.cpp build b6000 has no memory calibration" in plan["warnings"][0]
    )
    # an Ansible warning (stderr) and a line under the table (stdout), both naming the build
    assert "[WARNING]" in result.stderr and "b6000 has no memory calibration" in result.stderr
    assert "WARNING: llama.cpp build b6000" in result.stdout
    assert (
        "Memory model: llama.cpp build b6000, calibration b0c1e570 (not this build's)."
        in (tmp_path / "plan.md").read_text()
    )


def test_a_head_with_a_gpu_gets_its_layers_on_it_and_plan_md_a_row_per_device(tmp_path):
    """The what-if inventory with a 2 GiB discrete GPU on the head: the head's GPU holds the model
    (llmfleet_head_layers: false keeps its CPU free), no worker is needed, and plan.md lists the
    head's devices."""
    import yaml

    with open(INVENTORY, encoding="utf-8") as handle:
        inventory = yaml.safe_load(handle)
    head = inventory["all"]["children"]["llm_head"]["hosts"]["head1"]["llmfleet_host"]
    head["devices"] = [
        {
            "name": "Vulkan0",
            "backend": "vulkan",
            "description": "Radeon RX 6400",
            "type": "gpu",
            "memory_total_mib": 4096,
            "memory_free_mib": 2048,
            "uma": False,
        },
        {
            "name": "CPU",
            "backend": "cpu",
            "description": "CPU",
            "type": "cpu",
            "memory_total_mib": 400,
            "memory_free_mib": 400,
            "uma": False,
        },
    ]
    # every host measured (what-if figures), the head's GPU too: auto plans for speed over devices
    hosts = inventory["all"]["children"]
    hosts["llm_head"]["hosts"]["head1"]["llmfleet_profile"] = {
        "ms_per_layer": 2.0,
        "devices": {"Vulkan0": {"ms_per_layer": 0.25}},
    }
    for worker in hosts["llm_workers"]["hosts"].values():
        worker["llmfleet_profile"] = {"ms_per_layer": 2.0, "rtt_ms": 1.0, "mbit_s": 1000}
    gpu_inventory = tmp_path / "gpu.yml"
    gpu_inventory.write_text(yaml.safe_dump(inventory))
    env = dict(os.environ, LLMFLEET_TEST_MODEL=GEMMA, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"))
    env.setdefault("ANSIBLE_COLLECTIONS_PATH", os.path.join(CACHE, "collections"))
    cmd = ["ansible-playbook", os.path.join(ROOT, "playbooks", "plan.yml"), "-i", str(gpu_inventory)]
    cmd += ["-e", f"llmfleet_output_dir={tmp_path}"]
    result = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300, check=False)
    assert result.returncode == 0, result.stdout[-3000:]
    plan = json.loads((tmp_path / "plan.json").read_text())
    with open(os.path.join(ROOT, "docs", "plan.schema.json"), encoding="utf-8") as handle:
        jsonschema.validate(plan, json.load(handle))
    assert plan["version"] == 2 and plan["workers"] == []
    assert [(d["name"], d["layers"], d["output_layer"]) for d in plan["hosts"][0]["devices"]] == [
        ("CPU", [0, 0], False),
        ("Vulkan0", [0, 18], True),
    ]
    assert plan["llama_server_args"][:6] == ["--device", "Vulkan0", "--tensor-split", "19", "-ngl", "19"]
    md = (tmp_path / "plan.md").read_text()
    assert "| head1 | Vulkan0 | Vulkan0 | vulkan | gpu | 0-17 | yes |" in md
    assert "| head1 | CPU | CPU | cpu | cpu | - |  |" in md
    # the prediction over devices: the GPU's measured figure, plan.md's per-device "Why" rows
    assert plan["objective"] == "speed"
    (gpu,) = [d for d in plan["speed"]["hosts"][0]["devices"] if d["name"] == "Vulkan0"]
    assert (gpu["layers"], gpu["ms_per_layer"], gpu["priced"]) == (18, 0.25, "measured")
    assert "| head1 | Vulkan0 | 18 | 0.25 | measured |" in md


def _mixed_inventory(tmp_path, head_proto, worker_proto):
    """The what-if fleet with an x86_64 head and arm64 workers, each host's flavour from its probe,
    and one release table whose two flavours record these RPC protocol versions."""
    import yaml

    with open(INVENTORY, encoding="utf-8") as handle:
        inventory = yaml.safe_load(handle)
    groups = inventory["all"]["children"]
    groups["llm_head"]["hosts"]["head1"]["llmfleet_host"]["backends"]["llama_cpp"] = {
        "status": "release",
        "flavour": "ubuntu-x64",
    }
    for worker in groups["llm_workers"]["hosts"].values():
        worker["llmfleet_host"] = dict(
            worker["llmfleet_host"],
            arch="aarch64",
            backends=dict(
                worker["llmfleet_host"]["backends"],
                llama_cpp={"status": "release", "flavour": "ubuntu-arm64"},
            ),
        )
    url = "https://mirror.example/llama-b6000-bin-{}.tar.gz"
    inventory["all"]["vars"]["llama_cpp_build"] = "b6000"
    inventory["all"]["vars"]["llama_cpp_releases"] = {
        "b6000": {
            flavour: {"url": url.format(flavour), "sha256": "ab" * 32, "rpc_proto": proto}
            for flavour, proto in (("ubuntu-x64", head_proto), ("ubuntu-arm64", worker_proto))
        }
    }
    path = tmp_path / "mixed.yml"
    path.write_text(yaml.safe_dump(inventory))
    return str(path)


def test_plan_refuses_builds_of_different_rpc_protocols_before_anything(tmp_path):
    env = dict(os.environ, LLMFLEET_TEST_MODEL=GEMMA, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"))
    env.setdefault("ANSIBLE_COLLECTIONS_PATH", os.path.join(CACHE, "collections"))
    for head_proto, worker_proto, refused in (("7.0.0", "8.0.0", True), ("7.1.0", "7.0.0", False)):
        out = tmp_path / f"{head_proto}-{worker_proto}"
        cmd = ["ansible-playbook", os.path.join(ROOT, "playbooks", "plan.yml")]
        cmd += [
            "-i",
            _mixed_inventory(tmp_path, head_proto, worker_proto),
            "-e",
            f"llmfleet_output_dir={out}",
        ]
        result = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300, check=False)
        if refused:
            assert result.returncode != 0
            assert "do not speak one RPC protocol" in result.stdout
            assert "head head1 (ubuntu-x64, b6000): 7.0.0" in result.stdout
            assert "worker w1 (ubuntu-arm64, b6000): 8.0.0" in result.stdout
            assert "worker w3 (ubuntu-arm64, b6000): 8.0.0" in result.stdout
            assert not (out / "plan.json").exists()
            recap = result.stdout.split("PLAY RECAP")[-1].splitlines()
            assert "failed=0" in next(line for line in recap if line.startswith("w1 "))  # refused by the plan
        else:  # an older minor on the workers: llama-server accepts it
            assert result.returncode == 0, result.stdout[-3000:]
            assert json.loads((out / "plan.json").read_text())["workers"] == ["w3"]


def test_plan_refuses_a_device_the_hosts_build_lacks_before_any_change(tmp_path):
    """w1 offers a Vulkan GPU and its CPU, and its llama.cpp is the CPU flavour: the plan role
    refuses it, naming the host, the device, its backend and the flavour, and writes nothing
    (the llama_rpc role found it only when it wrote the units, after the installs)."""
    env = dict(os.environ, LLMFLEET_TEST_MODEL=GEMMA, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"))
    env.setdefault("ANSIBLE_COLLECTIONS_PATH", os.path.join(CACHE, "collections"))
    inventory = os.path.join(ROOT, "tests", "fixtures", "plan", "whatif-gpu.yml")

    def run(out, *extra):
        cmd = ["ansible-playbook", os.path.join(ROOT, "playbooks", "plan.yml"), "-i", inventory]
        cmd += ["-e", f"llmfleet_output_dir={out}", *extra]
        return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300, check=False)

    refused = run(tmp_path / "cpu")
    assert refused.returncode != 0
    assert (
        "plan: w1: the plan puts layers on Vulkan0 (vulkan) but the host's llama.cpp build ubuntu-x64"
        " is a CPU build" in refused.stdout
    ), refused.stdout[-3000:]
    assert not (tmp_path / "cpu" / "plan.json").exists()
    # the Vulkan flavour serves it (a CPU-only head of a Vulkan build is not judged)
    served = run(tmp_path / "vulkan", "-e", "llama_cpp_flavour=ubuntu-vulkan-x64")
    assert served.returncode == 0, served.stdout[-3000:]
    plan = json.loads((tmp_path / "vulkan" / "plan.json").read_text())
    assert [d["name"] for d in plan["hosts"][1]["devices"]] == ["Vulkan0"]
