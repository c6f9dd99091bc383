"""HTTP servers that misbehave on purpose, on loopback threads, for the bound tests (issue 31).

- :class:`Endless` sends a body with no Content-Length (HTTP/1.0: the body ends when the
  connection closes), or with a false one;
- :class:`Dripping` sends its headers and body one byte at a time, each within any per-read timeout.
"""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Optional


class _Server:
    def __init__(self, handler: type) -> None:
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}/model.gguf"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()


class Endless(_Server):
    """Serves ``body_bytes`` zero bytes with no Content-Length (HTTP/1.0, closed at the end),
    or with the ``announce`` Content-Length; ``sent`` counts what left the server."""

    def __init__(self, body_bytes: int, announce: Optional[int] = None) -> None:
        self.body_bytes = body_bytes
        self.announce = announce
        self.sent = 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.0"

            def log_message(self, *args) -> None:  # quiet
                pass

            def do_GET(self) -> None:
                self.send_response(200)
                if outer.announce is not None:
                    self.send_header("Content-Length", str(outer.announce))
                self.end_headers()
                block = b"\0" * 65536
                left = outer.body_bytes
                try:
                    while left > 0:
                        piece = block[: min(left, len(block))]
                        self.wfile.write(piece)
                        outer.sent += len(piece)
                        left -= len(piece)
                except OSError:
                    pass  # the client stopped reading

        super().__init__(Handler)


class Dripping(_Server):
    """Answers every GET with ``body`` (and a true Content-Length), one byte every ``gap`` seconds,
    the status line and headers included; ``headers_first`` sends the head at once."""

    def __init__(self, body: bytes, gap: float = 0.05, headers_first: bool = False) -> None:
        self.body = body
        self.gap = gap
        self.headers_first = headers_first
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.0"

            def log_message(self, *args) -> None:
                pass

            def do_GET(self) -> None:
                head = (
                    f"HTTP/1.0 200 OK\r\nContent-Type: application/json\r\n"
                    f"Content-Length: {len(outer.body)}\r\n\r\n"
                ).encode("ascii")
                if outer.headers_first:
                    self.wfile.write(head)
                    self.wfile.flush()
                    head = b""
                try:
                    for byte in head + outer.body:
                        self.wfile.write(bytes([byte]))
                        self.wfile.flush()
                        time.sleep(outer.gap)
                except OSError:
                    pass

        super().__init__(Handler)
