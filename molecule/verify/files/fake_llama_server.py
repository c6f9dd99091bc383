#!/usr/bin/env python
"""A stand-in for llama-server in the verify scenario.

POST /v1/chat/completions with the bearer key of KEY_FILE: asks every worker of WORKERS
(host:port, comma-separated) for 200 kB (each burns CPU for it), unless SKIP_FILE exists (the
drill of a worker that holds layers but does no work), and answers like llama-server with
``timings``. Standard library only.
"""

import json
import os
import socket
import sys
import time
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import ClassVar

KEY_FILE = "/etc/llmfleet/api-key"
SKIP_FILE = "/etc/llmfleet/fake-skip-workers"


class Handler(BaseHTTPRequestHandler):
    workers: ClassVar[list] = []

    def do_POST(self):
        with open(KEY_FILE) as handle:
            key = handle.read().strip()
        if self.headers.get("Authorization") != "Bearer " + key:
            self.send_response(401)
            self.end_headers()
            return
        request = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))) or b"{}")
        started = time.monotonic()
        if not os.path.exists(SKIP_FILE):
            for worker in self.workers:
                host, port = worker.rsplit(":", 1)
                with socket.create_connection((host, int(port)), timeout=30) as conn:
                    conn.sendall(b"200000\n")
                    received = 0
                    while received < 200000:
                        chunk = conn.recv(65536)
                        if not chunk:
                            break
                        received += len(chunk)
        ms = (time.monotonic() - started) * 1000.0
        body = {
            "object": "chat.completion",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "The sea is wide."}}],
            "usage": {"prompt_tokens": 12, "completion_tokens": 5, "total_tokens": 17},
            "timings": {
                "prompt_n": 12,
                "prompt_ms": 1.0,
                "prompt_per_second": 12000.0,
                "predicted_n": 5,
                "predicted_ms": ms,
                "predicted_per_second": 5000.0 / max(ms, 1.0),
            },
        }
        if request.get("stream"):
            self.stream(body)
            return
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def stream(self, body):
        """Server-sent events like llama-server: one chunk per word, usage and timings last."""
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for word in body["choices"][0]["message"]["content"].split(" "):
            chunk = {
                "object": "chat.completion.chunk",
                "choices": [{"index": 0, "delta": {"content": word + " "}}],
            }
            self.wfile.write(("data: " + json.dumps(chunk) + "\n\n").encode())
            self.wfile.flush()
            time.sleep(0.05)
        last = {
            "object": "chat.completion.chunk",
            "choices": [],
            "usage": body["usage"],
            "timings": body["timings"],
        }
        self.wfile.write(("data: " + json.dumps(last) + "\n\ndata: [DONE]\n\n").encode())
        self.close_connection = True


def main():
    Handler.workers = [w for w in sys.argv[2].split(",") if w]
    HTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()


if __name__ == "__main__":
    main()
