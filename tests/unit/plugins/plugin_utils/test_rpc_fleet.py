"""One RPC protocol for the fleet: the plan refuses builds whose versions llama-server would refuse.

The head (llama-server, the RPC client) accepts a worker's rpc-server of the same major and a minor
no higher than its own: ``negotiate_hello`` in the pinned source's ggml/src/ggml-rpc/ggml-rpc.cpp
(``response.major != RPC_PROTO_MAJOR_VERSION || response.minor > RPC_PROTO_MINOR_VERSION``).
"""

from __future__ import annotations

import pytest
from ansible.errors import AnsibleFilterError
from ansible_collections.llmfleet.cluster.plugins.filter.release import llama_cpp_rpc_check
from ansible_collections.llmfleet.cluster.plugins.plugin_utils import rpc_fleet

PIN = "ab" * 32


def _entry(flavour: str, rpc_proto=None, build: str = "b6000") -> dict:
    entry = {"url": f"https://mirror.example/llama-{build}-bin-{flavour}.tar.gz", "sha256": PIN}
    if rpc_proto is not None:
        entry["rpc_proto"] = rpc_proto
    return entry


def _fact(arch: str, flavour: str) -> dict:
    return {"arch": arch, "backends": {"llama_cpp": {"status": "release", "flavour": flavour}}}


def _mixed(x86: str | None, arm: str | None, **arm_vars) -> dict:
    """An x86_64 head and an arm64 worker, each getting its probe's flavour from one table."""
    releases = {
        "b6000": {"ubuntu-x64": _entry("ubuntu-x64", x86), "ubuntu-arm64": _entry("ubuntu-arm64", arm)}
    }
    common = {"llama_cpp_build": "b6000", "llama_cpp_releases": releases}
    return {
        "desk": dict(common, llmfleet_host=_fact("x86_64", "ubuntu-x64")),
        "pi5": dict(common, llmfleet_host=_fact("aarch64", "ubuntu-arm64"), **arm_vars),
    }


def test_x86_head_and_arm64_worker_of_different_majors_are_refused() -> None:
    with pytest.raises(rpc_fleet.RpcProtoMismatch) as err:
        rpc_fleet.check_hosts("desk", ["pi5"], _mixed("7.0.0", "8.0.0"))
    message = str(err.value)
    assert "head desk (ubuntu-x64, b6000): 7.0.0" in message
    assert "worker pi5 (ubuntu-arm64, b6000): 8.0.0" in message
    assert "negotiate_hello" in message


def test_the_same_version_on_both_architectures_is_accepted() -> None:
    got = rpc_fleet.check_hosts("desk", ["pi5"], _mixed("7.0.0", "7.0.0"))
    assert got == {
        "checked": ["desk", "pi5"],
        "builds": ["b6000"],
        "rpc_proto": {"desk": "7.0.0", "pi5": "7.0.0"},
    }


@pytest.mark.parametrize(
    ("head", "worker", "ok"),
    [
        ("7.1.0", "7.0.0", True),  # an older minor on the worker: the head still speaks it
        ("7.0.0", "7.1.0", False),  # a newer minor on the worker: the head refuses it
        ("7.0.0", "7.0.5", True),  # the patch is not compared
        ("8.0.0", "7.9.0", False),
        ("7.2.0", "7.2.0", True),
    ],
)
def test_the_minor_rule_is_llama_cpps(head: str, worker: str, ok: bool) -> None:
    hostvars = _mixed(head, worker)
    if ok:
        assert rpc_fleet.check_hosts("desk", ["pi5"], hostvars)["rpc_proto"] == {"desk": head, "pi5": worker}
    else:
        with pytest.raises(rpc_fleet.RpcProtoMismatch, match=f"pi5 \\(ubuntu-arm64, b6000\\): {worker}"):
            rpc_fleet.check_hosts("desk", ["pi5"], hostvars)


def test_the_worker_may_be_older_but_the_head_not() -> None:
    # The same two builds, the roles swapped: the arm64 host as head (7.0.0) refuses the x86 7.1.0 worker.
    assert rpc_fleet.check_hosts("desk", ["pi5"], _mixed("7.1.0", "7.0.0"))
    with pytest.raises(rpc_fleet.RpcProtoMismatch, match=r"head pi5 \(ubuntu-arm64, b6000\): 7.0.0"):
        rpc_fleet.check_hosts("pi5", ["desk"], _mixed("7.1.0", "7.0.0"))


