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

import contextlib
import dataclasses
import math
import os
import re
import struct
import threading
import time
import urllib.error
from typing import Any, Callable, Dict, List, Optional, Tuple

from ansible.module_utils.urls import open_url

__metaclass__ = type

GGUF_MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32
# First Range request size and the cap of one request when the window grows.
FIRST_WINDOW = 256 * 1024
MAX_WINDOW = 2 * 1024 * 1024
# Refuse headers larger than this (a corrupt or hostile count would otherwise read a whole file);
# the largest real vocabularies and merge lists make headers of about 10 MiB.
MAX_HEADER_BYTES = 64 * 1024 * 1024
# One deadline for the whole read of a URL (seconds), whatever the server does.
DEFAULT_DEADLINE = 120.0
# Larger sizes (a file, a tensor, an offset) are refused as corrupt: 16 TiB.
MAX_FILE_BYTES = 1 << 44
# Ranges of the hyperparameters (far above any real model, far below what exhausts memory).
MAX_LAYERS = 4096
MAX_EMBD = 1 << 20
MAX_HEADS = 1 << 16
MAX_FF = 1 << 24
MAX_HEAD_DIM = 1 << 16
MAX_VOCAB = 1 << 24
MAX_CONTEXT = 1 << 32
MAX_TENSORS = 1_000_000
MAX_KEYS = 1_000_000

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
_CONTENT_RANGE_RE = re.compile(r"^bytes (\d{1,20})-(\d{1,20})/(\d{1,20}|\*)$")

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


def _short(text: Any, limit: int = 64) -> str:
    """A value for an error message: repr, cut to ``limit`` characters."""
    out = repr(text)
    return out if len(out) <= limit else out[: limit - 3] + "..."


def _describe(value: Any) -> str:
    if isinstance(value, ArrayInfo):
        return "an array of %d items" % value.length
    if isinstance(value, list):
        return "an array of %d items" % len(value)
    if isinstance(value, str):
        return "the string %s" % _short(value)
    if isinstance(value, bool):
        return "the boolean %s" % value
    return "%s %s" % (type(value).__name__, _short(value))


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
    """A growing prefix of the file, fetched on demand by ``fetch(start, length) -> bytes``.

    Never asks for a byte past ``max_bytes``: the limit on the header is also the limit on what
    is read (``what`` names the part being read, for the message).
    """

    def __init__(
        self,
        fetch: Callable[[int, int], bytes],
        size: Optional[int],
        source: str,
        max_bytes: int = MAX_HEADER_BYTES,
    ):
        self._fetch = fetch
        self.size = size
        self.source = source
        self.max_bytes = max_bytes
        self.data = bytearray()
        self.window = FIRST_WINDOW

    def ensure(self, end: int, what: str = "the header") -> None:
        if end <= len(self.data):
            return
        if end > self.max_bytes:
            raise GgufError(
                "%s: %s would end at byte %d, past the limit of %d bytes on a GGUF header (corrupt?)"
                % (self.source, what, end, self.max_bytes)
            )
        if self.size is not None and end > self.size:
            raise GgufError(
                "%s: truncated GGUF (%s runs past the end of the file, %d bytes)"
                % (self.source, what, self.size)
            )
        while len(self.data) < end:
            want = min(max(end - len(self.data), self.window), self.max_bytes - len(self.data))
            if self.size is not None:
                want = min(want, self.size - len(self.data))
            if want <= 0:
                raise GgufError("%s: truncated GGUF (%s runs past the end of the file)" % (self.source, what))
            chunk = self._fetch(len(self.data), want)
            if not chunk:
                raise GgufError("%s: truncated GGUF (%s runs past the end of the file)" % (self.source, what))
            if len(chunk) > want:
                chunk = chunk[:want]
            self.data.extend(chunk)
            self.window = min(self.window * 2, MAX_WINDOW)


def _file_fetcher(path: str) -> Tuple[Callable[[int, int], bytes], int]:
    size = os.path.getsize(path)

    def fetch(start: int, length: int) -> bytes:
        with open(path, "rb") as handle:
            handle.seek(start)
            return handle.read(length)

    return fetch, size


