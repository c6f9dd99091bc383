"""TLS by default on the fleet's entry point (issue #31 item 8).

Whenever the chat page is deployed (chat_ui_password set), the page serves HTTPS, llama-server
listens on the head's loopback only and the API goes through the page's TLS port, for the
fleet, Prometheus and the bench alike, unless the inventory asks for plain HTTP with
``llmfleet_tls: false`` (or ``chat_ui_tls: false`` for the page alone). Each role's own
defaults/main.yml is rendered by Ansible's templar, as a play would. On the code before this
change the page was plain HTTP and llama-server on 0.0.0.0 unless llmfleet_tls was set.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.ansible_env import load_collection_plugins

ROLES = Path(__file__).resolve().parents[3] / "roles"
PASSWORD = {"chat_ui_password": "a-password-of-24-letters"}


def _trusted(value: Any) -> Any:
    try:
        from ansible.template import trust_as_template  # ansible-core >= 2.19
    except ImportError:  # pragma: no cover - older ansible-core trusts every string
        return value
    return trust_as_template(value) if isinstance(value, str) else value


def default(role: str, name: str, **inventory: Any) -> str:
    """The value ``name`` takes from ``role``'s defaults under these inventory variables."""
    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar

    load_collection_plugins()  # the defaults read llmfleet.cluster.fleet, a collection lookup
    variables = {
        k: _trusted(v)
        for k, v in yaml.safe_load((ROLES / role / "defaults" / "main.yml").read_text()).items()
    }
    variables.update(inventory)
    return str(Templar(loader=DataLoader(), variables=variables).template(_trusted("{{ " + name + " }}")))


ENTRY_POINT = [
    ("chat_ui", "chat_ui_tls", "True", "False"),
    ("chat_ui", "chat_ui_api_passthrough", "True", "False"),
    ("llama_rpc", "llama_rpc_api_host", "127.0.0.1", "0.0.0.0"),
    ("monitoring", "monitoring_api_scheme", "https", "http"),
    ("monitoring", "monitoring_api_port", "8088", "8080"),
    ("bench", "bench_api_scheme", "https", "http"),
    ("bench", "bench_api_port", "8088", "8080"),
]


@pytest.mark.parametrize(("role", "name", "tls", "plain"), ENTRY_POINT)
def test_the_page_is_the_tls_entry_point_by_default(role: str, name: str, tls: str, plain: str) -> None:
    assert default(role, name, **PASSWORD) == tls


@pytest.mark.parametrize(("role", "name", "tls", "plain"), ENTRY_POINT)
def test_plain_http_only_when_asked_for(role: str, name: str, tls: str, plain: str) -> None:
    assert default(role, name, llmfleet_tls=False, **PASSWORD) == plain
    assert default(role, name, llmfleet_tls=True, **PASSWORD) == tls


@pytest.mark.parametrize(("role", "name", "tls", "plain"), ENTRY_POINT[2:])
def test_without_a_page_the_api_stays_where_clients_reach_it(
    role: str, name: str, tls: str, plain: str
) -> None:
    """No page, no TLS front: llama-server keeps answering the LAN (docs/security.md says so)."""
    assert default(role, name) == plain


def test_the_password_needs_16_characters() -> None:
    preflight = (ROLES / "chat_ui" / "tasks" / "preflight.yml").read_text()
    assert "chat_ui_password | length >= 16" in preflight
