"""A fake OpenAI-compatible upstream that streams slowly, for tests of the chat page.

It answers like llama-server (``flavour="llama_cpp"``: a ``timings`` object in the last
chunk) or like vLLM (``flavour="vllm"``: the request must name the served model, else
404, and a ``usage`` chunk when ``stream_options.include_usage`` is set). It checks the
API key (401 without ``Authorization: Bearer <key>`` when a key is set) and records
every request so a test can see what the chat app sent upstream.

In a test::

    with FakeUpstream(tokens=["Hel", "lo"], delay=0.2, api_key="k") as up:
        ... up.url ... up.requests ... up.finished.is_set()

``gate``: when set to a ``threading.Event``, the stream sends its first token and then
waits for the event before sending the rest. A relay that buffers would never deliver
the first token before the stream ends, so a test can prove chunk-by-chunk relaying
without relying on timing.

From the command line (molecule, or a browser test by hand)::

    python3 fake_openai.py --port 8080 --api-key-file KEYFILE --delay 0.1 --flavour vllm

Standard library only, so it can be copied onto a test host and run there.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Optional

DEFAULT_TOKENS = ["The ", "fleet ", "answers ", "one ", "token ", "at ", "a ", "time."]


class FakeUpstream:
    def __init__(
        self,
        tokens: Optional[list[str]] = None,
        delay: float = 0.0,
        api_key: str = "",
        model: str = "fake-model",
        flavour: str = "llama_cpp",
        gate: Optional[threading.Event] = None,
        fail_status: int = 0,
        fail_body: str = "",
        host: str = "127.0.0.1",
        port: int = 0,
    ):
        if flavour not in ("llama_cpp", "vllm"):
            raise ValueError(f"flavour must be llama_cpp or vllm, not {flavour!r}")
        self.tokens = list(DEFAULT_TOKENS if tokens is None else tokens)
        self.delay = delay
        self.api_key = api_key
        self.model = model
        self.flavour = flavour
        self.gate = gate
        self.fail_status = fail_status
        self.fail_body = fail_body
        self.requests: list[dict[str, Any]] = []
        self.finished = threading.Event()
        self.aborted = threading.Event()  # the client (the chat app) hung up mid-stream
        self.started = threading.Event()
        self._server = ThreadingHTTPServer((host, port), _make_handler(self))
        self._server.daemon_threads = True
        self._thread: Optional[threading.Thread] = None

    @property
    def port(self) -> int:
        return self._server.server_address[1]

    @property
    def url(self) -> str:
        return f"http://{self._server.server_address[0]}:{self.port}"

    def answer(self) -> str:
        return "".join(self.tokens)

    def start(self) -> FakeUpstream:
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,), daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self.gate is not None:
            self.gate.set()
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> FakeUpstream:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _make_handler(up: FakeUpstream) -> type:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def _json(self, status: int, obj: Any) -> None:
            body = json.dumps(obj).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _record(self, body: Any) -> None:
            up.requests.append(
                {
                    "method": self.command,
                    "path": self.path,
                    "headers": dict(self.headers.items()),
                    "body": body,
                }
            )

        def _authorised(self) -> bool:
            if not up.api_key:
                return True
            if self.headers.get("Authorization") == "Bearer " + up.api_key:
                return True
            self._json(
                401, {"error": {"code": 401, "message": "Invalid API Key", "type": "authentication_error"}}
            )
            return False

        def do_GET(self) -> None:
            self._record(None)
            path = self.path.split("?", 1)[0]
            if path == "/health":
                return self._json(200, {"status": "ok"})
            if not self._authorised():
                return None
            if path == "/v1/models":
                return self._json(200, {"object": "list", "data": [{"id": up.model, "object": "model"}]})
            return self._json(404, {"error": {"message": "not found"}})

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length)
            try:
                body = json.loads(raw)
            except ValueError:
                body = raw
            self._record(body)
            if not self._authorised():
                return None
            if self.path.split("?", 1)[0] != "/v1/chat/completions":
                return self._json(404, {"error": {"message": "not found"}})
            if up.fail_status:
                data = up.fail_body.encode()
                self.send_response(up.fail_status)
                self.send_header("Content-Type", "text/plain")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                return None
            if up.flavour == "vllm" and (not isinstance(body, dict) or body.get("model") != up.model):
                name = body.get("model") if isinstance(body, dict) else None
                return self._json(404, {"error": {"message": f"The model `{name}` does not exist."}})
            self._stream(body if isinstance(body, dict) else {})
            return None

        def _event(self, obj: Any) -> None:
            data = b"data: " + (obj if isinstance(obj, bytes) else json.dumps(obj).encode()) + b"\n\n"
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.flush()

        def _chunk(self, delta: dict[str, Any], finish: Optional[str] = None) -> dict[str, Any]:
            return {
                "id": "chatcmpl-fake",
                "object": "chat.completion.chunk",
                "created": int(time.time()),
                "model": up.model,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
            }

        def _stream(self, body: dict[str, Any]) -> None:
            try:
                self._stream_events(body)
            except (ConnectionError, OSError):
                up.aborted.set()
                self.close_connection = True

        def _stream_events(self, body: dict[str, Any]) -> None:
            up.started.set()
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            t0 = time.monotonic()
            self._event(self._chunk({"role": "assistant", "content": None}))
            for i, token in enumerate(up.tokens):
                if i == 1 and up.gate is not None and not up.gate.wait(timeout=30):
                    break
                if up.delay:
                    time.sleep(up.delay)
                self._event(self._chunk({"content": token}))
            last = self._chunk({}, "stop")
            elapsed = max(time.monotonic() - t0, 1e-6)
            if up.flavour == "llama_cpp":
                last["timings"] = {
                    "predicted_n": len(up.tokens),
                    "predicted_per_second": len(up.tokens) / elapsed,
                }
            self._event(last)
            if up.flavour == "vllm" and (body.get("stream_options") or {}).get("include_usage"):
                usage = self._chunk({})
                usage["choices"] = []
                usage["usage"] = {
                    "prompt_tokens": 5,
                    "completion_tokens": len(up.tokens),
                    "total_tokens": 5 + len(up.tokens),
                }
                self._event(usage)
            self._event(b"[DONE]")
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
            up.finished.set()

    return Handler


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bind", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--api-key-file", default="")
    parser.add_argument("--delay", type=float, default=0.1)
    parser.add_argument("--flavour", default="llama_cpp", choices=["llama_cpp", "vllm"])
    parser.add_argument("--model", default="fake-model")
    args = parser.parse_args(argv)
    key = ""
    if args.api_key_file:
        with open(args.api_key_file, encoding="utf-8") as handle:
            key = handle.read().strip()
    up = FakeUpstream(
        delay=args.delay, api_key=key, model=args.model, flavour=args.flavour, host=args.bind, port=args.port
    )
    print(f"fake upstream on {up.url} ({args.flavour})", flush=True)
    with contextlib.suppress(KeyboardInterrupt):
        up._server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
