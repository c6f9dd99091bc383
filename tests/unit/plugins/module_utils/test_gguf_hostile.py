"""The GGUF reader against hostile HTTP servers and hostile headers (issue #14, items 3 and 4).

Every case must end in the module's own GgufError, quickly, naming the URL, key or tensor at
fault, after a bounded number of bytes: never a download of the whole file, a hang, a
MemoryError, an OverflowError or a wrong layout returned without a word.
"""

from __future__ import annotations

import math
import os
import socket
import struct
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from ansible_collections.llmfleet.cluster.plugins.module_utils import gguf_layout as gl

from tests.support import gguf_craft as gc
from tests.support.gguf_gen import write_sparse_model
from tests.support.http_mirror import HttpMirror, parse_range

MIB = 1024 * 1024


# ---------------------------------------------------------------------------------------------
# A server that misbehaves in one chosen way


class _Handler(BaseHTTPRequestHandler):
    server: _Hostile
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:
        pass

    def _send(self, data: bytes) -> bool:
        if self.server.stopping.is_set():
            return False
        try:
            self.wfile.write(data)
            self.wfile.flush()
        except OSError:
            return False
        with self.server.lock:
            self.server.sent += len(data)
        return True

    def _body(self, start: int, end: int) -> None:
        """Send bytes [start, end] of the body (the file, then zeros past its end)."""
        pos = start
        while pos <= end:
            piece = self.server.body[pos : min(end + 1, pos + 65536)]
            if not piece:
                piece = b"\0" * min(65536, end + 1 - pos)
            if not self._send(piece):
                return
            pos += len(piece)

    def _status(self, code: int, headers: dict[str, str]) -> None:
        self.send_response(code)
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()

    def do_GET(self) -> None:
        mode = self.server.mode
        body = self.server.body
        size = len(body)
        rng = parse_range(self.headers.get("Range", ""), size) or (0, size - 1)
        with self.server.lock:
            self.server.ranges.append(rng)
            n = len(self.server.ranges)
        start, end = rng
        if mode == "ignore_range":
            self._status(200, {"Content-Length": str(size)})
            self._body(0, size - 1)
        elif mode == "endless_200":
            self._status(200, {"Connection": "close"})
            self._body(0, 1 << 40)
        elif mode == "huge_length":
            self._status(200, {"Content-Length": str(2**62)})
            self._body(0, size - 1)
        elif mode == "drip":
            self._status(
                206,
                {
                    "Content-Range": f"bytes {start}-{end}/{size}",
                    "Content-Length": str(end - start + 1),
                },
            )
            for i in range(start, end + 1):
                if not self._send(body[i : i + 1]) or self.server.stopping.wait(0.05):
                    return
        elif mode == "drip_status":
            for byte in b"HTTP/1.1 206 Partial Content\r\n":
                if not self._send(bytes([byte])) or self.server.stopping.wait(0.2):
                    return
        elif mode == "silent":
            self.server.stopping.wait(30)
        else:
            headers = {
                "Content-Range": f"bytes {start}-{end}/{size}",
                "Content-Length": str(end - start + 1),
            }
            if mode == "wrong_start":
                headers["Content-Range"] = f"bytes 0-{end - start}/{size}"
            elif mode == "huge_total":
                headers["Content-Range"] = f"bytes {start}-{end}/{2**62}"
            elif mode == "no_content_range":
                del headers["Content-Range"]
            elif mode == "size_changes":
                headers["Content-Range"] = f"bytes {start}-{end}/{size + n}"
            elif mode == "longer_body":
                # claims the range asked for but sends a megabyte more than it (no Content-Length)
                del headers["Content-Length"]
                headers["Connection"] = "close"
                self._status(206, headers)
                self._body(start, end + MIB)
                return
            elif mode == "short_body":
                headers["Connection"] = "close"
                self._status(206, headers)
                self._body(start, start + (end - start) // 2)
                return
            self._status(206, headers)
            self._body(start, end)


class _Hostile(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, mode: str, body: bytes) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.mode = mode
        self.body = body
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.sent = 0
        self.ranges: list[tuple[int, int]] = []

    def __enter__(self) -> _Hostile:
        self.thread = threading.Thread(target=self.serve_forever, daemon=True)
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopping.set()
        self.shutdown()
        self.server_close()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/m.gguf"


@pytest.fixture(scope="module")
def big_header(tmp_path_factory) -> bytes:
    """A model whose header (a 40000-token vocabulary) needs several Range requests."""
    path = str(tmp_path_factory.mktemp("hostile") / "h.gguf")
    write_sparse_model(path, n_layer=2, n_embd=256, n_ff=512, n_vocab=40000)
    with open(path, "rb") as handle:
        data = handle.read()
    assert gl.read_layout(path).data_offset > 2 * gl.FIRST_WINDOW
    return data


def test_control_an_honest_range_server_is_read(big_header) -> None:
    with _Hostile("honest", big_header) as srv:
        layout = gl.read_layout(srv.url, deadline=30)
    assert layout.n_layer == 2 and layout.n_vocab == 40000 and layout.file_bytes == len(big_header)
    assert srv.sent < layout.data_offset + 2 * gl.MAX_WINDOW


@pytest.mark.parametrize(
    ("mode", "message"),
    [
        ("ignore_range", r"ignored the Range request \(HTTP 200 for bytes=262144-"),
        ("endless_200", r"ignored the Range request"),
        ("huge_length", r"implausible Content-Length '4611686018427387904'"),
        ("wrong_start", r"Content-Range 'bytes 0-\d+/\d+' does not answer the request bytes=262144-"),
        ("huge_total", r"implausible file size 4611686018427387904"),
        ("no_content_range", r"HTTP 206 without a valid Content-Range"),
        ("size_changes", r"file size changed between requests"),
        ("short_body", r"the answer ended after \d+ of its \d+ bytes"),
    ],
)
def test_a_misbehaving_server_is_refused_after_few_bytes(big_header, mode, message) -> None:
    with _Hostile(mode, big_header) as srv:
        t0 = time.monotonic()
        with pytest.raises(gl.GgufError, match=message) as err:
            gl.read_layout(srv.url, deadline=30)
        took = time.monotonic() - t0
    assert srv.url in str(err.value)
    assert took < 10, took
    # what the server managed to push into the socket: the windows asked for, plus the kernel's
    # socket buffers at most (never the whole body again and again)
    assert srv.sent < 16 * MIB, srv.sent


def test_a_body_longer_than_its_range_is_cut_at_the_range(big_header) -> None:
    with _Hostile("longer_body", big_header) as srv:
        layout = gl.read_layout(srv.url, deadline=30)
    assert layout.n_vocab == 40000
    assert layout.bytes_read < layout.data_offset + 2 * gl.MAX_WINDOW


@pytest.mark.parametrize("mode", ["drip", "drip_status", "silent"])
def test_one_deadline_for_the_whole_read(big_header, mode) -> None:
    """A byte every 50 ms (or a status line dripped, or nothing at all) never times a single socket
    read out; the deadline still ends the read, with the URL and the deadline in the message."""
    with _Hostile(mode, big_header) as srv:
        t0 = time.monotonic()
        with pytest.raises(
            gl.GgufError, match=r"no complete GGUF header within the deadline of 1\.5 s"
        ) as err:
            gl.read_layout(srv.url, timeout=30, deadline=1.5)
        took = time.monotonic() - t0
    assert srv.url in str(err.value)
    assert 1.4 < took < 4, took


def test_an_honest_server_with_a_huge_string_array_reads_at_most_the_cap(tmp_path) -> None:
    """The header claims 2^31 strings: refused before they are read, naming the key."""
    meta = gc.llama_meta(tokenizer__ggml__tokens=(gc.ARRAY, (gc.STRING, [])))
    data = gc.gguf_bytes(meta, gc.llama_tensors())
    key = gc.kv("tokenizer.ggml.tokens", gc.ARRAY, (gc.STRING, []))
    at = data.index(key) + len(key) - 8
    data = data[:at] + struct.pack("<Q", 2**31) + data[at + 8 :] + b"x" * (8 * MIB)
    (tmp_path / "m.gguf").write_bytes(data)
    with HttpMirror(str(tmp_path)) as mirror:
        with pytest.raises(
            gl.GgufError, match=r"key 'tokenizer\.ggml\.tokens' \(an array of 2147483648 strings\)"
        ):
            gl.read_layout(mirror.url + "/m.gguf")
        sent = mirror.total_bytes_sent()
    assert sent <= gl.FIRST_WINDOW, sent


def test_many_real_strings_stop_at_the_header_limit(tmp_path) -> None:
    """Strings that are all there, but more of them than a header may hold: the read stops at the
    limit instead of following them through the file."""
    tokens = [f"tok{i:06d}" for i in range(200_000)]  # about 3 MiB of strings
    meta = gc.llama_meta(tokenizer__ggml__tokens=(gc.ARRAY, (gc.STRING, tokens)))
    (tmp_path / "m.gguf").write_bytes(gc.gguf_bytes(meta, gc.llama_tensors()))
    with HttpMirror(str(tmp_path)) as mirror:
        with pytest.raises(gl.GgufError, match=r"past the limit of 1048576 bytes on a GGUF header"):
            gl.read_layout(mirror.url + "/m.gguf", max_header_bytes=MIB)
        sent = mirror.total_bytes_sent()
    assert sent <= MIB, sent
    assert gl.MAX_HEADER_BYTES <= 64 * MIB


def test_a_dead_port_is_a_clean_error() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with pytest.raises(gl.GgufError, match=r"cannot read"):
        gl.read_layout(f"http://127.0.0.1:{port}/m.gguf", deadline=10)


# ---------------------------------------------------------------------------------------------
# Hostile values in a well-formed file


def _read(tmp_path, meta=None, tensors=None, **kw) -> gl.GgufLayout:
    path = tmp_path / "v.gguf"
    path.write_bytes(gc.gguf_bytes(meta or gc.llama_meta(), tensors or gc.llama_tensors(), **kw))
    return gl.read_layout(str(path))


def test_control_the_crafted_model_reads(tmp_path) -> None:
    layout = _read(tmp_path)
    assert (layout.n_layer, layout.n_embd, layout.n_vocab, layout.n_ctx_train) == (2, 32, 16, 128)
    assert layout.layer_bytes == [32 * 4 + 32 * 32 * 4] * 2
    assert layout.file_bytes == os.path.getsize(tmp_path / "v.gguf")


def test_unknown_tensor_type_with_an_offset_past_the_end(tmp_path) -> None:
    tensors = [*gc.llama_tensors(), ("blk.1.ffn_up.weight", (32, 32), 99)]
    with pytest.raises(
        gl.GgufError, match=r"tensor 'blk\.1\.ffn_up\.weight' has unknown type 99 and its offset"
    ):
        _read(tmp_path, tensors=tensors, offsets={"blk.1.ffn_up.weight": 1 << 30})


def test_unknown_tensor_type_never_gives_negative_bytes(tmp_path) -> None:
    """Offsets that go backwards: whatever the reader returns has no negative size anywhere."""
    tensors = [*gc.llama_tensors(), ("blk.0.odd.weight", (8,), 77)]
    try:
        layout = _read(tmp_path, tensors=tensors, offsets={"blk.0.odd.weight": 0})
    except gl.GgufError:
        return
    assert all(t.nbytes >= 0 for t in layout.tensors)
    assert min(layout.layer_bytes) >= 0


@pytest.mark.parametrize("count", [2**40, 3 * 10**8, 2 * 10**7, 0])
def test_block_count_out_of_range(tmp_path, count) -> None:
    meta = gc.llama_meta(llama__block_count=(gc.U64, count))
    t0 = time.monotonic()
    with pytest.raises(gl.GgufError, match=rf"llama\.block_count must be between 1 and 4096, got {count}"):
        _read(tmp_path, meta=meta)
    assert time.monotonic() - t0 < 2


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        (
            "llama.context_length",
            (gc.STRING, "4096"),
            r"llama\.context_length must be an integer, got the string '4096'",
        ),
        (
            "llama.attention.key_length",
            (gc.ARRAY, (gc.U32, [64, 64])),
            r"llama\.attention\.key_length must be an integer, got an array of 2 items",
        ),
        (
            "llama.attention.sliding_window",
            (gc.F32, math.inf),
            r"llama\.attention\.sliding_window must be an integer, got float inf",
        ),
        (
            "llama.attention.sliding_window",
            (gc.F64, math.nan),
            r"llama\.attention\.sliding_window must be an integer, got float nan",
        ),
        (
            "llama.embedding_length",
            (gc.BOOL, True),
            r"llama\.embedding_length must be an integer, got the boolean True",
        ),
        (
            "llama.embedding_length",
            (gc.I32, -32),
            r"llama\.embedding_length must be between 1 and \d+, got -32",
        ),
        (
            "llama.attention.head_count",
            (gc.ARRAY, (gc.F32, [4.0, math.inf])),
            r"llama\.attention\.head_count\[1\] must be an integer, got float inf",
        ),
        (
            "llama.attention.head_count_kv",
            (gc.STRING, "2"),
            r"llama\.attention\.head_count_kv must be an integer, got the string '2'",
        ),
        (
            "llama.feed_forward_length",
            (gc.U64, 2**63),
            r"llama\.feed_forward_length must be between 0 and \d+, got 9223372036854775808",
        ),
        ("llama.vocab_size", (gc.STRING, "lots"), r"llama\.vocab_size must be an integer"),
        (
            "llama.attention.sliding_window_pattern",
            (gc.STRING, "x"),
            r"sliding_window_pattern must be an integer or a list",
        ),
        ("general.alignment", (gc.U32, 0), r"general\.alignment must be a power of two"),
        ("general.alignment", (gc.U32, 48), r"general\.alignment must be a power of two"),
        ("general.architecture", (gc.U32, 7), r"general\.architecture is missing or not a string"),
    ],
)
def test_a_value_of_the_wrong_type_or_range_names_the_key(tmp_path, key, value, message) -> None:
    meta = gc.llama_meta(**{key.replace(".", "__"): value})
    if key == "llama.attention.sliding_window_pattern":
        meta["llama.attention.sliding_window"] = (gc.U32, 16)
    with pytest.raises(gl.GgufError, match=message):
        _read(tmp_path, meta=meta)