class _UrlFetcher:
    """Range requests through ansible's ``open_url``, each answer checked, under one deadline.

    Every request runs in a helper thread the caller waits for until the deadline, so neither a
    server that drips its body nor one that drips its status line holds the read past it.
    """

    def __init__(
        self,
        url: str,
        timeout: float,
        headers: Optional[Dict[str, str]],
        deadline: float,
        validate_certs: bool = True,
    ):
        self.url = url
        self.timeout = float(timeout)
        self.headers = dict(headers or {})
        self.seconds = float(deadline)
        self.end = time.monotonic() + self.seconds
        self.validate_certs = validate_certs
        self.size: Optional[int] = None
        self.received = 0
        self.requests = 0

    def _remaining(self) -> float:
        left = self.end - time.monotonic()
        if left <= 0:
            raise self._late()
        return left

    def _late(self) -> GgufError:
        return GgufError(
            "%s: no complete GGUF header within the deadline of %g s (%d bytes in %d requests)"
            % (self.url, self.seconds, self.received, self.requests)
        )

    def _exchange(self, start: int, length: int, box: Dict[str, Any], cancel: threading.Event) -> None:
        """One request, run in the helper thread: status, headers and at most ``length`` bytes."""
        headers = dict(self.headers)
        headers["Range"] = "bytes=%d-%d" % (start, start + length - 1)
        try:
            resp = open_url(
                self.url,
                headers=headers,
                timeout=max(0.001, min(self.timeout, self.end - time.monotonic())),
                validate_certs=self.validate_certs,
                decompress=False,
            )
        except urllib.error.HTTPError as err:
            box["http_error"] = (err.code, err.reason)
            err.close()
            return
        except Exception as err:  # any failure to connect becomes the message
            box["error"] = err
            return
        box["resp"] = resp
        try:
            box["status"] = resp.status
            box["content_range"] = resp.headers.get("Content-Range")
            box["content_length"] = resp.headers.get("Content-Length")
            chunks = []
            got = 0
            read = getattr(resp, "read1", None) or resp.read
            while got < length and not cancel.is_set():
                piece = read(min(65536, length - got))
                if not piece:
                    break
                chunks.append(piece)
                got += len(piece)
            box["data"] = b"".join(chunks)
        except Exception as err:  # a broken answer becomes the message
            box["error"] = err
        finally:
            resp.close()

    def __call__(self, start: int, length: int) -> bytes:
        box: Dict[str, Any] = {}
        cancel = threading.Event()
        worker = threading.Thread(target=self._exchange, args=(start, length, box, cancel), daemon=True)
        self.requests += 1
        worker.start()
        worker.join(self._remaining())
        if worker.is_alive():
            cancel.set()
            resp = box.get("resp")
            if resp is not None:
                with contextlib.suppress(Exception):  # best effort: the error is the deadline
                    resp.close()
            raise self._late()
        if "http_error" in box:
            code, reason = box["http_error"]
            if code == 416:
                return b""
            raise GgufError("%s: HTTP %d %s" % (self.url, code, reason))
        if "error" in box:
            raise GgufError("%s: cannot read: %s" % (self.url, box["error"]))
        return self._check(start, length, box)

    def _check(self, start: int, length: int, box: Dict[str, Any]) -> bytes:
        data: bytes = box.get("data", b"")
        status = box.get("status")
        clen = box.get("content_length")
        asked = "bytes=%d-%d" % (start, start + length - 1)
        if clen is not None and not (clen.isdigit() and len(clen) <= 20 and int(clen) <= MAX_FILE_BYTES):
            raise GgufError(
                "%s: implausible Content-Length %s (more than %d bytes, or not a number)"
                % (self.url, _short(clen), MAX_FILE_BYTES)
            )
        if status == 200:
            if start:
                raise GgufError(
                    "%s: the server ignored the Range request (HTTP 200 for %s); the reader needs a server "
                    "that answers 206 Partial Content" % (self.url, asked)
                )
            size = int(clen) if clen is not None else None
            if size is not None and len(data) < min(size, length):
                raise GgufError(
                    "%s: the answer ended after %d of its %d bytes" % (self.url, len(data), min(size, length))
                )
        elif status == 206:
            match = _CONTENT_RANGE_RE.match((box.get("content_range") or "").strip())
            if not match:
                raise GgufError(
                    "%s: HTTP 206 without a valid Content-Range (got %s) for %s"
                    % (self.url, _short(box.get("content_range")), asked)
                )
            first, last, total = int(match.group(1)), int(match.group(2)), match.group(3)
            if first != start or last < first or last > start + length - 1:
                raise GgufError(
                    "%s: Content-Range %s does not answer the request %s"
                    % (self.url, _short(box.get("content_range")), asked)
                )
            size = None
            if total != "*":
                size = int(total)
                if size > MAX_FILE_BYTES or size <= last:
                    raise GgufError(
                        "%s: implausible file size %d in Content-Range %s"
                        % (self.url, size, _short(box.get("content_range")))
                    )
            span = last - first + 1
            if clen is not None and int(clen) != span:
                raise GgufError(
                    "%s: Content-Length %s disagrees with Content-Range %s"
                    % (self.url, clen, _short(box.get("content_range")))
                )
            if len(data) < span:
                raise GgufError("%s: the answer ended after %d of its %d bytes" % (self.url, len(data), span))
            data = data[:span]
        else:
            raise GgufError("%s: unexpected HTTP %s for %s" % (self.url, status, asked))
        if size is not None:
            if self.size is not None and size != self.size:
                raise GgufError(
                    "%s: the file size changed between requests (%d, then %d bytes)"
                    % (self.url, self.size, size)
                )
            self.size = size
        self.received += len(data)
        return data


