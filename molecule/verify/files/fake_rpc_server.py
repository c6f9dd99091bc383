#!/usr/bin/env python
"""A stand-in for ggml-rpc-server in the verify scenario: work and bytes on demand.

Each connection sends "N\n"; the server burns about 0.3 s of CPU (as a worker computing its
layers would) and answers with N bytes. Standard library only.
"""

import socket
import sys
import time


def burn(seconds: float) -> None:
    end = time.process_time() + seconds
    x = 0
    while time.process_time() < end:
        x += sum(range(1000))


def main() -> None:
    host, port = sys.argv[1], int(sys.argv[2])
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind((host, port))
    server.listen(4)
    print(f"fake rpc-server listening on {host}:{port}", flush=True)
    while True:
        conn, peer = server.accept()
        with conn:
            size = int(conn.makefile("r").readline() or 0)
            burn(0.3)
            conn.sendall(b"x" * size)
            print(f"served {size} bytes to {peer[0]}", flush=True)


if __name__ == "__main__":
    main()
