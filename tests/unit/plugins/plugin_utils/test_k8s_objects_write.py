"""k8s_objects.write_manifests: the render on the controller (action plugin k8s_objects_write).

Each file is written once, 0644 or a Secret 0600, atomically, only when its content or mode
differs; check mode writes nothing and reports the same; the stale files of an earlier render go;
nothing of a Secret's content is in the result or its diff.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
from ansible.plugins.filter.core import to_nice_yaml
from ansible_collections.llmfleet.cluster.plugins.plugin_utils.k8s_objects import (
    ObjectsError,
    WriteError,
    apply_order,
    manifest_text,
    write_manifests,
)

SECRET_VALUE = "s3cret-never-in-a-result-9d1f"
CM = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: llama-rpc}\ndata: {a: b}\n"
SVC = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "svc"}, "spec": {"ports": [{"port": 80}]}}
SECRET = {
    "apiVersion": "v1",
    "kind": "Secret",
    "metadata": {"name": "k"},
    "stringData": {"key": SECRET_VALUE},
}
NS = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "llmfleet"}}


def dump(obj) -> str:
    return to_nice_yaml(obj, indent=2, sort_keys=False, width=1000)


def entries() -> list[dict]:
    return apply_order(
        [
            {"file": "x-03-configmap.yaml", "content": CM},
            {"file": "x-05-service.yaml", "object": SVC},
            {"file": "x-01-secret.yaml", "object": SECRET},
            {"file": "x-00-namespace.yaml", "object": NS, "render": False},
        ]
    )


def write(out: Path, given=None, **kw) -> dict:
    return write_manifests(entries() if given is None else given, str(out), dump, **kw)


def tree(out: Path) -> dict[str, tuple[int, bytes]]:
    return {p.name: (stat.S_IMODE(p.stat().st_mode), p.read_bytes()) for p in sorted(out.iterdir())}


def test_writes_each_rendered_entry_with_its_mode_and_the_text_the_template_wrote(tmp_path: Path) -> None:
    out = tmp_path / "out" / "manifests"
    result = write(out)
    assert result["changed"] is True
    assert sorted(result["written"]) == ["x-01-secret.yaml", "x-03-configmap.yaml", "x-05-service.yaml"]
    assert result["unchanged"] == [] and result["removed"] == []
    assert stat.S_IMODE(out.stat().st_mode) == 0o755
    files = tree(out)
    assert set(files) == {"x-01-secret.yaml", "x-03-configmap.yaml", "x-05-service.yaml"}  # no render: false
    assert files["x-01-secret.yaml"][0] == 0o600
    assert files["x-03-configmap.yaml"] == (0o644, CM.encode())  # content as given
    # an object as the role's copy task wrote it: "---" and to_nice_yaml(indent=2, sort_keys=false)
    assert files["x-05-service.yaml"] == (
        0o644,
        b"---\napiVersion: v1\nkind: Service\nmetadata:\n  name: svc\nspec:\n  ports:\n  - port: 80\n",
    )
    assert manifest_text({"content": None, "object": SVC}, dump).encode() == files["x-05-service.yaml"][1]


def test_a_second_write_changes_nothing_and_touches_no_file(tmp_path: Path) -> None:
    write(tmp_path)
    inodes = {p.name: p.stat().st_ino for p in tmp_path.iterdir()}
    again = write(tmp_path, diff=True)
    assert again["changed"] is False
    assert again["written"] == [] and again["removed"] == []
    assert sorted(again["unchanged"]) == ["x-01-secret.yaml", "x-03-configmap.yaml", "x-05-service.yaml"]
    assert again["diff"] == []
    assert {p.name: p.stat().st_ino for p in tmp_path.iterdir()} == inodes  # not even rewritten


def test_a_changed_content_or_mode_is_rewritten_and_only_that_file(tmp_path: Path) -> None:
    write(tmp_path)
    (tmp_path / "x-03-configmap.yaml").write_text("stale\n")
    os.chmod(tmp_path / "x-01-secret.yaml", 0o644)  # a Secret left readable
    keep_inode = (tmp_path / "x-05-service.yaml").stat().st_ino
    result = write(tmp_path)
    assert result["changed"] is True
    assert sorted(result["written"]) == ["x-01-secret.yaml", "x-03-configmap.yaml"]
    assert result["unchanged"] == ["x-05-service.yaml"]
    assert tree(tmp_path)["x-03-configmap.yaml"] == (0o644, CM.encode())
    assert tree(tmp_path)["x-01-secret.yaml"][0] == 0o600
    assert (tmp_path / "x-05-service.yaml").stat().st_ino == keep_inode
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temporary file left


def test_check_mode_writes_nothing_and_reports_what_it_would(tmp_path: Path) -> None:
    out = tmp_path / "manifests"
    first = write(out, check_mode=True, diff=True)
    assert not out.exists()  # not even the directory
    assert first["changed"] is True
    assert sorted(first["written"]) == ["x-01-secret.yaml", "x-03-configmap.yaml", "x-05-service.yaml"]
    assert first["diff"][0]["after"] == {"path": str(out), "state": "directory", "mode": "0755"}

    write(out)
    (out / "x-03-configmap.yaml").write_text("stale\n")
    (out / "x-07-daemonset-arm64.yaml").write_text("old\n")
    before = tree(out)
    result = write(out, stale_pattern="x-*.yaml", check_mode=True, diff=True)
    assert tree(out) == before
    assert result["changed"] is True
    assert result["written"] == ["x-03-configmap.yaml"] and result["removed"] == ["x-07-daemonset-arm64.yaml"]
    (text,) = [d for d in result["diff"] if not isinstance(d.get("after"), dict)]
    assert (text["before"], text["after"]) == ("stale\n", CM)
    assert {"path": str(out / "x-07-daemonset-arm64.yaml"), "state": "absent"} in [
        d.get("after") for d in result["diff"]
    ]


def test_the_stale_files_of_the_pattern_go_the_kept_and_the_others_stay(tmp_path: Path) -> None:
    write(tmp_path)
    for name in ("x-07-daemonset-arm64.yaml", "x-02-secret-old.yaml", "y-01-other-role.yaml", "README"):
        (tmp_path / name).write_text("old\n")
    (tmp_path / ".x-hidden.yaml").write_text("editor swap\n")
    (tmp_path / "x-dir.yaml").mkdir()
    (tmp_path / "x-link.yaml").symlink_to(tmp_path / "README")
    # The Secrets are written by the role's other call: named in keep, they stay.
    others = [e for e in entries() if not e["secret"]]
    result = write(tmp_path, given=others, stale_pattern="x-*.yaml", keep=["x-01-secret.yaml"])
    assert result["removed"] == ["x-02-secret-old.yaml", "x-07-daemonset-arm64.yaml"]
    assert result["changed"] is True
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == [
        ".x-hidden.yaml", "README", "x-01-secret.yaml", "x-03-configmap.yaml", "x-05-service.yaml",
        "x-dir.yaml", "x-link.yaml", "y-01-other-role.yaml",
    ]  # fmt: skip
    # An entry rendered no more (render: false) is stale too; no pattern removes nothing.
    (tmp_path / "x-00-namespace.yaml").write_text("old\n")
    assert write(tmp_path, stale_pattern="x-*.yaml")["removed"] == ["x-00-namespace.yaml"]
    (tmp_path / "x-00-namespace.yaml").write_text("old\n")
    assert write(tmp_path)["removed"] == []


def test_no_secret_content_in_the_result_nor_its_diff(tmp_path: Path) -> None:
    for what in ("created", "changed"):
        result = write(tmp_path, diff=True)
        flat = json.dumps(result)
        assert SECRET_VALUE not in flat
        secret_diffs = [d for d in result["diff"] if "x-01-secret.yaml" in json.dumps(d)]
        assert len(secret_diffs) == 1 and set(secret_diffs[0]) == {"prepared"}
        assert f"{what}; content not shown" in secret_diffs[0]["prepared"]
        (tmp_path / "x-01-secret.yaml").write_text(f"stringData: {{key: {SECRET_VALUE}-old}}\n")
    assert SECRET_VALUE in (tmp_path / "x-01-secret.yaml").read_text()  # it was written, all the same


def test_a_large_file_is_diffed_by_size_only(tmp_path: Path) -> None:
    big = [{"file": "big.yaml", "content": CM + "# " + "x" * 300 + "\n"}]
    result = write_manifests(apply_order(big), str(tmp_path), dump, diff=True, diff_limit=200)
    (text,) = [d for d in result["diff"] if not isinstance(d.get("after"), dict)]
    assert text.get("src_larger") == 200 and "after" not in text


def test_errors_name_the_path_never_the_content(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    with pytest.raises(WriteError, match=r"manifests directory .*/file is not a directory"):
        write(tmp_path / "file")
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "x-01-secret.yaml").mkdir()  # something in the Secret's way
    with pytest.raises(WriteError, match=r"cannot .* .*/m/x-01-secret\.yaml") as caught:
        write(tmp_path / "m")
    assert SECRET_VALUE not in str(caught.value)
    with pytest.raises(ObjectsError, match="directory is empty"):
        write_manifests(entries(), "", dump)
    with pytest.raises(ObjectsError, match="k8s_objects entries"):
        write_manifests([{"content": CM}], str(tmp_path), dump)
