"""The knock from a lost connection's address (RFC 793 half-open recovery), on loopback: what each
outcome means to the supervisor. The recovery itself, against the real rpc-server after a silent
partition, is in test_supervisor_partition.py."""

from __future__ import annotations

import importlib.util
import socket
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
SUPERVISOR = ROOT / "roles" / "llama_rpc" / "files" / "llmfleet_supervisor.py"
_spec = importlib.util.spec_from_file_location("llmfleet_supervisor_knock", SUPERVISOR)
assert _spec is not None and _spec.loader is not None
sup = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(sup)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_a_listening_worker_answers_and_the_address_is_forgotten() -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        outcome, detail = sup.knock(("127.0.0.1", free_port()), listener.getsockname(), 2.0)
    assert (outcome, detail) == ("answered", "connected")


def test_a_closed_port_answers_too() -> None:
    outcome, _detail = sup.knock(("127.0.0.1", free_port()), ("127.0.0.1", free_port()), 2.0)
    assert outcome == "answered"


def test_a_port_still_held_here_is_tried_again_later() -> None:
    with socket.socket() as held, socket.socket() as listener:
        held.bind(("127.0.0.1", 0))
        held.listen(1)
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        outcome, _detail = sup.knock(held.getsockname(), listener.getsockname(), 2.0)
    assert outcome == "held"


def test_an_address_that_is_not_this_hosts_is_forgotten() -> None:
    outcome, _detail = sup.knock(("192.0.2.1", free_port()), ("127.0.0.1", free_port()), 2.0)
    assert outcome == "moot"


def test_lost_addresses_are_kept_per_worker_newest_last_and_bounded() -> None:
    supervisor = sup.Supervisor.__new__(sup.Supervisor)
    supervisor.locals = {"w1": {("10.0.0.1", 40000 + i) for i in range(sup.KNOCK_KEEP + 3)}, "w2": set()}
    supervisor.lost = {}
    supervisor.forget_connections(["w1", "w2"])
    assert supervisor.locals == {}
    assert len(supervisor.lost["w1"]) == sup.KNOCK_KEEP
    assert supervisor.lost["w1"][-1] == ("10.0.0.1", 40000 + sup.KNOCK_KEEP + 2)
    assert "w2" not in supervisor.lost
