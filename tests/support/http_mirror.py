"""A small HTTP server that serves one directory with Range support, for tests.

Use it as a context manager::

    with HttpMirror(directory) as m:
        url = m.url + "/model.gguf"
        ...
        assert m.bytes_sent["/model.gguf"] < 10 * 1024 * 1024

or from the command line (molecule downloads, bound to a podman network gateway)::

    python -m tests.support.http_mirror DIR --port 8089 --bind 0.0.0.0

It answers GET and HEAD with Content-Length, honours a single ``Range: bytes=`` range
(206 + Content-Range, 416 when unsatisfiable, the whole file when the header is malformed),
never lists directories and never serves outside the directory. ``bytes_sent`` counts body
bytes per request path (URL-decoded, without query); ``requests`` records (method, path, range).
"""

from __future__ import annotations

import argparse
import collections
import os
import posixpath
import re
import sys
import threading
import urllib.parse
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Optional

_RANGE_RE = re.compile(r"^bytes=(\d*)-(\d*)$")
_CHUNK = 1024 * 1024


def parse_range(header: str, size: int) -> Optional[tuple[int, int]]:
    """Return (start, end_inclusive) for a single byte range, or None when not a usable range.

    Raises ValueError when the range is syntactically valid but unsatisfiable (-> 416).
    """
    match = _RANGE_RE.match(header.strip())
    if not match:
        return None
    first, last = match.group(1), match.group(2)
    if first == "" and last == "":
        return None
    if first == "":
        suffix = int(last)
        if suffix == 0:
            raise ValueError("empty suffix range")
        return max(0, size - suffix), size - 1
    start = int(first)
    end = int(last) if last != "" else size - 1
    if last != "" and end < start:
        return None
    if start >= size:
        raise ValueError("range starts past the end")
    return start, min(end, size - 1)


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:
        if self.server.verbose:
            super().log_message(format, *args)

    def _resolve(self) -> tuple[str, Optional[str]]:
        path = urllib.parse.unquote(urllib.parse.urlsplit(self.path).path)
        norm = posixpath.normpath(path)
        if norm.startswith("..") or "/../" in norm:
            return path, None
        full = os.path.join(self.server.root, norm.lstrip("/"))
        real = os.path.realpath(full)
        if not (real == self.server.root or real.startswith(self.server.root + os.sep)):
            return path, None
        if not os.path.isfile(real):
            return path, None
        return path, real

    def _error(self, status: HTTPStatus, size: Optional[int] = None) -> None:
        body = f"{status.value} {status.phrase}\n".encode()
        self.send_response(status)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        if size is not None:
            self.send_header("Content-Range", f"bytes */{size}")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _serve(self, head: bool) -> None:
        path, real = self._resolve()
        range_header = self.headers.get("Range")
        with self.server.lock:
            self.server.requests.append((self.command, path, range_header))
        if real is None:
            self._error(HTTPStatus.NOT_FOUND)
            return
        size = os.path.getsize(real)
        start, end = 0, size - 1
        status = HTTPStatus.OK
        if range_header:
            try:
                parsed = parse_range(range_header, size)
            except ValueError:
                self._error(HTTPStatus.REQUESTED_RANGE_NOT_SATISFIABLE, size)
                return
            if parsed is not None:
                start, end = parsed
                status = HTTPStatus.PARTIAL_CONTENT
        length = max(0, end - start + 1)
        self.send_response(status)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("Content-Length", str(length))
        if status == HTTPStatus.PARTIAL_CONTENT:
            self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
        self.end_headers()
        if head or length == 0:
            return
        # Count a chunk before writing it, so a client that has read the body sees the count.
        with open(real, "rb") as handle:
            handle.seek(start)
            remaining = length
            while remaining > 0:
                chunk = handle.read(min(_CHUNK, remaining))
                if not chunk:
                    break
                with self.server.lock:
                    self.server.bytes_sent[path] += len(chunk)
                try:
                    self.wfile.write(chunk)
                except (BrokenPipeError, ConnectionResetError):
                    with self.server.lock:
                        self.server.bytes_sent[path] -= len(chunk)
                    self.close_connection = True
                    return
                remaining -= len(chunk)

    def do_GET(self) -> None:
        self._serve(head=False)

    def do_HEAD(self) -> None:
        self._serve(head=True)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], root: str, verbose: bool = False) -> None:
        super().__init__(address, _Handler)
        self.root = os.path.realpath(root)
        self.verbose = verbose
        self.lock = threading.Lock()
        self.bytes_sent: collections.Counter[str] = collections.Counter()
        self.requests: list[tuple[str, str, Optional[str]]] = []


class HttpMirror:
    """Serve ``directory`` over HTTP on ``bind``:``port`` (port 0 picks a free one)."""

    def __init__(self, directory: str, port: int = 0, bind: str = "127.0.0.1", verbose: bool = False):
        if not os.path.isdir(directory):
            raise FileNotFoundError(f"http_mirror: not a directory: {directory}")
        self.directory = directory
        self._address = (bind, port)
        self._verbose = verbose
        self._server: Optional[_Server] = None
        self._thread: Optional[threading.Thread] = None

    def start(self) -> HttpMirror:
        self._server = _Server(self._address, self.directory, self._verbose)
        self._thread = threading.Thread(target=self._server.serve_forever, name="http-mirror", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._server = None
        self._thread = None

    def __enter__(self) -> HttpMirror:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _srv(self) -> _Server:
        if self._server is None:
            raise RuntimeError("http_mirror: not started")
        return self._server

    @property
    def host(self) -> str:
        return str(self._srv().server_address[0])

    @property
    def port(self) -> int:
        return int(self._srv().server_address[1])

    @property
    def url(self) -> str:
        """Base URL without a trailing slash, e.g. http://127.0.0.1:40123."""
        host = self.host
        if host in ("0.0.0.0", ""):
            host = "127.0.0.1"
        return f"http://{host}:{self.port}"

    def url_for(self, name: str) -> str:
        return self.url + "/" + urllib.parse.quote(name.lstrip("/"))

    @property
    def bytes_sent(self) -> collections.Counter[str]:
        """Body bytes sent per request path (e.g. ``m.bytes_sent["/model.gguf"]``)."""
        return self._srv().bytes_sent

    @property
    def requests(self) -> list[tuple[str, str, Optional[str]]]:
        return self._srv().requests

    def total_bytes_sent(self) -> int:
        return sum(self._srv().bytes_sent.values())

    def reset_counters(self) -> None:
        srv = self._srv()
        with srv.lock:
            srv.bytes_sent.clear()
            srv.requests.clear()


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description="Serve a directory over HTTP with Range support.")
    parser.add_argument("directory")
    parser.add_argument("--port", type=int, default=8089)
    parser.add_argument("--bind", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument("--verbose", action="store_true", help="log every request to stderr")
    args = parser.parse_args(argv)
    mirror = HttpMirror(args.directory, port=args.port, bind=args.bind, verbose=args.verbose).start()
    print(f"serving {os.path.realpath(args.directory)} on http://{mirror.host}:{mirror.port}", flush=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        pass
    finally:
        mirror.stop()
    return 0


__all__ = ["HttpMirror", "parse_range"]


if __name__ == "__main__":
    sys.exit(main())
