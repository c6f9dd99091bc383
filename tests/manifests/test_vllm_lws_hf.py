"""The lws target planned from what a vLLM user has: a Hugging Face directory (config.json and
safetensors headers, llmfleet_model.hf_dir) instead of a GGUF. playbooks/deploy_vllm.yml
(render-only) on the what-if three-node fleet must plan every layer from the headers, carry each
stage's weights in plan.json, and render a LeaderWorkerSet whose partition is the plan's."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from tests.manifests import test_vllm_lws as base
from tests.support.hf_craft import llama


def test_an_hf_directory_is_planned_from_its_headers(tmp_path: Path) -> None:
    model_dir = llama(tmp_path / "tiny-llama-hf", n_layer=26, hidden=512, ff=1024, vocab=4096)
    model = tmp_path / "model.yml"
    model.write_text(
        yaml.safe_dump({"llmfleet_model": {"name": "tiny", "hf_dir": str(model_dir), "hf_repo": "org/tiny"}})
    )
    inventory = tmp_path / "inventory"
    shutil.copytree(base.WHATIF_THREE, inventory)
    # The fixture's group_vars name a GGUF URL: the HF directory must win, so drop it.
    (inventory / "group_vars" / "all" / "model.yml").unlink(missing_ok=True)
    out = tmp_path / "out"
    proc = base.run_playbook(inventory, out, model)
    assert proc.returncode == 0, proc.stdout[-6000:]
    rendered = base.Rendered(out, proc)
    vllm = rendered.plan["vllm"]
    counts = [int(c) for c in vllm["pp_layer_partition"].split(",")]
    assert sum(counts) == 26 and len(counts) == 3
    assert vllm["weights_dtype_bytes"] == 4
    # Each stage's weights: its layers, plus the embedding on the first and norm + lm_head on the last.
    layer = 4 * (2 * 512 * 512 + 2 * 256 * 512 + 3 * 1024 * 512 + 2 * 512)
    embed = 4 * 4096 * 512
    mib = 1024 * 1024
    expected = [counts[0] * layer + embed, counts[1] * layer, counts[2] * layer + 4 * 512 + embed]
    assert vllm["stage_weights_mib"] == [pytest.approx(e / mib, abs=1e-3) for e in expected]
    lws = rendered.lws
    leader = lws["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"]["containers"][0]
    env = {e["name"]: e.get("value") for e in leader["env"]}
    assert env["VLLM_PP_LAYER_PARTITION"] == vllm["pp_layer_partition"]
    assert leader["args"][0] == "org/tiny"