def test_a_5000_digit_layer_index_names_the_tensor(tmp_path) -> None:
    name = "blk." + "9" * 5000 + ".attn_q.weight"
    tensors = [*gc.llama_tensors(), (name, (32,), 0)]
    with pytest.raises(gl.GgufError, match=r"tensor 'blk\.999.*\.\.\.: layer index of 5000 digits") as err:
        _read(tmp_path, tensors=tensors)
    assert len(str(err.value)) < 300


def test_a_duplicate_tensor_is_refused(tmp_path) -> None:
    tensors = [*gc.llama_tensors(), ("blk.0.attn_q.weight", (32, 32), 0)]
    with pytest.raises(gl.GgufError, match=r"tensor 'blk\.0\.attn_q\.weight' appears twice"):
        _read(tmp_path, tensors=tensors)


def test_a_tensor_of_absurd_size_is_refused(tmp_path) -> None:
    tensors = [*gc.llama_tensors(), ("blk.0.big.weight", (2**40, 2**40), 0)]
    with pytest.raises(gl.GgufError, match=r"tensor 'blk\.0\.big\.weight' would hold \d+ bytes"):
        _read(tmp_path, tensors=tensors)


def test_a_string_longer_than_the_file_names_the_key(tmp_path) -> None:
    meta = gc.llama_meta(general__name=(gc.STRING, "abc"))
    data = gc.gguf_bytes(meta, gc.llama_tensors())
    entry = gc.kv("general.name", gc.STRING, "abc")
    at = data.index(entry) + len(entry) - 3 - 8
    data = data[:at] + struct.pack("<Q", 2**60) + data[at + 8 :]
    (tmp_path / "s.gguf").write_bytes(data)
    with pytest.raises(gl.GgufError, match=r"key 'general\.name' \(a string of 1152921504606846976 bytes\)"):
        gl.read_layout(str(tmp_path / "s.gguf"))
