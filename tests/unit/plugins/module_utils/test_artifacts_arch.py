"""A release built for another architecture is refused where it is installed, naming both.

An ubuntu-arm64 tarball on an x86_64 host (or the reverse) would unpack fine and then fail at the
first start with "Exec format error"; install() reads the ELF header's e_machine of the required
binaries and refuses the tree before anything is replaced.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from ansible_collections.llmfleet.cluster.plugins.module_utils import artifacts as A

from tests.unit.plugins.module_utils.test_artifacts import _tarball


def _elf(machine: int, big_endian: bool = False) -> bytes:
    """The first bytes of a 64-bit ELF shared object for ``machine`` (e_machine at offset 18)."""
    order = "big" if big_endian else "little"
    ident = b"\x7fELF" + bytes([2, 2 if big_endian else 1, 1, 0]) + bytes(8)
    return ident + (3).to_bytes(2, order) + machine.to_bytes(2, order) + bytes(44)


def _release(path: Path, machine: int) -> str:
    """A release tarball whose ggml-rpc-server and llama-server are ELF files for ``machine``."""
    return _tarball(
        path,
        worker="rpc-server",
        extra=[
            ("llama-b6000/ggml-rpc-server", "file", _elf(machine), 0o755),
            ("llama-b6000/llama-server2", "file", _elf(machine), 0o755),
        ],
    )


@pytest.mark.parametrize(
    ("data", "want"),
    [
        (_elf(0x3E), "x86_64"),
        (_elf(0xB7), "aarch64"),
        (_elf(0xB7, big_endian=True), "aarch64"),
        (_elf(0x28), "arm"),  # 32-bit ARM: what a source build on a 32-bit Raspberry Pi OS makes
        (_elf(0xF3), "e_machine 0xF3"),
        (b"#!/bin/sh\necho rpc\n", None),
        (b"\x7fELF", None),
    ],
)
def test_elf_machine_reads_e_machine(tmp_path: Path, data: bytes, want) -> None:
    path = tmp_path / "bin"
    path.write_bytes(data)
    assert A.elf_machine(str(path)) == want


def _install(tmp_path: Path, machine: int, host_machine: str, flavour: str) -> dict:
    archive = tmp_path / f"llama-b6000-bin-{flavour}.tar.gz"
    pin = _release(archive, machine)
    return A.install(
        str(tmp_path / "opt" / "b6000"),
        pin,
        archive=str(archive),
        info={"build": "b6000", "flavour": flavour},
        require_one_of=["ggml-rpc-server"],
        require=["llama-server2"],
        machine=host_machine,
        host="pi5",
    )


@pytest.mark.parametrize(
    ("machine", "host_machine", "flavour", "built", "host_is"),
    [
        (0xB7, "x86_64", "ubuntu-arm64", "aarch64", "x86_64"),
        (0x3E, "aarch64", "ubuntu-x64", "x86_64", "aarch64"),
        (0x3E, "arm64", "ubuntu-x64", "x86_64", "aarch64"),
    ],
)
def test_install_refuses_another_architecture(
    tmp_path: Path, machine: int, host_machine: str, flavour: str, built: str, host_is: str
) -> None:
    dest = tmp_path / "opt" / "b6000"
    dest.mkdir(parents=True)
    (dest / "old").write_text("kept\n")
    with pytest.raises(A.ArchitectureMismatch) as err:
        _install(tmp_path, machine, host_machine, flavour)
    message = str(err.value)
    assert message.startswith("pi5: ")
    assert f"flavour {flavour!r}" in message
    assert f"built for {built}" in message and f"this host is {host_is}" in message
    # What was there before is untouched, and no staging directory is left.
    assert sorted(p.name for p in dest.iterdir()) == ["old"]
    assert A.leftovers(str(tmp_path / "opt")) == []


@pytest.mark.parametrize(
    ("machine", "host_machine", "flavour"),
    [(0x3E, "x86_64", "ubuntu-x64"), (0xB7, "aarch64", "ubuntu-arm64"), (0xB7, "arm64", "ubuntu-arm64")],
)
def test_install_accepts_the_host_architecture(
    tmp_path: Path, machine: int, host_machine: str, flavour: str
) -> None:
    result = _install(tmp_path, machine, host_machine, flavour)
    assert result["changed"] is True and result["binary"] == "ggml-rpc-server"
    assert A.read_marker(str(tmp_path / "opt" / "b6000"))["flavour"] == flavour


# --- 32-bit ARM, the userland's architecture, and the probe's choice carried to the install ----------


def _elf32_arm() -> bytes:
    """The first bytes of a 32-bit little-endian ARM (EM_ARM, armhf) executable."""
    return (
        b"\x7fELF" + bytes([1, 1, 1, 0]) + bytes(8) + (2).to_bytes(2, "little") + (0x28).to_bytes(2, "little")
    )


def _tree(path: Path, data: bytes) -> Path:
    """A built tree (what a source build leaves in build/bin) whose binaries are ``data``."""
    path.mkdir(parents=True)
    for name in ("ggml-rpc-server", "llama-server2"):
        (path / name).write_bytes(data + bytes(64))
        (path / name).chmod(0o755)
    return path


def test_elf_machine_knows_32bit_arm() -> None:
    assert A.MACHINE_ALIASES["armv7l"] == A.MACHINE_ALIASES["armv8l"] == "arm"


@pytest.mark.parametrize("host_machine", ["armv7l", "armv8l", "armv6l"])
def test_a_source_build_on_a_32bit_arm_userland_is_installed(tmp_path: Path, host_machine: str) -> None:
    # A Raspberry Pi on 32-bit Raspberry Pi OS builds from source: armhf binaries on an arm host.
    built = _tree(tmp_path / "build" / "bin", _elf32_arm())
    got = A.install(
        str(tmp_path / "opt" / "b6000"),
        "cd" * 32,
        src_dir=str(built),
        info={"build": "b6000", "flavour": "source"},
        require_one_of=["ggml-rpc-server"],
        require=["llama-server2"],
        machine=host_machine,
        host="pi4",
    )
    assert got["changed"] is True and got["binary"] == "ggml-rpc-server"


def test_the_arm64_release_on_a_32bit_arm_userland_is_refused_pointing_to_source(tmp_path: Path) -> None:
    with pytest.raises(A.ArchitectureMismatch) as err:
        _install(tmp_path, 0xB7, "armv7l", "ubuntu-arm64")
    assert "built for aarch64, but this host is arm" in str(err.value)
    assert "(e.g. source)" in str(err.value)


def test_the_host_is_its_userland_not_its_kernel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # 32-bit Raspberry Pi OS on the 64-bit kernel: uname says aarch64, the interpreter is ARM.
    python = tmp_path / "python3"
    python.write_bytes(_elf32_arm() + bytes(64))
    monkeypatch.setattr(A.sys, "executable", str(python))
    monkeypatch.setattr(A.os, "uname", lambda: os.uname_result(("Linux", "pi4", "6.6", "#1", "aarch64")))
    assert A.userland_machine() == "arm"
    archive = tmp_path / "llama-b6000-bin-ubuntu-arm64.tar.gz"
    pin = _release(archive, 0xB7)
    with pytest.raises(A.ArchitectureMismatch, match=r"^pi4: .*built for aarch64, but this host is arm"):
        A.install(
            str(tmp_path / "opt" / "b6000"),
            pin,
            archive=str(archive),
            info={"flavour": "ubuntu-arm64"},
            require_one_of=["ggml-rpc-server"],
        )
    # An interpreter the table does not know (or none): uname decides, as before.
    monkeypatch.setattr(A.sys, "executable", "")
    assert A.userland_machine() == "aarch64"


ELF_OF_FLAVOUR = {"ubuntu-x64": 0x3E, "ubuntu-arm64": 0xB7}


@pytest.mark.parametrize(
    ("tree", "flavour", "other"),
    [("zen4-desktop", "ubuntu-x64", "ubuntu-arm64"), ("graviton3", "ubuntu-arm64", "ubuntu-x64")],
)
def test_the_probes_flavour_installs_and_the_other_architectures_is_refused(
    tmp_path: Path, tree: str, flavour: str, other: str
) -> None:
    # What the llama_cpp role does with a probed host: the flavour the probe chose (an x86_64 host
    # gets ubuntu-x64, an arm64 host ubuntu-arm64) installs on the probed architecture; the other
    # architecture's build (the arm64 host given the x86 build, and the other way round) is refused.
    from ansible_collections.llmfleet.cluster.plugins.module_utils import hostinfo

    from tests.support.host_trees import recorded_hosts

    fact = hostinfo.probe(str(recorded_hosts() / tree))
    assert fact["backends"]["llama_cpp"]["flavour"] == flavour
    assert other not in fact["backends"]["llama_cpp"]["flavours"]
    (tmp_path / "good").mkdir()
    (tmp_path / "bad").mkdir()
    good = _install(tmp_path / "good", ELF_OF_FLAVOUR[flavour], fact["arch"], flavour)
    assert good["changed"] is True
    with pytest.raises(A.ArchitectureMismatch, match=f"flavour '{other}' has ggml-rpc-server built for"):
        _install(tmp_path / "bad", ELF_OF_FLAVOUR[other], fact["arch"], other)
