"""Write GGUF bytes by hand, with any value of any type in any key (test-only).

The gguf package's writer refuses most of what a hostile or corrupt file carries (a string
where a count belongs, an array for a scalar, a type id ggml does not know, an offset past the
end), so the hostile-input tests build their files here, value by value.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any, Optional

U8, I8, U16, I16, U32, I32, F32, BOOL, STRING, ARRAY, U64, I64, F64 = range(13)
_FMT = {
    U8: "<B",
    I8: "<b",
    U16: "<H",
    I16: "<h",
    U32: "<I",
    I32: "<i",
    F32: "<f",
    BOOL: "<?",
    U64: "<Q",
    I64: "<q",
    F64: "<d",
}
# ggml type id -> (elements per block, bytes per block) for the types used here
F32_TYPE = 0
_SIZES = {0: (1, 4), 1: (1, 2)}


def _str(text: str | bytes) -> bytes:
    raw = text.encode() if isinstance(text, str) else text
    return struct.pack("<Q", len(raw)) + raw


def _value(vtype: int, value: Any) -> bytes:
    if vtype == STRING:
        return _str(value)
    if vtype == ARRAY:
        item_type, items = value
        out = struct.pack("<IQ", item_type, len(items))
        return out + b"".join(_value(item_type, v) for v in items)
    return struct.pack(_FMT[vtype], value)


def kv(key: str, vtype: int, value: Any) -> bytes:
    """One metadata entry (``value`` is ``(item_type, items)`` for an ARRAY)."""
    return _str(key) + struct.pack("<I", vtype) + _value(vtype, value)


def llama_meta(n_layer: int = 2, **override: tuple[int, Any]) -> dict[str, tuple[int, Any]]:
    """Metadata of a small valid llama; ``override`` maps a key (dots as ``__``) to (type, value),
    or to None to leave the key out."""
    meta: dict[str, Optional[tuple[int, Any]]] = {
        "general.architecture": (STRING, "llama"),
        "general.name": (STRING, "crafted"),
        "llama.block_count": (U32, n_layer),
        "llama.context_length": (U32, 128),
        "llama.embedding_length": (U32, 32),
        "llama.feed_forward_length": (U32, 64),
        "llama.attention.head_count": (U32, 4),
        "llama.attention.head_count_kv": (U32, 2),
    }
    for name, value in override.items():
        meta[name.replace("__", ".")] = value
    return {k: v for k, v in meta.items() if v is not None}


def llama_tensors(
    n_layer: int = 2, n_embd: int = 32, n_vocab: int = 16
) -> list[tuple[str, tuple[int, ...], int]]:
    """(name, dims, ggml type) of a small valid llama (F32 everywhere)."""
    out = [("token_embd.weight", (n_embd, n_vocab), F32_TYPE), ("output_norm.weight", (n_embd,), F32_TYPE)]
    for il in range(n_layer):
        out.append((f"blk.{il}.attn_norm.weight", (n_embd,), F32_TYPE))
        out.append((f"blk.{il}.attn_q.weight", (n_embd, n_embd), F32_TYPE))
    return out


def gguf_bytes(
    meta: dict[str, tuple[int, Any]],
    tensors: Sequence[tuple[str, tuple[int, ...], int]],
    offsets: Optional[dict[str, int]] = None,
    alignment: int = 32,
    counts: Optional[tuple[int, int]] = None,
) -> bytes:
    """A whole GGUF v3 file: header, tensor table, padding and zero data.

    ``offsets`` overrides a tensor's data offset; ``counts`` overrides (n_tensors, n_kv) in the
    header. Tensors of a type this module does not size get 64 bytes of data."""
    table = []
    pos = 0
    for name, dims, ggml_type in tensors:
        block, size = _SIZES.get(ggml_type, (1, 0))
        n = 1
        for d in dims:
            n *= d
        nbytes = n // block * size if ggml_type in _SIZES else 64
        nbytes = nbytes if nbytes <= 1 << 20 else 64  # an absurd shape gets no data behind it
        table.append((name, dims, ggml_type, (offsets or {}).get(name, pos)))
        pos += (nbytes + alignment - 1) // alignment * alignment
    n_tensors, n_kv = counts or (len(tensors), len(meta))
    head = b"GGUF" + struct.pack("<IQQ", 3, n_tensors, n_kv)
    head += b"".join(kv(k, t, v) for k, (t, v) in meta.items())
    for name, dims, ggml_type, offset in table:
        head += _str(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims)
        head += struct.pack("<IQ", ggml_type, offset)
    head += b"\0" * (-len(head) % alignment)
    return head + b"\0" * pos
