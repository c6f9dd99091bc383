"""Load the chat page app (roles/chat_ui/files/llmfleet_chat.py, a standalone script) and serve it
on loopback in a thread, for the unit and browser tests."""

from __future__ import annotations

import contextlib
import importlib.util
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

APP_PATH = Path(__file__).resolve().parents[2] / "roles" / "chat_ui" / "files" / "llmfleet_chat.py"


def load_chat_app() -> ModuleType:
    """The app as a module (loaded once by path: it is not part of a package)."""
    module = sys.modules.get("llmfleet_chat")
    if module is not None and getattr(module, "__file__", None) == str(APP_PATH):
        return module
    spec = importlib.util.spec_from_file_location("llmfleet_chat", APP_PATH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["llmfleet_chat"] = module
    spec.loader.exec_module(module)
    return module


@contextlib.contextmanager
def serve_chat_app(**settings: Any) -> Iterator[Any]:
    """Serve the app with these Config settings (port 0 = any free one); yields the server."""
    chat = load_chat_app()
    settings.setdefault("port", 0)
    settings.setdefault("listen", "127.0.0.1")
    server = chat.ChatServer(chat.Config(**settings))
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


class RunningChatApp:
    """The app's real server on a free loopback port, served by a thread (a context manager);
    ``settings`` are Config's, on top of port 0, the /chat prefix and a 20 s upstream timeout."""

    def __init__(self, chat: ModuleType, **settings: Any):
        self.server = chat.ChatServer(
            chat.Config(**{"port": 0, "prefix": "/chat", "timeout": 20.0, **settings})
        )
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self) -> RunningChatApp:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
