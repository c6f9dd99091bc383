"""The supervisor counts a worker as live only when it speaks the pinned build's ggml-rpc protocol.

llama-server of the pinned llama.cpp build refuses an rpc-server whose protocol major differs or
whose minor is newer (``negotiate_hello`` in ggml/src/ggml-rpc/ggml-rpc.cpp); a worker the
supervisor counted up on any 28-byte answer would make it start llama-server on a placement that
cannot load. The fake rpc-servers (tests/support/fake_rpc.py) speak the real HELLO on loopback.
"""

from __future__ import annotations

import importlib.util
import os
import re
from pathlib import Path

import pytest

from tests.support.fake_rpc import FakeRpcServer

ROOT = Path(__file__).resolve().parents[3]
SUPERVISOR = ROOT / "roles" / "llama_rpc" / "files" / "llmfleet_supervisor.py"
_spec = importlib.util.spec_from_file_location("llmfleet_supervisor_protocol", SUPERVISOR)
assert _spec is not None and _spec.loader is not None
sup = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(sup)

CACHE = Path(os.environ.get("CACHE", ROOT / ".cache"))
PINNED_HEADER = CACHE / "build" / "llama.cpp" / "ggml" / "include" / "ggml-rpc.h"


@pytest.mark.parametrize(
    ("version", "up"),
    [
        ((7, 0, 0), True),
        ((7, 0, 3), True),  # a patch release: the same protocol
        ((7, 1, 0), False),  # newer minor: the pinned llama-server refuses it
        ((6, 9, 0), False),
        ((8, 0, 0), False),
        ((0, 0, 0), False),
    ],
)
def test_only_the_pinned_protocol_counts_as_up(version: tuple[int, int, int], up: bool) -> None:
    server = FakeRpcServer("rpc", version=version)
    try:
        ok, detail = sup.rpc_hello(server.endpoint, 2.0)
    finally:
        server.down()
    print(f"{version}: {ok} {detail}")
    assert ok is up, detail
    assert f"protocol {'.'.join(map(str, version))}" in detail
    if not up:
        assert "the pinned llama-server speaks 7.0.x" in detail


def test_the_three_byte_answer_of_older_protocols_is_not_a_live_worker() -> None:
    server = FakeRpcServer("old", version=(2, 0, 0))
    try:
        ok, detail = sup.rpc_hello(server.endpoint, 2.0)
    finally:
        server.down()
    assert not ok
    assert "3-byte message" in detail


@pytest.mark.skipif(not PINNED_HEADER.exists(), reason="the pinned llama.cpp source is not extracted")
def test_the_supervisor_pins_the_protocol_of_the_pinned_source() -> None:
    text = PINNED_HEADER.read_text()
    found = tuple(
        int(re.search(rf"#define RPC_PROTO_{part}_VERSION\s+(\d+)", text).group(1))  # type: ignore[union-attr]
        for part in ("MAJOR", "MINOR", "PATCH")
    )
    assert found == sup.RPC_PROTO_VERSION, f"{PINNED_HEADER} says {found}"
    source = (PINNED_HEADER.parents[1] / "src" / "ggml-rpc" / "ggml-rpc.cpp").read_text()
    # the answer's layout the supervisor reads: major, minor, patch, padding, then the caps
    layout = re.search(r"struct rpc_msg_hello_rsp \{(.*?)\};", source, re.S).group(1)  # type: ignore[union-attr]
    fields = re.findall(r"uint8_t (\w+)(?:\[(\w+)\])?;", layout)
    assert [name for name, _unused in fields] == ["major", "minor", "patch", "padding", "conn_caps"]
    transport = (PINNED_HEADER.parents[1] / "src" / "ggml-rpc" / "transport.h").read_text()
    caps = int(re.search(r"RPC_CONN_CAPS_SIZE\s*=\s*(\d+)", transport).group(1))  # type: ignore[union-attr]
    assert 4 + caps == sup.HELLO_ANSWER_SIZE
