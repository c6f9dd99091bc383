"""The plan role with a speed profile, on a what-if inventory (no host is contacted).

The planner's use of the figures belongs to the speed objective; here: the role reads
profile.json, names every host whose figures it does not pass on (stale), and refuses odd
what-if figures by host before anything else.
"""

import hashlib
import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.support.gguf_gen import SHAPES, write_tiny_llama

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CACHE = os.environ.get("CACHE", os.path.join(ROOT, ".cache"))
FIXTURE = os.path.join(ROOT, "tests", "fixtures", "plan", "whatif.yml")

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("model") / "tiny.gguf")
    write_tiny_llama(path, next(s for s in SHAPES if s.name == "tiny-llama-13L"))
    with open(path, "rb") as handle:
        return path, hashlib.sha256(handle.read()).hexdigest()


def inventory(tmp_path, model, given=None):
    with open(FIXTURE, encoding="utf-8") as handle:
        inv = yaml.safe_load(handle)
    inv["all"]["vars"]["llmfleet_model"] = {"name": "tiny", "file": model[0], "sha256": model[1]}
    for name, figures in (given or {}).items():
        inv["all"]["children"]["llm_workers"]["hosts"][name]["llmfleet_profile"] = figures
    path = tmp_path / "inventory.yml"
    path.write_text(yaml.safe_dump(inv))
    return str(path)


def play(tmp_path, inv, *extra):
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"))
    env.setdefault("ANSIBLE_COLLECTIONS_PATH", os.path.join(CACHE, "collections"))
    cmd = ["ansible-playbook", os.path.join(ROOT, "playbooks", "plan.yml"), "-i", inv]
    cmd += ["-e", f"llmfleet_output_dir={tmp_path}", "-e", "llama_cpp_build=b0c1e570", *extra]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300, check=False)


def test_a_stale_profile_is_named_host_by_host_and_not_used(tmp_path, model) -> None:
    fingerprint = {
        "arch": "x86_64",
        "cpu_model": None,
        "cpus": 2,
        "cpus_online": None,
        "cpu_quota": None,
        "isa": None,
        "total_mib": None,
        "cgroup_limit_mib": None,
    }
    entry = {
        "fingerprint": fingerprint,
        "measured_at": "t",
        "not_measured": [],
        "compute": {"ms_per_layer": 2.0, "measured_at": "t"},
        "link": {"rtt_ms": 1.0, "mbit_s": 100.0, "measured_at": "t"},
    }
    profile = {
        "version": 2,
        "measured_at": "t",
        "build": "b0c1e570",
        "model": {"sha256": "0" * 64},
        "hosts": {name: entry for name in ("head1", "w1", "w2", "w3")},
    }
    (tmp_path / "profile.json").write_text(json.dumps(profile))
    result = play(tmp_path, inventory(tmp_path, model))
    assert result.returncode == 0, result.stdout[-3000:]
    for name in ("head1", "w1", "w2", "w3"):
        assert (
            f"{name}: profile.json is stale (the model changed (sha256 000000000000 -> {model[1][:12]}))"
            in " ".join(result.stdout.split())
        )
    plan = json.loads((tmp_path / "plan.json").read_text())
    # the calibrated build the play pins: recorded, its own calibration, no warning
    assert plan["llama_cpp"]["build"] == "b0c1e570" and plan["llama_cpp"]["calibrated"] is True
    assert plan["warnings"] == [] and "no memory calibration" not in result.stdout + result.stderr


def test_odd_what_if_figures_fail_naming_the_host(tmp_path, model) -> None:
    inv = inventory(tmp_path, model, {"w2": {"ms_per_layer": 3.0, "rtt_ms": 1.0, "mbit_s": 0}})
    result = play(tmp_path, inv)
    assert result.returncode != 0
    assert "profile_speed: w2: mbit_s is 0 in llmfleet_profile (a 0 Mbit link)" in " ".join(
        result.stdout.split()
    )
    assert not (tmp_path / "plan.json").exists()


def test_measured_output_and_head_time_reach_plan_json_and_plan_md(tmp_path, model) -> None:
    # what-if figures as profile.yml writes them for measured hosts: the output layer's measured
    # time (cheap on w1), the head's own time a token, a quota'd w3
    given = {
        "w1": {"ms_per_layer": 1.0, "rtt_ms": 0.5, "mbit_s": 1000, "output_ms": 3.0},
        "w2": {"ms_per_layer": 1.0, "rtt_ms": 0.5, "mbit_s": 1000, "output_ms": 8.0},
        "w3": {"ms_per_layer": 1.0, "rtt_ms": 0.5, "mbit_s": 1000, "output_ms": 8.0, "cpu_quota": 0.1},
    }
    inv = yaml.safe_load(Path(inventory(tmp_path, model, given)).read_text(encoding="utf-8"))
    inv["all"]["children"]["llm_head"]["hosts"]["head1"]["llmfleet_profile"] = {
        "ms_per_layer": 1.0,
        "output_ms": 40.0,
        "token_ms": 9.5,
    }
    path = tmp_path / "inventory.yml"
    path.write_text(yaml.safe_dump(inv))
    result = play(tmp_path, str(path), "-e", "llmfleet_plan_objective=speed")
    assert result.returncode == 0, result.stdout[-3000:]
    plan = json.loads((tmp_path / "plan.json").read_text())
    assert plan["speed"]["token_ms"] == 9.5
    holder = next(h for h in plan["speed"]["hosts"] if "output_ms" in h)
    # the measured 3 ms on w1 beats 40 on the head: the output layer goes to w1, priced as given
    assert holder["name"] == "w1" and holder["output_ms"] == 3.0 and holder["output_priced"] == "figures"
    md = (tmp_path / "plan.md").read_text()
    assert "| output layer ms |" in md and "3.0 (figures)" in md
    assert "The head's own time per token" in md and "9.5 ms" in md
