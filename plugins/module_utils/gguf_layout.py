# -*- coding: utf-8 -*-
# Copyright: llmfleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Read the layout of a GGUF model: hyperparameters and the bytes of every tensor, per layer.

Only the header and the tensor table are read, from a local file or from an HTTP(S) URL with
Range requests (the window grows until the table parses), so planning a 20 GB model transfers a
few MB. The parser is small and stdlib-only; it is tested against the `gguf` package's
GGUFReader on generated files and on the real Gemma 3 270M.

What llama.cpp does with the tensors (src/llama-model.cpp, the rule the planner relies on):
``token_embd.*`` is the input layer and always stays on the head's CPU; ``blk.N.*`` belong to
repeating layer N; ``output.weight`` and ``output_norm.*`` form the output layer (slot n_layer).
When a model has no ``output.weight`` the output layer is a copy of the token embeddings (tied).
"""

from __future__ import absolute_import, annotations, division, print_function

import dataclasses
import os
import re
import struct
import urllib.error
import urllib.request
from typing import Any, Callable, Dict, List, Optional, Tuple

__metaclass__ = type

GGUF_MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32
# First Range request size and the cap of one request when the window grows.
FIRST_WINDOW = 256 * 1024
MAX_WINDOW = 2 * 1024 * 1024
# Refuse headers larger than this (a corrupt count would otherwise read a whole file).
MAX_HEADER_BYTES = 512 * 1024 * 1024

# ggml type id -> (name, elements per block, bytes per block). From ggml's type traits.
GGML_TYPES: Dict[int, Tuple[str, int, int]] = {
    0: ("F32", 1, 4),
    1: ("F16", 1, 2),
    2: ("Q4_0", 32, 18),
    3: ("Q4_1", 32, 20),
    6: ("Q5_0", 32, 22),
    7: ("Q5_1", 32, 24),
    8: ("Q8_0", 32, 34),
    9: ("Q8_1", 32, 40),
    10: ("Q2_K", 256, 84),
    11: ("Q3_K", 256, 110),
    12: ("Q4_K", 256, 144),
    13: ("Q5_K", 256, 176),
    14: ("Q6_K", 256, 210),
    15: ("Q8_K", 256, 292),
    16: ("IQ2_XXS", 256, 66),
    17: ("IQ2_XS", 256, 74),
    18: ("IQ3_XXS", 256, 98),
    19: ("IQ1_S", 256, 50),
    20: ("IQ4_NL", 32, 18),
    21: ("IQ3_S", 256, 110),
    22: ("IQ2_S", 256, 82),
    23: ("IQ4_XS", 256, 136),
    24: ("I8", 1, 1),
    25: ("I16", 1, 2),
    26: ("I32", 1, 4),
    27: ("I64", 1, 8),
    28: ("F64", 1, 8),
    29: ("IQ1_M", 256, 56),
    30: ("BF16", 1, 2),
    34: ("TQ1_0", 256, 54),
    35: ("TQ2_0", 256, 66),
    39: ("MXFP4", 32, 17),
}


# Architectures whose sliding-window layout llama.cpp sets in code rather than reading it from
# the file: every n-th layer is dense (full attention), the others use the sliding window.
SWA_DENSE_EVERY: Dict[str, int] = {"gemma2": 2, "gemma3": 6, "cohere2": 4, "gemma3n": 5}

_BLK_RE = re.compile(r"^blk\.(\d+)\.")

# GGUF metadata value types.
_SCALARS: Dict[int, Tuple[str, int]] = {
    0: ("<B", 1),
    1: ("<b", 1),
    2: ("<H", 2),
    3: ("<h", 2),
    4: ("<I", 4),
    5: ("<i", 4),
    6: ("<f", 4),
    7: ("<?", 1),
    10: ("<Q", 8),
    11: ("<q", 8),
    12: ("<d", 8),
}
_STRING = 8
_ARRAY = 9
# Arrays longer than this are kept as their length only (vocabularies, merges, scores).
_KEEP_ARRAY = 4096


class GgufError(Exception):
    """The file or URL is not a GGUF model this reader understands (message names the source)."""


class _NeedMore(Exception):
    pass


@dataclasses.dataclass(frozen=True)
class ArrayInfo:
    """A metadata array too long to keep: its element type and length."""

    item_type: int
    length: int


@dataclasses.dataclass(frozen=True)
class TensorInfo:
    name: str
    ggml_type: int
    dims: Tuple[int, ...]
    offset: int
    nbytes: int

    @property
    def type_name(self) -> str:
        return GGML_TYPES.get(self.ggml_type, ("type%d" % self.ggml_type, 0, 0))[0]


@dataclasses.dataclass
class GgufLayout:
    """What the planner needs to know about a model (sizes in bytes)."""

    source: str
    architecture: str
    name: Optional[str]
    file_bytes: Optional[int]
    data_offset: int
    bytes_read: int
    n_layer: int
    n_embd: int
    n_ff: int
    n_head: List[int]
    n_head_kv: List[int]
    head_dim_k: int
    head_dim_v: int
    n_vocab: int
    n_ctx_train: int
    sliding_window: int
    swa_layers: List[bool]
    tied_output: bool
    layer_bytes: List[int]
    layer_largest_tensor: List[int]
    token_embd_bytes: int
    output_bytes: int
    output_norm_bytes: int
    other_bytes: int
    metadata: Dict[str, Any] = dataclasses.field(default_factory=dict, repr=False)
    tensors: List[TensorInfo] = dataclasses.field(default_factory=list, repr=False)

    @property
    def weights_bytes(self) -> int:
        """Bytes of all tensors in the file (the tied output copy not counted)."""
        out = 0 if self.tied_output else self.output_bytes
        return sum(self.layer_bytes) + self.token_embd_bytes + out + self.output_norm_bytes + self.other_bytes

    @property
    def output_layer_bytes(self) -> int:
        """Bytes of the output layer as llama.cpp allocates it (slot n_layer)."""
        return self.output_bytes + self.output_norm_bytes

    def n_embd_k_gqa(self, il: int) -> int:
        return self.head_dim_k * self.n_head_kv[il]

    def n_embd_v_gqa(self, il: int) -> int:
        return self.head_dim_v * self.n_head_kv[il]

    def to_dict(self, tensors: bool = False) -> Dict[str, Any]:
        """Plain JSON-serialisable data (the shape `placement` reads back)."""
        out = {
            f.name: getattr(self, f.name)
            for f in dataclasses.fields(self)
            if f.name not in ("metadata", "tensors")
        }
        out["weights_bytes"] = self.weights_bytes
        if tensors:
            out["tensors"] = [
                {
                    "name": t.name,
                    "type": t.type_name,
                    "dims": list(t.dims),
                    "offset": t.offset,
                    "nbytes": t.nbytes,
                }
                for t in self.tensors
            ]
        return out


def tensor_nbytes(ggml_type: int, dims: Tuple[int, ...]) -> Optional[int]:
    """Bytes of a tensor of this type and shape, or None for a type not in GGML_TYPES."""
    if ggml_type not in GGML_TYPES:
        return None
    _name, block, size = GGML_TYPES[ggml_type]
    n = 1
    for d in dims:
        n *= d
    if dims and dims[0] % block:
        raise GgufError("row of %d elements is not a multiple of the block size %d" % (dims[0], block))
    return n // block * size


# ---------------------------------------------------------------------------------------------
# Byte sources


class _Buffer:
    """A growing prefix of the file, fetched on demand by ``fetch(start, length) -> bytes``."""

    def __init__(self, fetch: Callable[[int, int], bytes], size: Optional[int], source: str):
        self._fetch = fetch
        self.size = size
        self.source = source
        self.data = bytearray()
        self.window = FIRST_WINDOW

    def ensure(self, end: int) -> None:
        if end <= len(self.data):
            return
        if end > MAX_HEADER_BYTES:
            raise GgufError(
                "%s: GGUF header larger than %d bytes (corrupt?)" % (self.source, MAX_HEADER_BYTES)
            )
        while len(self.data) < end:
            want = max(end - len(self.data), self.window)
            if self.size is not None:
                want = min(want, self.size - len(self.data))
            if want <= 0:
                raise GgufError("%s: truncated GGUF (header runs past the end of the file)" % self.source)
            chunk = self._fetch(len(self.data), want)
            if not chunk:
                raise GgufError("%s: truncated GGUF (header runs past the end of the file)" % self.source)
            self.data.extend(chunk)
            self.window = min(self.window * 2, MAX_WINDOW)


def _file_fetcher(path: str) -> Tuple[Callable[[int, int], bytes], int]:
    size = os.path.getsize(path)

    def fetch(start: int, length: int) -> bytes:
        with open(path, "rb") as handle:
            handle.seek(start)
            return handle.read(length)

    return fetch, size


def _url_fetcher(url: str, timeout: float, headers: Optional[Dict[str, str]]):
    state: Dict[str, Optional[int]] = {"size": None}

    def fetch(start: int, length: int) -> bytes:
        req = urllib.request.Request(url, headers=dict(headers or {}))
        req.add_header("Range", "bytes=%d-%d" % (start, start + length - 1))
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                if resp.status == 200:
                    # The server ignored Range: read only what we asked for, then drop the connection.
                    if start:
                        resp.read(start)
                    data = resp.read(length)
                else:
                    data = resp.read(length)
                total = resp.headers.get("Content-Range", "")
                if "/" in total and total.rsplit("/", 1)[1].isdigit():
                    state["size"] = int(total.rsplit("/", 1)[1])
                elif resp.status == 200 and resp.headers.get("Content-Length", "").isdigit():
                    state["size"] = int(resp.headers["Content-Length"])
                return data
        except urllib.error.HTTPError as err:
            if err.code == 416:
                return b""
            raise GgufError("%s: HTTP %d %s" % (url, err.code, err.reason)) from err
        except (urllib.error.URLError, OSError) as err:
            raise GgufError("%s: cannot read: %s" % (url, err)) from err

    return fetch, state


# ---------------------------------------------------------------------------------------------
# Parsing


class _Parser:
    def __init__(self, buf: _Buffer):
        self.buf = buf
        self.pos = 0

    def take(self, n: int) -> bytes:
        self.buf.ensure(self.pos + n)
        out = bytes(self.buf.data[self.pos : self.pos + n])
        self.pos += n
        return out

    def skip(self, n: int) -> None:
        self.buf.ensure(self.pos + n)
        self.pos += n

    def scalar(self, vtype: int) -> Any:
        fmt, size = _SCALARS[vtype]
        return struct.unpack(fmt, self.take(size))[0]

    def u32(self) -> int:
        return struct.unpack("<I", self.take(4))[0]

    def u64(self) -> int:
        return struct.unpack("<Q", self.take(8))[0]

    def string(self) -> str:
        n = self.u64()
        if n > MAX_HEADER_BYTES:
            raise GgufError("%s: string of %d bytes at offset %d (corrupt?)" % (self.buf.source, n, self.pos))
        return self.take(n).decode("utf-8", errors="replace")

    def value(self, vtype: int) -> Any:
        if vtype in _SCALARS:
            return self.scalar(vtype)
        if vtype == _STRING:
            return self.string()
        if vtype == _ARRAY:
            item_type = self.u32()
            length = self.u64()
            if item_type in _SCALARS:
                size = _SCALARS[item_type][1]
                if length > _KEEP_ARRAY:
                    self.skip(size * length)
                    return ArrayInfo(item_type, length)
                fmt = "<%d%s" % (length, _SCALARS[item_type][0][1])
                return list(struct.unpack(fmt, self.take(size * length)))
            if item_type == _STRING:
                if length > _KEEP_ARRAY:
                    for _ in range(length):
                        self.skip(self.u64())
                    return ArrayInfo(item_type, length)
                return [self.string() for _ in range(length)]
            if item_type == _ARRAY and length == 0:
                return []
            raise GgufError("%s: unsupported array item type %d" % (self.buf.source, item_type))
        raise GgufError(
            "%s: unknown metadata value type %d at offset %d" % (self.buf.source, vtype, self.pos)
        )


def _parse(buf: _Buffer) -> Tuple[Dict[str, Any], List[TensorInfo], int]:
    p = _Parser(buf)
    magic = p.take(4)
    if magic != GGUF_MAGIC:
        raise GgufError("%s: not a GGUF file (magic %r)" % (buf.source, magic))
    version = p.u32()
    if version not in (2, 3):
        if version & 0xFFFF == 0 and version:
            raise GgufError("%s: big-endian GGUF is not supported" % buf.source)
        raise GgufError("%s: unsupported GGUF version %d (2 and 3 are)" % (buf.source, version))
    n_tensors = p.u64()
    n_kv = p.u64()
    if n_tensors > 1_000_000 or n_kv > 1_000_000:
        raise GgufError("%s: implausible counts (%d tensors, %d keys)" % (buf.source, n_tensors, n_kv))
    meta: Dict[str, Any] = {"GGUF.version": version}
    for _ in range(n_kv):
        key = p.string()
        meta[key] = p.value(p.u32())
    raw: List[Tuple[str, int, Tuple[int, ...], int]] = []
    for _ in range(n_tensors):
        name = p.string()
        n_dims = p.u32()
        if n_dims > 8:
            raise GgufError("%s: tensor %s has %d dimensions (corrupt?)" % (buf.source, name, n_dims))
        dims = tuple(p.u64() for _ in range(n_dims))
        ggml_type = p.u32()
        offset = p.u64()
        raw.append((name, ggml_type, dims, offset))
    alignment = meta.get("general.alignment", DEFAULT_ALIGNMENT)
    if not isinstance(alignment, int) or alignment <= 0:
        alignment = DEFAULT_ALIGNMENT
    data_offset = (p.pos + alignment - 1) // alignment * alignment

    # Byte sizes from the type table; unknown types fall back to the distance to the next tensor.
    by_offset = sorted(raw, key=lambda t: t[3])
    next_offset: Dict[str, Optional[int]] = {}
    for i, t in enumerate(by_offset):
        next_offset[t[0]] = by_offset[i + 1][3] if i + 1 < len(by_offset) else None
    tensors: List[TensorInfo] = []
    for name, ggml_type, dims, offset in raw:
        try:
            nbytes = tensor_nbytes(ggml_type, dims)
        except GgufError as err:
            raise GgufError("%s: tensor %s: %s" % (buf.source, name, err)) from err
        if nbytes is None:
            nxt = next_offset[name]
            if nxt is None:
                if buf.size is None:
                    raise GgufError("%s: tensor %s has unknown type %d" % (buf.source, name, ggml_type))
                nxt = buf.size - data_offset
            nbytes = nxt - offset
        tensors.append(TensorInfo(name, ggml_type, dims, offset, nbytes))
    return meta, tensors, data_offset


def _per_layer(
    meta: Dict[str, Any], key: str, n_layer: int, default: Optional[int], source: str
) -> List[int]:
    value = meta.get(key, default)
    if value is None:
        raise GgufError("%s: metadata key %s is missing" % (source, key))
    if isinstance(value, list):
        if len(value) != n_layer:
            raise GgufError("%s: %s has %d entries for %d layers" % (source, key, len(value), n_layer))
        return [int(v) for v in value]
    if isinstance(value, ArrayInfo):
        raise GgufError("%s: %s is an array of %d entries (too long)" % (source, key, value.length))
    return [int(value)] * n_layer


def layout_from_parts(
    source: str,
    meta: Dict[str, Any],
    tensors: List[TensorInfo],
    data_offset: int,
    file_bytes: Optional[int],
    bytes_read: int,
) -> GgufLayout:
    arch = meta.get("general.architecture")
    if not isinstance(arch, str):
        raise GgufError("%s: general.architecture is missing" % source)

    def key(name: str) -> str:
        return "%s.%s" % (arch, name)

    n_layer = meta.get(key("block_count"))
    if not isinstance(n_layer, int) or n_layer <= 0:
        raise GgufError("%s: %s is missing or not a positive integer" % (source, key("block_count")))
    n_embd = meta.get(key("embedding_length"))
    if not isinstance(n_embd, int) or n_embd <= 0:
        raise GgufError("%s: %s is missing" % (source, key("embedding_length")))
    n_head = _per_layer(meta, key("attention.head_count"), n_layer, None, source)
    n_head_kv = _per_layer(meta, key("attention.head_count_kv"), n_layer, max(n_head), source)
    n_ff_list = _per_layer(meta, key("feed_forward_length"), n_layer, 0, source)
    head_max = max(n_head) or 1
    head_dim_k = int(meta.get(key("attention.key_length"), n_embd // head_max))
    head_dim_v = int(meta.get(key("attention.value_length"), n_embd // head_max))

    by_name = {t.name: t for t in tensors}
    layer_bytes = [0] * n_layer
    layer_largest = [0] * n_layer
    token_embd = output = output_norm = other = 0
    for t in tensors:
        m = _BLK_RE.match(t.name)
        if m:
            il = int(m.group(1))
            if il >= n_layer:
                # NextN / MTP layers beyond block_count are not loaded for inference by default.
                other += t.nbytes
                continue
            layer_bytes[il] += t.nbytes
            layer_largest[il] = max(layer_largest[il], t.nbytes)
        elif t.name.startswith("token_embd."):
            token_embd += t.nbytes
        elif t.name == "output.weight":
            output += t.nbytes
        elif t.name.startswith("output_norm.") or t.name.startswith("output."):
            output_norm += t.nbytes
        else:
            other += t.nbytes
    if "token_embd.weight" not in by_name:
        raise GgufError("%s: no token_embd.weight tensor" % source)
    tied = "output.weight" not in by_name
    if tied:
        output = by_name["token_embd.weight"].nbytes

    vocab = meta.get(key("vocab_size"))
    if not isinstance(vocab, int):
        tokens = meta.get("tokenizer.ggml.tokens")
        if isinstance(tokens, ArrayInfo):
            vocab = tokens.length
        elif isinstance(tokens, list):
            vocab = len(tokens)
        else:
            dims = by_name["token_embd.weight"].dims
            vocab = dims[1] if len(dims) > 1 else 0

    window = meta.get(key("attention.sliding_window"), 0)
    window = int(window) if isinstance(window, (int, float)) else 0
    pattern = meta.get(key("attention.sliding_window_pattern"))
    if window <= 0:
        swa = [False] * n_layer
    elif isinstance(pattern, list) and len(pattern) == n_layer:
        swa = [bool(v) for v in pattern]
    else:
        every = int(pattern) if isinstance(pattern, int) and pattern > 0 else SWA_DENSE_EVERY.get(arch, 0)
        # every n-th layer is dense; 0 means all layers use the window.
        swa = [every == 0 or (il % every) < (every - 1) for il in range(n_layer)]

    return GgufLayout(
        source=source,
        architecture=arch,
        name=meta.get("general.name") if isinstance(meta.get("general.name"), str) else None,
        file_bytes=file_bytes,
        data_offset=data_offset,
        bytes_read=bytes_read,
        n_layer=n_layer,
        n_embd=n_embd,
        n_ff=max(n_ff_list) if n_ff_list else 0,
        n_head=n_head,
        n_head_kv=n_head_kv,
        head_dim_k=head_dim_k,
        head_dim_v=head_dim_v,
        n_vocab=int(vocab),
        n_ctx_train=int(meta.get(key("context_length"), 0) or 0),
        sliding_window=window,
        swa_layers=swa,
        tied_output=tied,
        layer_bytes=layer_bytes,
        layer_largest_tensor=layer_largest,
        token_embd_bytes=token_embd,
        output_bytes=output,
        output_norm_bytes=output_norm,
        other_bytes=other,
        metadata=meta,
        tensors=tensors,
    )


def is_url(source: str) -> bool:
    return source.startswith("http://") or source.startswith("https://")


def read_layout(source: str, timeout: float = 30.0, headers: Optional[Dict[str, str]] = None) -> GgufLayout:
    """Read the layout of the GGUF at ``source`` (a path or an http(s) URL).

    Only the header and tensor table are read. Raises GgufError naming the source on any problem.
    """
    if is_url(source):
        fetch, state = _url_fetcher(source, timeout, headers)
        buf = _Buffer(fetch, None, source)
        meta, tensors, data_offset = _parse(buf)
        size = state["size"]
    else:
        if not os.path.isfile(source):
            raise GgufError("%s: no such file" % source)
        fetch, size = _file_fetcher(source)
        buf = _Buffer(fetch, size, source)
        meta, tensors, data_offset = _parse(buf)
    if size is not None:
        for t in tensors:
            if data_offset + t.offset + t.nbytes > size:
                raise GgufError(
                    "%s: tensor %s ends at byte %d, past the end of the file (%d bytes): truncated?"
                    % (source, t.name, data_offset + t.offset + t.nbytes, size)
                )
    return layout_from_parts(source, meta, tensors, data_offset, size, len(buf.data))