# ---------------------------------------------------------------------------------------------
# Parsing


class _Parser:
    def __init__(self, buf: _Buffer):
        self.buf = buf
        self.pos = 0

    def take(self, n: int, what: str) -> bytes:
        self.buf.ensure(self.pos + n, what)
        out = bytes(self.buf.data[self.pos : self.pos + n])
        self.pos += n
        return out

    def skip(self, n: int, what: str) -> None:
        self.buf.ensure(self.pos + n, what)
        self.pos += n

    def scalar(self, vtype: int, what: str) -> Any:
        fmt, size = _SCALARS[vtype]
        return struct.unpack(fmt, self.take(size, what))[0]

    def u32(self, what: str) -> int:
        return struct.unpack("<I", self.take(4, what))[0]

    def u64(self, what: str) -> int:
        return struct.unpack("<Q", self.take(8, what))[0]

    def _room(self, need: int, what: str) -> None:
        """Refuse before reading when ``need`` bytes cannot fit under the limit or in the file."""
        end = self.pos + need
        if self.buf.size is not None and end > self.buf.size:
            raise GgufError(
                "%s: truncated GGUF (%s needs at least %d bytes, past the end of the file, %d bytes)"
                % (self.buf.source, what, need, self.buf.size)
            )
        if end > self.buf.max_bytes:
            raise GgufError(
                "%s: %s needs at least %d bytes, past the limit of %d bytes on a GGUF header (corrupt?)"
                % (self.buf.source, what, need, self.buf.max_bytes)
            )

    def string(self, what: str) -> str:
        n = self.u64(what)
        self._room(n, "%s (a string of %d bytes)" % (what, n))
        return self.take(n, what).decode("utf-8", errors="replace")

    def value(self, vtype: int, key: str) -> Any:
        what = "key %s" % _short(key)
        if vtype in _SCALARS:
            return self.scalar(vtype, what)
        if vtype == _STRING:
            return self.string(what)
        if vtype == _ARRAY:
            item_type = self.u32(what)
            length = self.u64(what)
            if item_type in _SCALARS:
                size = _SCALARS[item_type][1]
                self._room(size * length, "%s (an array of %d items)" % (what, length))
                if length > _KEEP_ARRAY:
                    self.skip(size * length, what)
                    return ArrayInfo(item_type, length)
                fmt = "<%d%s" % (length, _SCALARS[item_type][0][1])
                return list(struct.unpack(fmt, self.take(size * length, what)))
            if item_type == _STRING:
                # every string is at least its 8-byte length
                self._room(8 * length, "%s (an array of %d strings)" % (what, length))
                if length > _KEEP_ARRAY:
                    for _unused in range(length):
                        n = self.u64(what)
                        self._room(n, "%s (a string of %d bytes)" % (what, n))
                        self.skip(n, what)
                    return ArrayInfo(item_type, length)
                return [self.string(what) for _unused in range(length)]
            if item_type == _ARRAY and length == 0:
                return []
            raise GgufError("%s: %s: unsupported array item type %d" % (self.buf.source, what, item_type))
        raise GgufError(
            "%s: %s: unknown metadata value type %d at offset %d" % (self.buf.source, what, vtype, self.pos)
        )


