"""A plan with no worker on the ``lws`` target: a LeaderWorkerSet group of one, with a warning.

The what-if fleet is tests/fixtures/vllm_lws/whatif-three with its head (xeon-spr, 60 GiB) alone:
Gemma 3 1B fits on it, so the plan has one stage and no worker. playbooks/deploy_vllm.yml
(render-only) must render a LeaderWorkerSet of size 1 that passes the CRD schema and print a
WARNING that vLLM runs without pipeline parallelism (docs/vllm-lws.md); the other objects pass
``kubernetes-validate --strict``.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import yaml

from tests.manifests import test_vllm_lws as base
from tests.support.k8s_validate import assert_valid


def head_alone(tmp_path: Path) -> Path:
    inventory = tmp_path / "inventory"
    shutil.copytree(base.WHATIF_THREE, inventory)
    hosts = yaml.safe_load((inventory / "hosts.yml").read_text())
    hosts["all"]["children"] = {"llm_head": hosts["all"]["children"]["llm_head"]}
    (inventory / "hosts.yml").write_text(yaml.safe_dump(hosts))
    for name in ("epyc-genoa", "ryzen-7950x"):
        (inventory / "host_vars" / f"{name}.yml").unlink()
    return inventory


# The fixtures of the lws render tests (the header-only Gemma 3 1B, the CRD schema made strict).
model_vars = base.model_vars
lws_validator = base.lws_validator


def test_a_head_alone_renders_a_group_of_one_with_a_warning(
    tmp_path: Path, model_vars, lws_validator
) -> None:
    out = tmp_path / "out"
    proc = base.run_playbook(head_alone(tmp_path), out, model_vars)
    assert proc.returncode == 0, proc.stdout[-6000:]
    rendered = base.Rendered(out, proc)
    assert rendered.plan["workers"] == []
    assert rendered.plan["vllm"]["pipeline_size"] == 1
    assert rendered.plan["vllm"]["stages"] == ["xeon-spr"]
    lws = rendered.lws
    assert lws["spec"]["leaderWorkerTemplate"]["size"] == 1
    errors = sorted(lws_validator.iter_errors(lws), key=lambda e: list(e.path))
    assert not errors, "\n".join(f"{'/'.join(map(str, e.path))}: {e.message}" for e in errors)
    shown = " ".join(proc.stdout.split())  # the callback folds long messages
    assert (
        "WARNING the plan puts every layer on xeon-spr: one pod, no pipeline parallelism"
        " (a LeaderWorkerSet of size 1)" in shown
    ), proc.stdout[-4000:]
    others = [p for p, o in rendered.objects.items() if o["kind"] not in base.CUSTOM_KINDS]
    assert_valid(others, base.K8S_VERSIONS[-1])
