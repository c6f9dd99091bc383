"""The recorded machine trees: stored in a form ansible-test accepts, read back in the machine's."""

from __future__ import annotations

import filecmp
import os
import subprocess
import sys
from pathlib import Path

import pytest
from ansible_collections.llmfleet.cluster.plugins.module_utils import hostinfo

from tests.support import host_trees

STORED = host_trees.STORED
# What ansible-test's no-illegal-filenames test refuses in a name (Windows' rules).
ILLEGAL = set('<>:"\\|?*') | {chr(i) for i in range(32)}


def _entries(root: Path) -> list[Path]:
    return sorted(Path(d, n) for d, dirs, files in os.walk(root) for n in dirs + files)


def test_stored_trees_have_no_illegal_names_and_no_directory_symlinks() -> None:
    entries = _entries(STORED)
    assert len(entries) > 500
    bad = [str(p) for p in entries if ILLEGAL & set(p.name) or p.name.endswith((".", " "))]
    assert not bad
    links = [p for p in entries if p.is_symlink()]
    assert links, "the bound drivers' links are recorded"
    for link in links:
        assert link.resolve().is_file(), f"{link} must point at a file inside the tree"
        assert link.resolve().is_relative_to(STORED), link


def test_names_round_trip() -> None:
    for name in ("0000:0b:00.0", "100%", "a%3Ab", "plain", "%25:%"):
        assert host_trees.machine_name(host_trees.stored_name(name)) == name
        assert ":" not in host_trees.stored_name(name)
    assert host_trees.stored_name("0000:00:02.0") == "0000%3A00%3A02.0"
    assert host_trees.machine_path("sys/bus/pci/devices/0000%3A00%3A02.0/class") == (
        "sys/bus/pci/devices/0000:00:02.0/class"
    )


def test_materialised_trees_carry_the_machines_names(tmp_path: Path) -> None:
    root = host_trees.materialise(tmp_path, ["nvidia-rtx3090", "n100-minipc"])
    assert sorted(p.name for p in root.iterdir()) == ["n100-minipc", "nvidia-rtx3090"]
    gpu_dir = root / "nvidia-rtx3090/sys/bus/pci/devices/0000:0b:00.0"
    assert sorted(p.name for p in gpu_dir.iterdir()) == ["class", "device", "driver", "vendor"]
    assert os.readlink(gpu_dir / "driver") == "../../../../bus/pci/drivers/nvidia"
    assert (root / "nvidia-rtx3090/proc/driver/nvidia/gpus/0000:0b:00.0/information").is_file()
    assert not [p for p in _entries(root) if "%" in p.name]
    # the probe on the materialised tree sees the PCI address as sysfs spells it
    (gpu,) = hostinfo.probe(str(root / "nvidia-rtx3090"))["accelerators"]
    assert (gpu["pci_address"], gpu["driver"], gpu["model"]) == (
        "0000:0b:00.0",
        "nvidia",
        "NVIDIA GeForce RTX 3090",
    )
    (igpu,) = hostinfo.probe(str(root / "n100-minipc"))["accelerators"]
    assert (igpu["pci_address"], igpu["driver"]) == ("0000:00:02.0", "i915")


def test_recorded_hosts_holds_every_tree_once_per_process() -> None:
    root = host_trees.recorded_hosts()
    assert host_trees.recorded_hosts() is root
    assert sorted(p.name for p in root.iterdir()) == host_trees.tree_names()
    assert len(host_trees.tree_names()) == 22


def test_an_unknown_tree_is_refused(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="no recorded tree nosuch"):
        host_trees.materialise(tmp_path, ["nosuch"])


def test_assemble_rewrites_the_stored_trees_exactly(tmp_path: Path) -> None:
    """The committed trees are what assemble.py writes: edit the script, not the files."""
    subprocess.run([sys.executable, str(STORED / "assemble.py"), str(tmp_path)], check=True)
    written = {p.relative_to(tmp_path) for p in _entries(tmp_path)}
    stored = {p.relative_to(STORED) for p in _entries(STORED)} - {Path("README.md"), Path("assemble.py")}
    stored = {p for p in stored if "__pycache__" not in p.parts}
    assert written == stored
    for rel in sorted(written):
        a, b = tmp_path / rel, STORED / rel
        if a.is_symlink() or b.is_symlink():
            assert os.readlink(a) == os.readlink(b), rel
        elif a.is_file():
            assert filecmp.cmp(a, b, shallow=False), rel