def _alignment(meta: Dict[str, Any], source: str) -> int:
    value = meta.get("general.alignment", DEFAULT_ALIGNMENT)
    if (
        isinstance(value, bool)
        or not isinstance(value, int)
        or not 1 <= value <= 1 << 20
        or value & (value - 1)
    ):
        raise GgufError(
            "%s: general.alignment must be a power of two up to 2^20, got %s" % (source, _describe(value))
        )
    return value


def _parse(buf: _Buffer) -> Tuple[Dict[str, Any], List[TensorInfo], int]:
    p = _Parser(buf)
    magic = p.take(4, "the magic")
    if magic != GGUF_MAGIC:
        raise GgufError("%s: not a GGUF file (magic %r)" % (buf.source, magic))
    version = p.u32("the version")
    if version not in (2, 3):
        if version & 0xFFFF == 0 and version:
            raise GgufError("%s: big-endian GGUF is not supported" % buf.source)
        raise GgufError("%s: unsupported GGUF version %d (2 and 3 are)" % (buf.source, version))
    n_tensors = p.u64("the tensor count")
    n_kv = p.u64("the key count")
    if n_tensors > MAX_TENSORS or n_kv > MAX_KEYS:
        raise GgufError("%s: implausible counts (%d tensors, %d keys)" % (buf.source, n_tensors, n_kv))
    meta: Dict[str, Any] = {"GGUF.version": version}
    for i in range(n_kv):
        key = p.string("the name of key #%d" % i)
        meta[key] = p.value(p.u32("the type of key %s" % _short(key)), key)
    raw: List[Tuple[str, int, Tuple[int, ...], int]] = []
    seen = set()
    for i in range(n_tensors):
        name = p.string("the name of tensor #%d" % i)
        what = "tensor %s" % _short(name)
        if name in seen:
            raise GgufError("%s: %s appears twice in the tensor table" % (buf.source, what))
        seen.add(name)
        n_dims = p.u32(what)
        if n_dims > 8:
            raise GgufError("%s: %s has %d dimensions (corrupt?)" % (buf.source, what, n_dims))
        dims = tuple(p.u64(what) for _unused in range(n_dims))
        ggml_type = p.u32(what)
        offset = p.u64(what)
        if offset > MAX_FILE_BYTES:
            raise GgufError(
                "%s: %s: offset %d is past any plausible file (corrupt?)" % (buf.source, what, offset)
            )
        raw.append((name, ggml_type, dims, offset))
    alignment = _alignment(meta, buf.source)
    data_offset = (p.pos + alignment - 1) // alignment * alignment

    # Byte sizes from the type table; unknown types fall back to the distance to the next tensor.
    by_offset = sorted(raw, key=lambda t: t[3])
    next_offset: Dict[str, Optional[int]] = {}
    for i, t in enumerate(by_offset):
        next_offset[t[0]] = by_offset[i + 1][3] if i + 1 < len(by_offset) else None
    tensors: List[TensorInfo] = []
    for name, ggml_type, dims, offset in raw:
        what = "tensor %s" % _short(name)
        try:
            nbytes = tensor_nbytes(ggml_type, dims)
        except GgufError as err:
            raise GgufError("%s: %s: %s" % (buf.source, what, err)) from err
        if nbytes is None:
            nxt = next_offset[name]
            if nxt is None:
                if buf.size is None:
                    raise GgufError("%s: %s has unknown type %d" % (buf.source, what, ggml_type))
                nxt = buf.size - data_offset
            nbytes = nxt - offset
            if nbytes < 0:
                raise GgufError(
                    "%s: %s has unknown type %d and its offset %d is past the end of the data (%d bytes)"
                    % (buf.source, what, ggml_type, offset, nxt)
                )
        if nbytes > MAX_FILE_BYTES:
            raise GgufError(
                "%s: %s would hold %d bytes, more than any plausible file (dims %s)"
                % (buf.source, what, nbytes, _short(list(dims)))
            )
        tensors.append(TensorInfo(name, ggml_type, dims, offset, nbytes))
    # Tensors never share bytes: overlapping data means a corrupt table (and counted bytes that
    # are not there).
    ordered = sorted(tensors, key=lambda t: (t.offset, t.nbytes))
    for before, after in zip(ordered, ordered[1:]):
        if after.offset < before.offset + before.nbytes:
            raise GgufError(
                "%s: tensor %s (offset %d) overlaps tensor %s (offset %d, %d bytes): corrupt tensor table"
                % (
                    buf.source,
                    _short(after.name),
                    after.offset,
                    _short(before.name),
                    before.offset,
                    before.nbytes,
                )
            )
    return meta, tensors, data_offset


