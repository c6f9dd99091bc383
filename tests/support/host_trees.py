"""The recorded machine trees of tests/fixtures/hosts/, in the form the probe reads.

The trees are stored in a form that ansible-test sanity (and every OS's file system) accepts:

- a `:` in a file or directory name (a PCI address such as ``0000:00:02.0``) is stored as ``%3A``,
  a `%` as ``%25``;
- no symlink points at a directory: a bound driver's ``sys/bus/pci/devices/<addr>/driver`` link
  points at the file ``sys/bus/pci/drivers/<driver>``, which stands in for the driver's sysfs
  directory (the probe reads only the name the link points at).

``materialise()`` copies trees with the names mapped back; ``recorded_hosts()`` does it once per
process into a temporary directory (removed at exit) and is what the tests point the probe at.
By hand::

    python -m tests.support.host_trees /tmp/hosts            # every tree, or name some
    ansible localhost -m llmfleet.cluster.host_facts -a root=/tmp/hosts/n100-minipc
"""

from __future__ import annotations

import atexit
import functools
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Iterable
from pathlib import Path

STORED = Path(__file__).resolve().parents[1] / "fixtures" / "hosts"

_ENCODE = {"%": "%25", ":": "%3A"}
_DECODE = re.compile("%(25|3A)")


def stored_name(name: str) -> str:
    """The name a file or directory of a machine's tree is stored under."""
    return "".join(_ENCODE.get(c, c) for c in name)


def machine_name(name: str) -> str:
    """The name on the machine of a stored file or directory (the inverse of stored_name)."""
    return _DECODE.sub(lambda m: chr(int(m[1], 16)), name)


def stored_path(rel: str) -> str:
    """A path inside a machine's tree (``/``-separated) as it is stored."""
    return "/".join(stored_name(part) for part in rel.split("/"))


def machine_path(rel: str) -> str:
    """A stored path (or symlink target) as it is on the machine."""
    return "/".join(machine_name(part) for part in rel.split("/"))


def tree_names(stored: Path = STORED) -> list[str]:
    """The recorded machines: every directory beside README.md and assemble.py."""
    return sorted(p.name for p in stored.iterdir() if p.is_dir() and not p.name.startswith(("_", ".")))


def materialise(dest: Path, names: Iterable[str] | None = None, stored: Path = STORED) -> Path:
    """Copy the named trees (all by default) to ``dest/<name>`` with the machine's names."""
    dest.mkdir(parents=True, exist_ok=True)
    for name in tree_names(stored) if names is None else names:
        src_root = stored / name
        if not src_root.is_dir():
            raise FileNotFoundError(f"no recorded tree {name} in {stored}")
        for src_dir, dirs, files in os.walk(src_root):
            rel = Path(src_dir).relative_to(src_root)
            out_dir = dest / name / Path(*(machine_name(p) for p in rel.parts))
            out_dir.mkdir(parents=True, exist_ok=True)
            for entry in sorted(files) + sorted(d for d in dirs if os.path.islink(os.path.join(src_dir, d))):
                src, out = Path(src_dir, entry), out_dir / machine_name(entry)
                if src.is_symlink():
                    out.symlink_to(machine_path(os.readlink(src)))
                else:
                    shutil.copyfile(src, out)
    return dest


@functools.cache
def recorded_hosts() -> Path:
    """Every recorded tree in machine form, in a temporary directory of this process."""
    root = Path(tempfile.mkdtemp(prefix="llmfleet-hosts-"))
    atexit.register(shutil.rmtree, root, True)
    return materialise(root)


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: python -m tests.support.host_trees DEST [TREE...]")
    out = materialise(Path(sys.argv[1]), sys.argv[2:] or None)
    print("\n".join(str(out / n) for n in (sys.argv[2:] or tree_names())))
