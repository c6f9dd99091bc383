"""The memory model keyed by llama.cpp build (plugins/plugin_utils/calibration.py): the plan says
which build it planned for and which calibration it used, and warns naming a build without one."""

import dataclasses
import json
import os

import jsonschema
import pytest
from ansible_collections.llmfleet.cluster.plugins.filter import plan as F
from ansible_collections.llmfleet.cluster.plugins.plugin_utils import calibration as C
from ansible_collections.llmfleet.cluster.plugins.plugin_utils import placement as P
from ansible_collections.llmfleet.cluster.plugins.plugin_utils.placement_inputs import PlanInputError

from tests.unit.plugins.plugin_utils.test_placement import host, layout

ROOT = os.path.dirname(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
)
MODEL = {"name": "tiny", "file": "/models/tiny.gguf", "sha256": "a" * 64}
# The build the inventories pin (molecule/*/molecule.yml) and scripts/build-llama-cpp.sh builds.
PINNED = "b0c1e570"


def plan(build=None, workers=None, **opts):
    if build is not None:
        opts["llama_cpp_build"] = build
    workers = workers if workers is not None else [host("a", 100), host("b", 100)]
    return P.make_plan(
        layout(n_layer=8, layer_mib=10), MODEL, host("head", 60), workers, {"head_layers": False, **opts}, 8
    )


@pytest.fixture
def second_build(monkeypatch):
    """A second calibrated build whose rpc-server weighs 100 MiB at rest (an invented figure)."""
    other = dataclasses.replace(C.CALIBRATIONS[PINNED], build="b7000", worker_process_mib=100.0)
    monkeypatch.setitem(C.CALIBRATIONS, "b7000", other)
    C.for_build.cache_clear()
    yield other
    C.for_build.cache_clear()


def test_the_pinned_build_is_calibrated_with_the_measured_figures():
    choice = C.for_build(PINNED)
    assert choice.warning is None
    # docs/planner-accuracy.md: rpc-server at rest about 5.5 MiB, llama-server 30 MiB
    cal = choice.calibration
    assert (cal.worker_process_mib, cal.head_process_mib, cal.compute_slack_mib, cal.pp_copies) == (
        6.0,
        30.0,
        0.5,
        4,
    )


def test_the_calibrated_build_plans_as_before():
    """Every figure of a plan for the pinned build is that of a plan with no build pinned."""
    pinned, unpinned = plan(PINNED), plan()
    for key in ("hosts", "llama_server_args", "tensor_split", "fallbacks", "vllm", "table"):
        assert pinned[key] == unpinned[key], key
    # the worker's process is the 6 MiB the accuracy runs calibrated (5.4-5.5 measured, rounded up)
    assert [h["predicted_mib"]["process"] for h in pinned["hosts"][1:]] == [6.0, 6.0]


def test_the_plan_records_the_build_and_its_calibration():
    p = plan(PINNED)
    assert p["llama_cpp"]["build"] == PINNED
    assert p["llama_cpp"]["calibration"] == PINNED
    assert p["llama_cpp"]["calibrated"] is True
    assert p["llama_cpp"]["constants"]["worker_process_mib"] == 6.0
    assert p["warnings"] == []
    assert p["planned_with"]["options"]["llama_cpp_build"] == PINNED


def test_no_pinned_build_uses_the_default_without_a_warning():
    p = plan()
    assert p["llama_cpp"] == {
        **p["llama_cpp"],
        "build": None,
        "calibration": C.DEFAULT_BUILD,
        "calibrated": False,
    }
    assert p["warnings"] == []


def test_an_uncalibrated_build_warns_naming_it_and_plans_with_the_default():
    p = plan("b6000")
    assert p["llama_cpp"]["build"] == "b6000"
    assert p["llama_cpp"]["calibration"] == PINNED
    assert p["llama_cpp"]["calibrated"] is False
    assert len(p["warnings"]) == 1
    assert "b6000" in p["warnings"][0] and "no memory calibration" in p["warnings"][0]
    assert f"planned with {PINNED}'s figures" in p["warnings"][0]
    assert p["hosts"] == plan(PINNED)["hosts"]


def test_the_calibration_of_the_pinned_build_is_the_one_used(second_build):
    p = plan("b7000", workers=[host("a", 300), host("b", 300)], min_workers=2)
    assert p["llama_cpp"]["calibration"] == "b7000" and p["warnings"] == []
    assert [h["predicted_mib"]["process"] for h in p["hosts"][1:]] == [100.0, 100.0]
    base = plan(PINNED, workers=[host("a", 300), host("b", 300)], min_workers=2)
    assert [h["predicted_mib"]["process"] for h in base["hosts"][1:]] == [6.0, 6.0]


def test_a_numbered_build_without_calibration_takes_the_nearest(second_build):
    choice = C.for_build("b7100")
    assert choice.calibration.build == "b7000"
    assert "b7100" in choice.warning and "nearest" in choice.warning
    # not numbered: the default
    assert C.for_build("master-abc").calibration.build == C.DEFAULT_BUILD


def test_another_build_re_plans():
    previous = plan(PINNED)
    kept = P.keep_previous(
        previous,
        layout(n_layer=8, layer_mib=10),
        MODEL,
        host("head", 60),
        [host("a", 100), host("b", 100)],
        {"head_layers": False, "llama_cpp_build": "b6000"},
        8,
    )
    assert kept["keep"] is False
    assert "option llama_cpp_build 'b0c1e570' -> 'b6000'" in kept["reasons"][0]


def test_a_build_that_is_not_a_string_is_refused():
    with pytest.raises(PlanInputError, match="llama_cpp_build must be a string, got 6000"):
        plan(6000)


def test_the_plan_with_its_build_and_warning_validates():
    with open(os.path.join(ROOT, "docs", "plan.schema.json"), encoding="utf-8") as handle:
        schema = json.load(handle)
    jsonschema.validate(json.loads(json.dumps(plan("b6000"))), schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(json.loads(json.dumps({**plan("b6000"), "warnings": "one"})), schema)


def test_the_filter_shows_the_warning_in_ansibles_output(monkeypatch):
    shown = []
    monkeypatch.setattr(F.Display, "warning", lambda self, msg, *a, **k: shown.append(msg))
    F.plan_placement(
        layout(n_layer=8, layer_mib=10),
        MODEL,
        host("head", 60),
        [host("a", 100), host("b", 100)],
        {"head_layers": False, "llama_cpp_build": "b6000"},
        8,
    )
    assert len(shown) == 1 and "b6000" in shown[0]
    shown.clear()
    F.plan_placement(
        layout(n_layer=8, layer_mib=10), MODEL, host("head", 60), [], {"llama_cpp_build": PINNED}, 8
    )
    assert shown == []
