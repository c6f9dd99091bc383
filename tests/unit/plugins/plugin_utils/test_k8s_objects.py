"""k8s_objects.py: the entries of the one render-or-apply sequence, checked and in apply order."""

from __future__ import annotations

import fnmatch

import pytest
from ansible.errors import AnsibleFilterError
from ansible_collections.llmfleet.cluster.plugins.filter.k8s import k8s_objects, llama_rpc_k8s_teardown
from ansible_collections.llmfleet.cluster.plugins.plugin_utils.k8s_objects import (
    ObjectsError,
    apply_order,
    stale_files,
)
from ansible_collections.llmfleet.cluster.plugins.plugin_utils.llama_rpc_k8s import (
    NAMES,
    manifest_list,
    teardown,
)

NS = "---\napiVersion: v1\nkind: Namespace\nmetadata:\n  name: llmfleet\n"
CM = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: llama-rpc}\ndata: {a: b}\n"
SECRET = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "k"}, "stringData": {"key": "s3cret"}}


def test_namespaces_then_secrets_then_the_rest_in_the_given_order() -> None:
    entries = [
        {"file": "b.yaml", "content": CM},
        {"file": "s.yaml", "object": SECRET},
        {"file": "c.yaml", "object": {"kind": "Service", "metadata": {"name": "svc"}}},
        {"file": "n.yaml", "content": NS},
    ]
    out = apply_order(entries)
    assert [e["file"] for e in out] == ["n.yaml", "s.yaml", "b.yaml", "c.yaml"]
    assert [e["kind"] for e in out] == ["Namespace", "Secret", "ConfigMap", "Service"]
    assert [e["name"] for e in out] == ["llmfleet", "k", "llama-rpc", "svc"]
    assert [e["secret"] for e in out] == [False, True, False, False]
    assert out[2]["object"]["data"] == {"a": "b"}  # the text parsed
    assert out[2]["content"] == CM and out[1]["content"] is None  # the text kept as written
    assert out[0]["label"] == "Namespace n.yaml"
    assert all(e["render"] for e in out)


def test_render_false_is_kept_and_an_object_secret_flag_is_read() -> None:
    out = apply_order(
        [{"file": "ns.yaml", "object": {"kind": "Namespace", "metadata": {"name": "x"}}, "render": False}]
    )
    assert out[0]["render"] is False
    out = apply_order([{"file": "t.yaml", "content": CM, "secret": True}])
    assert out[0]["secret"] is True  # a ConfigMap the role marks secret is written 0600 too


@pytest.mark.parametrize(
    ("entry", "words"),
    [
        ({"content": CM}, "file must be a plain file name"),
        ({"file": "../x.yaml", "content": CM}, "'../x.yaml'"),
        ({"file": "x.yaml"}, "exactly one of content"),
        ({"file": "x.yaml", "content": CM, "object": SECRET}, "exactly one of content"),
        ({"file": "x.yaml", "content": "kind: [unclosed"}, "content is not YAML"),
        ({"file": "x.yaml", "content": "kind: ConfigMap\n"}, "metadata.name"),
        ({"file": "x.yaml", "object": SECRET, "secret": False}, "must be flagged secret"),
        ({"file": "x.yaml", "content": CM, "render": "yes"}, "render must be true or false, got 'yes'"),
    ],
)
def test_a_bad_entry_is_refused_naming_it(entry: dict, words: str) -> None:
    with pytest.raises(ObjectsError, match="manifest 1") as caught:
        apply_order([{"file": "ok.yaml", "content": CM}, entry])
    assert words in str(caught.value)


def test_a_file_given_twice_and_a_non_list_are_refused() -> None:
    with pytest.raises(ObjectsError, match=r"given twice: a\.yaml"):
        apply_order([{"file": "a.yaml", "content": CM}, {"file": "a.yaml", "content": NS}])
    with pytest.raises(AnsibleFilterError, match="must be a list"):
        k8s_objects({"file": "a.yaml"})


def test_stale_files_are_the_earlier_renders_this_one_does_not_write() -> None:
    entries = apply_order(
        [
            {"file": "llama-rpc-08-daemonset-amd64.yaml", "content": CM},
            {"file": "ns.yaml", "content": NS, "render": False},
        ]
    )
    found = [
        "/o/m/llama-rpc-08-daemonset-arm64.yaml",
        "/o/m/llama-rpc-08-daemonset-amd64.yaml",
        "/o/m/ns.yaml",
    ]
    assert stale_files(found, entries, "/o/m/") == ["/o/m/llama-rpc-08-daemonset-arm64.yaml", "/o/m/ns.yaml"]
    assert stale_files(found[1:2], entries, "/o/m") == []


def test_the_teardown_is_every_named_object_and_the_daemonsets_given() -> None:
    gone = teardown(["llama-rpc-server-amd64"])
    # Every name of NAMES is deleted (the head's Service shares the Deployment's name).
    assert {o["name"] for o in gone["objects"]} == set(NAMES.values()) - {NAMES["workers"]} | {
        "llama-rpc-server-amd64"
    }
    assert gone["objects"][0] == {"api": "apps/v1", "kind": "Deployment", "name": "llama-server"}
    assert gone["objects"][1]["kind"] == "DaemonSet"
    assert gone["key_file"] == NAMES["secret"]
    assert all(fnmatch.fnmatch(m["file"], gone["file_pattern"]) for m in manifest_list({"amd64": {}}))
    assert llama_rpc_k8s_teardown([]) == teardown()
    with pytest.raises(AnsibleFilterError, match="DaemonSet names"):
        llama_rpc_k8s_teardown("llama-rpc-server-amd64")