def _int_value(value: Any, key: str, lo: int, hi: int, source: str) -> int:
    """``value`` as an int in [lo, hi]; integral finite floats are accepted."""
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise GgufError("%s: %s must be an integer, got %s" % (source, key, _describe(value)))
    if not lo <= value <= hi:
        raise GgufError("%s: %s must be between %d and %d, got %d" % (source, key, lo, hi, value))
    return value


_MISSING = object()


def _int_key(meta: Dict[str, Any], key: str, lo: int, hi: int, source: str, default: Any = _MISSING) -> int:
    value = meta.get(key, default)
    if value is _MISSING:
        raise GgufError("%s: metadata key %s is missing" % (source, key))
    return _int_value(value, key, lo, hi, source)


def _per_layer(
    meta: Dict[str, Any], key: str, n_layer: int, default: Optional[int], source: str, hi: int = MAX_HEADS
) -> List[int]:
    value = meta.get(key, default)
    if value is None:
        raise GgufError("%s: metadata key %s is missing" % (source, key))
    if isinstance(value, list):
        if len(value) != n_layer:
            raise GgufError("%s: %s has %d entries for %d layers" % (source, key, len(value), n_layer))
        return [_int_value(v, "%s[%d]" % (key, il), 0, hi, source) for il, v in enumerate(value)]
    if isinstance(value, ArrayInfo):
        raise GgufError("%s: %s is an array of %d entries (too long)" % (source, key, value.length))
    return [_int_value(value, key, 0, hi, source)] * n_layer


