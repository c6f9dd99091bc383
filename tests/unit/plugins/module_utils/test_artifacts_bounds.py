"""A download is bounded whatever the server says (issue 31, item 7).

Real HTTP servers on loopback that send no Content-Length (the body ends when the connection
closes) or announce a false one; the fetch goes through Ansible's real ``open_url`` as the
module's does. The body must stop at the size the lock recorded and at the free space less the
reserve: no more than that is ever written, and the partial file is removed.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from ansible.module_utils.urls import open_url
from ansible_collections.llmfleet.cluster.plugins.module_utils import artifacts as A

from tests.support.hostile_http import Endless

MIB = 1024 * 1024


def _opener():
    return A.make_opener(open_url, timeout=10, validate_certs=True)


PIN = hashlib.sha256(b"the real model").hexdigest()


def test_no_content_length_stops_at_the_size_the_lock_recorded(tmp_path: Path) -> None:
    dest = tmp_path / "model.gguf"
    part = Path(f"{dest}.part")
    with (
        Endless(8 * MIB) as server,
        pytest.raises(A.DownloadError, match=r"more than the 1048576 bytes the pin recorded"),
    ):
        A.fetch(_opener(), server.url, str(dest), PIN, size=MIB)
    assert not dest.exists() and not part.exists()


def test_no_content_length_stops_at_free_space_less_the_reserve(tmp_path: Path) -> None:
    """No size known: the probe says 3 MiB are free and 1 MiB must stay free: 2 MiB at most."""
    dest = tmp_path / "model.gguf"
    part = Path(f"{dest}.part")
    with (
        Endless(8 * MIB) as server,
        pytest.raises(A.DiskSpaceError, match=r"more than the 2\.0 MiB that fit"),
    ):
        A.fetch(_opener(), server.url, str(dest), PIN, free_mib=3, reserve_mib=1)
    assert not dest.exists() and not part.exists()


def test_the_bound_holds_while_writing_not_only_at_the_end(tmp_path: Path) -> None:
    """The .part never grows past the bound (a check after the transfer fills the disk first)."""
    dest = tmp_path / "model.gguf"
    part = Path(f"{dest}.part")
    seen: list[int] = []
    with Endless(6 * MIB) as server:
        opener = _opener()

        def measuring(url, headers):
            response = opener(url, headers)
            read = response.read

            def read_and_measure(n: int) -> bytes:
                seen.append(part.stat().st_size if part.exists() else 0)
                return read(n)

            response.read = read_and_measure
            return response

        with pytest.raises(A.DownloadError):
            A.fetch(measuring, server.url, str(dest), PIN, size=2 * MIB)
    assert seen and max(seen) <= 2 * MIB


def test_a_content_length_that_is_not_the_pinned_size_is_refused_before_writing(tmp_path: Path) -> None:
    dest = tmp_path / "model.gguf"
    with (
        Endless(2 * MIB, announce=2 * MIB) as server,
        pytest.raises(A.DownloadError, match=r"announces 2097152 bytes, the pin recorded 1048576"),
    ):
        A.fetch(_opener(), server.url, str(dest), PIN, size=MIB)
    part = Path(f"{dest}.part")
    assert not dest.exists() and (not part.exists() or part.stat().st_size == 0)


def test_a_body_of_the_pinned_size_is_verified_and_kept(tmp_path: Path) -> None:
    dest = tmp_path / "model.gguf"
    data = b"\0" * (MIB + 5)
    with Endless(len(data)) as server:
        result = A.fetch(_opener(), server.url, str(dest), hashlib.sha256(data).hexdigest(), size=len(data))
    assert result["size"] == len(data) and dest.read_bytes() == data
