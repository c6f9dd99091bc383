"""Hypothesis over mutated real GGUF headers: only the reader's own GgufError comes out.

The headers are those of the generated test models (written by the gguf package, the layout
llama.cpp reads) and of a hand-built one; each example overwrites, truncates, inserts or
deletes bytes, or plants a boundary value (0, 2^31, 2^32 - 1, 2^63, 2^64 - 1, inf, nan) in a
32- or 64-bit word anywhere in the header. Whatever the mutation, ``read_layout`` returns a
layout whose sizes are non-negative and within the module's own limits, or raises GgufError
naming the file, and nothing else: no struct.error, IndexError, OverflowError, MemoryError,
UnicodeDecodeError, ValueError or TypeError.
"""

from __future__ import annotations

import functools
import math
import pathlib
import struct

import pytest
from ansible_collections.llmfleet.cluster.plugins.module_utils import gguf_layout as gl
from gguf import GGUFReader
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support import gguf_craft as gc
from tests.support.gguf_gen import SHAPES, write_tiny_llama

_WORDS32 = [0, 1, 2**31 - 1, 2**31, 2**32 - 1]
_WORDS64 = [0, 1, 2**31, 2**32, 2**40, 2**62, 2**63, 2**64 - 1]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> pathlib.Path:
    return tmp_path_factory.mktemp("fuzz")


@functools.cache
def _originals(base: pathlib.Path) -> tuple[tuple[bytes, int, tuple[int, ...]], ...]:
    """(file bytes, header length, anchors) of each source model. The anchors are where each part
    of each metadata entry and tensor entry starts (a length, a name, a type, a value, a dim, an
    offset), found by the gguf package's reader: a mutation there changes a count, a type or a
    value rather than a letter of a token."""
    out = []
    for shape in SHAPES[:3]:
        path = write_tiny_llama(str(base / shape.filename), shape)
        with open(path, "rb") as handle:
            data = handle.read()
        out.append((data, gl.read_layout(path).data_offset, _anchors(path)))
    meta = gc.llama_meta(
        general__alignment=(gc.U32, 32),
        llama__attention__sliding_window=(gc.U32, 64),
        llama__attention__sliding_window_pattern=(gc.ARRAY, (gc.BOOL, [True, False])),
        llama__attention__key_length=(gc.U32, 8),
        llama__vocab_size=(gc.U32, 16),
        tokenizer__ggml__tokens=(gc.ARRAY, (gc.STRING, ["a", "b", "c"])),
        tokenizer__ggml__scores=(gc.ARRAY, (gc.F32, [0.5, 1.5, math.pi])),
    )
    data = gc.gguf_bytes(meta, gc.llama_tensors())
    (base / "crafted.gguf").write_bytes(data)
    path = str(base / "crafted.gguf")
    out.append((data, gl.read_layout(path).data_offset, _anchors(path)))
    return tuple(out)


def _anchors(path: str) -> tuple[int, ...]:
    reader = GGUFReader(path)
    out = set()
    for field in [*reader.fields.values(), *(t.field for t in reader.tensors)]:
        pos = field.offset
        for part in field.parts[:12]:
            out.add(pos)
            pos += part.nbytes
    return tuple(sorted(out))


@st.composite
def mutations(draw):
    kind = draw(st.sampled_from(["bytes", "word32", "word64", "float", "truncate", "insert", "delete"]))
    # where: anywhere in the header (a fraction of it) or at an anchor (its index, modulo)
    where = (
        draw(st.floats(min_value=0.0, max_value=1.0, allow_nan=False)),
        draw(st.none() | st.integers(0, 10**6)),
    )
    if kind == "bytes":
        return kind, where, draw(st.binary(min_size=1, max_size=16))
    if kind == "word32":
        return kind, where, struct.pack("<I", draw(st.sampled_from(_WORDS32) | st.integers(0, 2**32 - 1)))
    if kind == "word64":
        return kind, where, struct.pack("<Q", draw(st.sampled_from(_WORDS64) | st.integers(0, 2**64 - 1)))
    if kind == "float":
        value = draw(st.sampled_from([math.inf, -math.inf, math.nan, 3e38, -1.0]))
        return kind, where, struct.pack(draw(st.sampled_from(["<f", "<d"])), value)
    if kind == "insert":
        return kind, where, draw(st.binary(min_size=1, max_size=64))
    return kind, where, draw(st.integers(min_value=1, max_value=64))


def _mutate(data: bytes, header: int, anchors: tuple[int, ...], mutation) -> bytes:
    kind, where, arg = mutation
    fraction, anchor = where
    at = min(header - 1, int(fraction * header) if anchor is None else anchors[anchor % len(anchors)])
    if kind == "truncate":
        return data[:at]
    if kind == "insert":
        return data[:at] + arg + data[at:]
    if kind == "delete":
        return data[:at] + data[at + arg :]
    return data[:at] + arg + data[at + len(arg) :]


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(which=st.integers(min_value=0, max_value=3), steps=st.lists(mutations(), min_size=1, max_size=3))
def test_mutated_headers_give_a_layout_or_a_gguf_error(workdir, which, steps) -> None:
    data, header, anchors = _originals(workdir)[which]
    for step in steps:
        data = _mutate(data, header, anchors, step)
    path = workdir / "mutated.gguf"
    path.write_bytes(data)
    try:
        layout = gl.read_layout(str(path))
    except gl.GgufError as err:
        assert str(path) in str(err)
        assert len(str(err)) < 1000
        return
    assert 1 <= layout.n_layer <= 4096
    assert all(t.nbytes >= 0 for t in layout.tensors)
    assert min(layout.layer_bytes) >= 0 and layout.token_embd_bytes >= 0 and layout.other_bytes >= 0
    assert layout.data_offset <= layout.file_bytes == len(data)
    assert layout.weights_bytes <= len(data)
