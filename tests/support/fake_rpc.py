"""A fake ggml rpc-server on loopback, for the supervisor's tests.

Written from llama.cpp's protocol (ggml/src/ggml-rpc/ggml-rpc.cpp, protocol 7.0.0), not from
the supervisor: a request is ``| command (1 byte) | size (u64 little-endian) | data |``, an
answer ``| size (u64 LE) | data |``. The first command of a connection must be HELLO (14)
with 24 bytes of transport capabilities; the server answers ``major, minor, patch, 0`` and 24
bytes of its own capabilities (all zero: plain TCP), then waits for the next command.

``mode``:

- ``"rpc"``: answers HELLO like rpc-server (and counts them in ``hellos``),
- ``"silent"``: accepts and reads, never answers (a hung server, or another service),
- ``"close"``: accepts and closes at once,
- ``"http"``: answers like a web server (``HTTP/1.1 400 ...``), not an rpc-server,
- ``"old"``: answers HELLO with the three version bytes alone (the older protocols' answer).

``version``: the protocol version it answers (default the pinned build's, 7.0.0).
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading

HELLO = 14
CAPS = 24
VERSION = (7, 0, 0)


class FakeRpcServer:
    def __init__(self, mode: str = "rpc", port: int = 0, version: tuple[int, int, int] = VERSION) -> None:
        if mode not in ("rpc", "silent", "close", "http", "old"):
            raise ValueError(f"mode {mode!r}")
        self.mode = mode
        self.version = version
        self.port = port
        self.hellos = 0
        self.bad_requests: list[bytes] = []
        self.sock: socket.socket | None = None
        self._held: list[socket.socket] = []
        self._lock = threading.Lock()
        self.up()

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    def up(self) -> None:
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", self.port))
        sock.listen(16)
        self.port = sock.getsockname()[1]
        self.sock = sock
        threading.Thread(target=self._accept, args=(sock,), daemon=True).start()

    def down(self) -> None:
        sock, self.sock = self.sock, None
        if sock is not None:
            # shutdown() wakes the accept() blocked in the thread; close() alone may not.
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
        with self._lock:
            held, self._held = self._held, []
        for conn in held:
            conn.close()

    def _accept(self, sock: socket.socket) -> None:
        while True:
            try:
                conn, _unused = sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with self._lock:
            self._held.append(conn)
        try:
            if self.mode == "close":
                return
            conn.settimeout(30)
            if self.mode == "http":
                conn.recv(64)
                conn.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
                return
            if self.mode == "silent":
                while conn.recv(4096):
                    pass
                return
            head = _exact(conn, 9)
            command, size = head[0], struct.unpack("<Q", head[1:])[0]
            if command != HELLO or size != CAPS:
                self.bad_requests.append(head)
                return
            _exact(conn, size)
            with self._lock:
                self.hellos += 1
            # protocols before 3.x answered the three version bytes alone
            answer = bytes(self.version) if self.mode == "old" else bytes([*self.version, 0]) + bytes(CAPS)
            conn.sendall(struct.pack("<Q", len(answer)) + answer)
            while conn.recv(4096):  # like rpc-server: wait for the next command
                pass
        except (OSError, EOFError):
            pass
        finally:
            conn.close()
            with self._lock:
                if conn in self._held:
                    self._held.remove(conn)


def _exact(conn: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        piece = conn.recv(size - len(data))
        if not piece:
            raise EOFError
        data += piece
    return data