def test_one_build_tag_without_recorded_versions_is_one_source() -> None:
    got = rpc_fleet.check_hosts("desk", ["pi5"], _mixed(None, None))
    assert got["rpc_proto"] == {"desk": None, "pi5": None}


def test_two_build_tags_must_record_their_versions() -> None:
    hostvars = _mixed("7.0.0", None)
    hostvars["pi5"] = dict(
        hostvars["pi5"],
        llama_cpp_build="b5000",
        llama_cpp_releases={"b5000": {"ubuntu-arm64": _entry("ubuntu-arm64", build="b5000")}},
    )
    with pytest.raises(rpc_fleet.RpcProtoMismatch) as err:
        rpc_fleet.check_hosts("desk", ["pi5"], hostvars)
    assert "builds b5000, b6000" in str(err.value)
    assert "no rpc_proto for pi5 (ubuntu-arm64, b5000)" in str(err.value)
    hostvars["pi5"]["llama_cpp_releases"]["b5000"]["ubuntu-arm64"]["rpc_proto"] = "7.0.0"
    assert rpc_fleet.check_hosts("desk", ["pi5"], hostvars)["builds"] == ["b5000", "b6000"]


def test_workers_of_different_majors_are_refused_when_the_head_records_none() -> None:
    hostvars = _mixed(None, "8.0.0")
    hostvars["nas"] = dict(hostvars["desk"], llama_cpp_flavour="source")
    hostvars["nas"]["llama_cpp_releases"] = {"b6000": {"source": _entry("source", "7.0.0")}}
    with pytest.raises(rpc_fleet.RpcProtoMismatch, match=r"the workers differ in major version"):
        rpc_fleet.check_hosts("desk", ["pi5", "nas"], hostvars)


def test_the_inventory_flavour_and_the_lock_are_read_as_the_role_reads_them() -> None:
    # pi5 is told to build from source (llama_cpp_flavour wins over the probe); the lock records the
    # versions, the inventory's own entry (no rpc_proto) lies over it without erasing them.
    lock = {
        "b6000": {
            "ubuntu-x64": _entry("ubuntu-x64", "7.0.0"),
            "source": dict(_entry("source", "8.0.0"), hosts=["pi5"]),
        }
    }
    hostvars = _mixed(None, None, llama_cpp_flavour="source")
    hostvars["pi5"]["llama_cpp_releases"] = {"b6000": {"source": _entry("source")}}
    with pytest.raises(rpc_fleet.RpcProtoMismatch, match=r"worker pi5 \(source, b6000\): 8.0.0"):
        rpc_fleet.check_hosts("desk", ["pi5"], hostvars, lock)


def test_hosts_without_a_build_or_an_entry_are_left_to_the_llama_cpp_role() -> None:
    hostvars = _mixed("7.0.0", "8.0.0")
    hostvars["pi5"]["llmfleet_host"] = _fact("riscv64", "ubuntu-riscv64")  # no such entry
    hostvars["whatif"] = {"llmfleet_host": _fact("x86_64", "ubuntu-x64")}  # no llama_cpp_build
    assert rpc_fleet.check_hosts("desk", ["pi5", "whatif"], hostvars)["checked"] == ["desk"]


def test_a_malformed_version_names_the_host_and_the_entry() -> None:
    with pytest.raises(
        rpc_fleet.RpcProtoMismatch, match=r"pi5: release table entry b6000/ubuntu-arm64 rpc_proto"
    ):
        rpc_fleet.check_hosts("desk", ["pi5"], _mixed("7.0.0", "seven"))


def test_the_filter_fails_naming_the_plan_and_reads_the_lock() -> None:
    with pytest.raises(AnsibleFilterError, match=r"^plan: the llama.cpp builds of this fleet do not speak"):
        llama_cpp_rpc_check("desk", ["pi5"], _mixed("7.0.0", "8.0.0"))
    lock = {"llama_cpp": {"releases": {"b6000": {"ubuntu-arm64": {"rpc_proto": "8.0.0"}}}}}
    with pytest.raises(AnsibleFilterError, match=r"pi5 \(ubuntu-arm64, b6000\): 8.0.0"):
        llama_cpp_rpc_check("desk", ["pi5"], _mixed("7.0.0", None), lock)
    assert llama_cpp_rpc_check("desk", ["pi5"], _mixed("7.0.0", "7.0.0"), {})["checked"] == ["desk", "pi5"]
