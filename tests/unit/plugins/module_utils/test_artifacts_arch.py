"""A release built for another architecture is refused where it is installed, naming both.

An ubuntu-arm64 tarball on an x86_64 host (or the reverse) would unpack fine and then fail at the
first start with "Exec format error"; install() reads the ELF header's e_machine of the required
binaries and refuses the tree before anything is replaced.
"""

from __future__ import annotations

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
        (_elf(0x28), "e_machine 0x28"),
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
