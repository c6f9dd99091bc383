"""plan.json follows docs/plan.schema.json; docs/plan-format.md names only fields the schema knows."""

import json
import os
import re

import jsonschema
import pytest
from ansible_collections.llmfleet.cluster.plugins.plugin_utils import placement as P

from tests.unit.plugins.plugin_utils.test_placement import host, layout

ROOT = os.path.dirname(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
)
with open(os.path.join(ROOT, "docs", "plan.schema.json"), encoding="utf-8") as _handle:
    SCHEMA = json.load(_handle)
MODEL = {"name": "tiny", "file": "/models/tiny.gguf", "sha256": "a" * 64}


def make(workers, **opts):
    return P.make_plan(layout(n_layer=8, layer_mib=10), MODEL, host("head", 60), workers, opts, reserve_mib=8)


@pytest.mark.parametrize(
    "plan",
    [
        make([host("a", 100), host("b", 100), host("c", 100)], head_layers=False, context=512, min_workers=3),
        make([host("a", 300)], head_layers=False),
        P.make_plan(
            layout(n_layer=4, layer_mib=2), MODEL, host("head", 400), [host("a", 100)], {}, reserve_mib=8
        ),
        make([host("a", 200)], head_layers=False, output_layer="head", link_mbit=100),
    ],
    ids=["three-workers-with-fallbacks", "one-worker", "head-only", "output-on-head"],
)
def test_plans_validate(plan):
    jsonschema.validate(json.loads(json.dumps(plan)), SCHEMA)
    assert plan["hosts"][0]["role"] == "head" and plan["hosts"][0]["name"] == plan["head"]
    assert [h["name"] for h in plan["hosts"][1:]] == plan["workers"]


def test_schema_rejects_a_broken_plan():
    plan = make([host("a", 300)], head_layers=False)
    for broken in (
        {**plan, "version": 1},
        {**plan, "tensor_split": "1.5,x"},
        {**plan, "hosts": [{k: v for k, v in plan["hosts"][0].items() if k != "devices"}]},
        {
            **plan,
            "hosts": [
                {**plan["hosts"][0], "devices": [{**plan["hosts"][0]["devices"][0], "report_name": ""}]}
            ],
        },
        {**plan, "vllm": {**plan["vllm"], "pp_layer_partition": "0,8"}},
        {k: v for k, v in plan.items() if k != "llama_server_args"},
        {**plan, "hosts": [{**plan["hosts"][0], "role": "boss"}]},
    ):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(json.loads(json.dumps(broken)), SCHEMA)


def test_format_doc_example_uses_schema_fields():
    with open(os.path.join(ROOT, "docs", "plan-format.md"), encoding="utf-8") as handle:
        text = handle.read()
    example = re.search(r"```json\n(.*?)```", text, re.S).group(1)
    data = json.loads(example)
    assert set(data) <= set(SCHEMA["properties"])
    host_fields = set(SCHEMA["$defs"]["host"]["properties"])
    device_fields = set(SCHEMA["$defs"]["device"]["properties"])
    required = set(SCHEMA["$defs"]["device"]["required"])
    # the flags present only when true (uma, cpu_driver) are documented beside the example
    flags = device_fields - required
    assert flags == {"uma", "cpu_driver"}
    assert all(f"`{f}: true`" in text for f in flags)
    for h in data["hosts"]:
        assert set(h) <= host_fields
        for d in h["devices"]:
            assert set(d) == required