def layout_from_parts(
    source: str,
    meta: Dict[str, Any],
    tensors: List[TensorInfo],
    data_offset: int,
    file_bytes: Optional[int],
    bytes_read: int,
) -> GgufLayout:
    arch = meta.get("general.architecture")
    if not isinstance(arch, str) or not arch:
        raise GgufError("%s: general.architecture is missing or not a string" % source)
    if len(arch) > 64:
        raise GgufError("%s: general.architecture is not a name: %s" % (source, _short(arch)))

    def key(name: str) -> str:
        return "%s.%s" % (arch, name)

    n_layer = _int_key(meta, key("block_count"), 1, MAX_LAYERS, source)
    n_embd = _int_key(meta, key("embedding_length"), 1, MAX_EMBD, source)
    n_head = _per_layer(meta, key("attention.head_count"), n_layer, None, source)
    head_max = max(n_head)
    if head_max < 1:
        raise GgufError("%s: %s is 0 on every layer" % (source, key("attention.head_count")))
    n_head_kv = _per_layer(meta, key("attention.head_count_kv"), n_layer, head_max, source)
    n_ff_list = _per_layer(meta, key("feed_forward_length"), n_layer, 0, source, hi=MAX_FF)
    head_dim_k = _int_key(
        meta, key("attention.key_length"), 1, MAX_HEAD_DIM, source, max(1, n_embd // head_max)
    )
    head_dim_v = _int_key(
        meta, key("attention.value_length"), 1, MAX_HEAD_DIM, source, max(1, n_embd // head_max)
    )

    by_name = {t.name: t for t in tensors}
    layer_bytes = [0] * n_layer
    layer_largest = [0] * n_layer
    token_embd = output = output_norm = other = 0
    for t in tensors:
        m = _BLK_RE.match(t.name)
        if m:
            digits = m.group(1)
            if len(digits) > 9:
                raise GgufError(
                    "%s: tensor %s: layer index of %d digits (corrupt?)"
                    % (source, _short(t.name), len(digits))
                )
            il = int(digits)
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

    if key("vocab_size") in meta:
        vocab = _int_key(meta, key("vocab_size"), 1, MAX_VOCAB, source)
    else:
        tokens = meta.get("tokenizer.ggml.tokens")
        if isinstance(tokens, ArrayInfo):
            vocab = tokens.length
        elif isinstance(tokens, list):
            vocab = len(tokens)
        else:
            dims = by_name["token_embd.weight"].dims
            vocab = dims[1] if len(dims) > 1 else 0
        vocab = _int_value(vocab, "the vocabulary size (tokenizer.ggml.tokens)", 0, MAX_VOCAB, source)

    window = _int_key(meta, key("attention.sliding_window"), 0, MAX_CONTEXT, source, 0)
    pattern = meta.get(key("attention.sliding_window_pattern"))
    if window <= 0:
        swa = [False] * n_layer
    elif isinstance(pattern, list) and len(pattern) == n_layer:
        swa = [bool(v) for v in pattern]
    elif pattern is None or isinstance(pattern, (int, list)):
        every = pattern if isinstance(pattern, int) and pattern > 0 else SWA_DENSE_EVERY.get(arch, 0)
        # every n-th layer is dense; 0 means all layers use the window.
        swa = [every == 0 or (il % every) < (every - 1) for il in range(n_layer)]
    else:
        raise GgufError(
            "%s: %s must be an integer or a list of booleans, got %s"
            % (source, key("attention.sliding_window_pattern"), _describe(pattern))
        )

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
        n_vocab=vocab,
        n_ctx_train=_int_key(meta, key("context_length"), 0, MAX_CONTEXT, source, 0),
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


def read_layout(
    source: str,
    timeout: float = 30.0,
    headers: Optional[Dict[str, str]] = None,
    deadline: float = DEFAULT_DEADLINE,
    max_header_bytes: int = MAX_HEADER_BYTES,
    validate_certs: bool = True,
) -> GgufLayout:
    """Read the layout of the GGUF at ``source`` (a path or an http(s) URL).

    Only the header and tensor table are read: at most ``max_header_bytes`` bytes, and from a URL
    within ``deadline`` seconds in all (``timeout`` bounds each wait for the server). Raises
    GgufError naming the source on any problem.
    """
    if is_url(source):
        fetch = _UrlFetcher(source, timeout, headers, deadline, validate_certs)
        buf = _Buffer(fetch, None, source, max_header_bytes)
        meta, tensors, data_offset = _parse(buf)
        size = fetch.size
    else:
        if not os.path.isfile(source):
            raise GgufError("%s: no such file" % source)
        fetch_file, size = _file_fetcher(source)
        buf = _Buffer(fetch_file, size, source, max_header_bytes)
        meta, tensors, data_offset = _parse(buf)
    if size is not None:
        for t in tensors:
            if data_offset + t.offset + t.nbytes > size:
                raise GgufError(
                    "%s: tensor %s ends at byte %d, past the end of the file (%d bytes): truncated?"
                    % (source, _short(t.name), data_offset + t.offset + t.nbytes, size)
                )
    return layout_from_parts(source, meta, tensors, data_offset, size, len(buf.data))
