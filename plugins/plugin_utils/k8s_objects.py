# -*- coding: utf-8 -*-
# Copyright: llmfleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The objects a role hands to llmfleet.cluster.k8s_objects, checked and put in apply order (pure).

Every Kubernetes target writes its objects through that one role (render into files, or apply
server-side): llama_rpc and chat_ui hand it their rendered templates (``content``, YAML text),
vllm_lws its Python-built objects (``object``, a dict). Here each entry gets its parsed object, its
kind and name, whether it is a Secret (written 0600, applied with no_log) and whether it is
written when rendering (``render``; chat_ui's Namespace is applied only), and the list is ordered
as the cluster needs it: Namespaces, then Secrets, then the rest (each group in the given order).

``write_manifests`` is the render: on the controller, no module run per file (the action plugin
llmfleet.cluster.k8s_objects_write calls it), each file written atomically and only when its
content or mode differs, the stale files of an earlier render removed; its result and its diff
name files only for a Secret.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import contextlib
import fnmatch
import os
import stat
import tempfile

import yaml

DIR_MODE = 0o755
FILE_MODE = 0o644
SECRET_MODE = 0o600


class ObjectsError(ValueError):
    """An entry the role cannot write or apply; the message names the entry and the value."""


class WriteError(ObjectsError):
    """A manifest file or the directory could not be written; the message names the path, never the content."""


def _entry(index, raw):
    where = "k8s_objects: manifest {0}".format(index)
    if not isinstance(raw, dict):
        raise ObjectsError("{0} is not a dict: {1!r}".format(where, raw)[:300])
    name = raw.get("file")
    if not isinstance(name, str) or not name or "/" in name:
        raise ObjectsError("{0}: file must be a plain file name, got {1!r}".format(where, name))
    where = "{0} ({1})".format(where, name)
    has_content, has_object = raw.get("content") is not None, raw.get("object") is not None
    if has_content == has_object:
        raise ObjectsError("{0}: give exactly one of content (YAML text) or object (a dict)".format(where))
    if has_content:
        if not isinstance(raw["content"], str):
            raise ObjectsError(
                "{0}: content must be YAML text, got {1!r}".format(where, raw["content"])[:300]
            )
        try:
            obj = yaml.safe_load(raw["content"])
        except yaml.YAMLError as exc:
            raise ObjectsError("{0}: content is not YAML: {1}".format(where, exc)) from exc
    else:
        obj = raw["object"]
    if not isinstance(obj, dict) or not obj.get("kind") or not (obj.get("metadata") or {}).get("name"):
        raise ObjectsError(
            "{0}: not a Kubernetes object with a kind and a metadata.name: {1!r}".format(where, obj)[:300]
        )
    kind = str(obj["kind"])
    secret = raw.get("secret", kind == "Secret")
    render = raw.get("render", True)
    for key, value in (("secret", secret), ("render", render)):
        if not isinstance(value, bool):
            raise ObjectsError("{0}: {1} must be true or false, got {2!r}".format(where, key, value))
    if kind == "Secret" and not secret:
        raise ObjectsError(
            "{0}: a Secret must be flagged secret (it is written 0600, logged never)".format(where)
        )
    return {
        "file": name,
        "kind": kind,
        "name": str(obj["metadata"]["name"]),
        "label": "{0} {1}".format(kind, name),
        "secret": secret,
        "render": render,
        "content": raw["content"] if has_content else None,
        "object": obj,
    }


def apply_order(entries):
    """The entries checked, each with its object, kind, name and flags, in apply order."""
    if not isinstance(entries, list):
        raise ObjectsError("k8s_objects: the manifests must be a list, got {0!r}".format(entries)[:300])
    out = [_entry(index, raw) for index, raw in enumerate(entries)]
    files = [e["file"] for e in out]
    twice = sorted({f for f in files if files.count(f) > 1})
    if twice:
        raise ObjectsError("k8s_objects: file names given twice: {0}".format(", ".join(twice)))

    def stage(entry):
        return 0 if entry["kind"] == "Namespace" else 1 if entry["secret"] else 2

    return sorted(out, key=stage)  # sorted() is stable: the given order within each group


def stale_files(found, entries, manifest_dir):
    """The paths of earlier renders (``found``) that this render no longer writes."""
    keep = {e["file"] for e in entries if e.get("render", True)}
    prefix = manifest_dir.rstrip("/") + "/"
    return sorted(p for p in found if not (p.startswith(prefix) and p[len(prefix) :] in keep))


def manifest_text(entry, dump):
    """The file's text: the given YAML text as written, or ``---`` and ``dump(object)``."""
    if entry.get("content") is not None:
        return entry["content"]
    return "---\n" + dump(entry["object"])


def found_files(manifest_dir, pattern):
    """The regular, not hidden files of ``manifest_dir`` whose name matches the shell ``pattern``
    (as ``ansible.builtin.find`` with ``patterns`` finds them), as paths, sorted."""
    if not pattern or not os.path.isdir(manifest_dir):
        return []
    found = []
    for name in sorted(os.listdir(manifest_dir)):
        path = os.path.join(manifest_dir, name)
        if (
            not name.startswith(".")
            and fnmatch.fnmatch(name, pattern)
            and stat.S_ISREG(os.lstat(path).st_mode)
        ):
            found.append(path)
    return found


def _read(path):
    """The file's bytes and mode, or (None, None) when there is none."""
    try:
        with open(path, "rb") as handle:
            return handle.read(), stat.S_IMODE(os.fstat(handle.fileno()).st_mode)
    except FileNotFoundError:
        return None, None


def _atomic_write(path, data, mode):
    """``data`` into ``path`` with ``mode``, through a temporary file of the same directory and a rename."""
    directory, name = os.path.split(path)
    fd, tmp = tempfile.mkstemp(prefix="." + name + ".", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as handle:
            os.fchmod(handle.fileno(), mode)
            handle.write(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _text_diff(path, before, after, limit):
    diff = {"before_header": path, "after_header": path}
    if limit and before is not None and len(before) > limit:
        diff["dst_larger"] = limit
    elif limit and len(after) > limit:
        diff["src_larger"] = limit
    else:
        diff["before"] = "" if before is None else before.decode("utf-8", "replace")
        diff["after"] = after.decode("utf-8", "replace")
    return diff


def _state_diff(path, before, after):
    return {"before_header": path, "after_header": path, "before": before, "after": after}


def _make_dir(manifest_dir, check_mode):
    """Make the directory 0755 (as ``ansible.builtin.file`` ``state: directory``); its diff, or None."""
    try:
        st = os.stat(manifest_dir)
    except FileNotFoundError:
        st = None
    except OSError as exc:
        raise WriteError(
            "k8s_objects: cannot read the manifests directory {0}: {1}".format(manifest_dir, exc)
        ) from exc
    if st is not None and not stat.S_ISDIR(st.st_mode):
        raise WriteError("k8s_objects: the manifests directory {0} is not a directory".format(manifest_dir))
    if st is not None and stat.S_IMODE(st.st_mode) == DIR_MODE:
        return None
    before = {"path": manifest_dir, "state": "absent"}
    if st is not None:
        before = {"path": manifest_dir, "state": "directory", "mode": "0%o" % stat.S_IMODE(st.st_mode)}
    if not check_mode:
        try:
            os.makedirs(manifest_dir, exist_ok=True)
            os.chmod(manifest_dir, DIR_MODE)
        except OSError as exc:
            raise WriteError(
                "k8s_objects: cannot make the manifests directory {0}: {1}".format(manifest_dir, exc)
            ) from exc
    return _state_diff(
        manifest_dir, before, {"path": manifest_dir, "state": "directory", "mode": "0%o" % DIR_MODE}
    )


def _write_entry(entry, manifest_dir, dump, check_mode, diff_limit):
    """Write one entry when its content or mode differs: (written, its diff or None)."""
    path = os.path.join(manifest_dir, entry["file"])
    secret = bool(entry.get("secret"))
    mode = SECRET_MODE if secret else FILE_MODE
    data = manifest_text(entry, dump).encode("utf-8")
    try:
        before, old_mode = _read(path)
    except OSError as exc:
        raise WriteError("k8s_objects: cannot read {0}: {1}".format(path, exc)) from exc
    if before == data and old_mode == mode:
        return False, None
    if not check_mode:
        try:
            if before == data:
                os.chmod(path, mode)
            else:
                _atomic_write(path, data, mode)
        except OSError as exc:
            raise WriteError("k8s_objects: cannot write {0}: {1}".format(path, exc)) from exc
    if before == data:
        return True, None  # the mode alone (a diff of the content would be empty)
    if secret:
        what = "created" if before is None else "changed"
        return True, {
            "prepared": "k8s_objects: {0} (a Secret, 0600) {1}; content not shown\n".format(path, what)
        }
    return True, _text_diff(path, before, data, diff_limit)


def _remove(path, check_mode):
    if check_mode:
        return
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    except OSError as exc:
        raise WriteError("k8s_objects: cannot remove {0}: {1}".format(path, exc)) from exc


def write_manifests(
    entries, manifest_dir, dump, stale_pattern="", keep=(), check_mode=False, diff=False, diff_limit=0
):
    """Write each entry to be rendered into ``manifest_dir`` and remove the stale files.

    ``entries`` are ``apply_order`` entries (``render: false`` ones are skipped); a Secret (``secret``)
    is written 0600, the rest 0644, each only when its content or mode differs, atomically, an
    ``object`` as ``manifest_text`` with ``dump`` makes it. The directory is made (0755) when missing.
    The files matching ``stale_pattern`` that this call does not write and ``keep`` does not name
    (the files another call of the same render writes) are removed. ``check_mode`` writes and
    removes nothing and reports the same. The result names files only: ``written`` (created or
    changed, content or mode), ``unchanged``, ``removed`` (file names), ``changed``, and with
    ``diff`` the ``diff`` list (unified diffs of text up to ``diff_limit`` bytes, 0 for any size),
    whose entry for a Secret says only its path.
    """
    if not isinstance(manifest_dir, str) or not manifest_dir:
        raise ObjectsError("k8s_objects: the manifests directory is empty; nothing was rendered")
    if not isinstance(entries, list) or not all(isinstance(e, dict) and "file" in e for e in entries):
        raise ObjectsError(
            "k8s_objects: the objects must be k8s_objects entries (a list of dicts with a file)"
        )
    manifest_dir = manifest_dir.rstrip("/") or "/"
    result = {"dir": manifest_dir, "written": [], "unchanged": [], "removed": []}
    diffs = []
    made = _make_dir(manifest_dir, check_mode)
    if made:
        diffs.append(made)
    for entry in entries:
        if not entry.get("render", True):
            continue
        written, one = _write_entry(entry, manifest_dir, dump, check_mode, diff_limit)
        result["written" if written else "unchanged"].append(entry["file"])
        if one:
            diffs.append(one)
    kept = [e for e in entries if e.get("render", True)] + [{"file": name} for name in keep]
    try:
        stale = stale_files(found_files(manifest_dir, stale_pattern), kept, manifest_dir)
    except OSError as exc:
        raise WriteError(
            "k8s_objects: cannot list the manifests directory {0}: {1}".format(manifest_dir, exc)
        ) from exc
    for path in stale:
        _remove(path, check_mode)
        result["removed"].append(os.path.basename(path))
        diffs.append(_state_diff(path, {"path": path, "state": "file"}, {"path": path, "state": "absent"}))
    result["changed"] = bool(made or result["written"] or result["removed"])
    if diff:
        result["diff"] = diffs
    return result
