# -*- coding: utf-8 -*-
# Copyright: llmfleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The fleet-wide settings (``llmfleet_*``) and their defaults, each written once.

Every playbook, role default and template that reads a fleet-wide setting asks for it through
the lookup ``llmfleet.cluster.fleet`` (plugins/lookup/fleet.py): the inventory's value when it
sets one, else the default here (the planner's options: their default in placement_hosts.Options,
the planner's one options table). Facts the roles set (``llmfleet_host``, ``llmfleet_plan``,
``llmfleet_wireguard_address``) are not settings and are not here. Controller-only code, no
Ansible import.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Dict, NamedTuple, Optional

from ansible_collections.llmfleet.cluster.plugins.plugin_utils.placement_hosts import planner_settings


class Setting(NamedTuple):
    default: Any
    # the default is computed from other variables (value(name) -> their value, None when unset)
    computed: Optional[Callable[[Callable[[str], Any]], Any]] = None
    # an empty value ("", None) counts as unset
    empty_is_unset: bool = False


def _lock_file(value: Callable[[str], Any]) -> str:
    return "%s/group_vars/all/llmfleet_lock.yml" % (value("inventory_dir") or ".")


def _tls(value: Callable[[str], Any]) -> bool:
    # TLS whenever the head serves the password-protected chat page (issue #31 item 8): the
    # password and the API key never cross the LAN in clear unless the inventory asks for it
    return value("chat_ui_password") is not None


def _hf_endpoint(_value: Callable[[str], Any]) -> str:
    return os.environ.get("HF_ENDPOINT") or "https://huggingface.co"


SETTINGS: Dict[str, Setting] = {
    # where and how the fleet is deployed
    "llmfleet_target": Setting("systemd"),
    "llmfleet_backend": Setting("llama_cpp"),
    "llmfleet_output_dir": Setting("build"),
    "llmfleet_render_only": Setting(False),
    "llmfleet_kubeconfig": Setting(""),
    "llmfleet_tls": Setting(False, computed=_tls),
    "llmfleet_wireguard": Setting(True),
    "llmfleet_site_verify": Setting(True),
    "llmfleet_dedicated": Setting(False),
    "llmfleet_node_labels": Setting({}),
    "llmfleet_node_taints": Setting([]),
    # The environment of every llama.cpp process on a host (the probe's device listing, rpc-server,
    # llama-server), e.g. {GGML_VK_VISIBLE_DEVICES: "0"} for lavapipe (docs/vulkan.md).
    "llmfleet_llama_cpp_env": Setting({}),
    # the model and the plan (the planner's options are added below, from placement_hosts.Options)
    "llmfleet_model": Setting({}),
    "llmfleet_reserve_mib": Setting(64),
    # the release lock (playbooks/lock.yml)
    "llmfleet_lock": Setting({}),
    "llmfleet_lock_file": Setting(None, computed=_lock_file),
    "llmfleet_lock_max_json_bytes": Setting(8388608),
    "llmfleet_lock_max_download_bytes": Setting(1073741824),
    "llmfleet_github_api": Setting("https://api.github.com"),
    "llmfleet_hf_endpoint": Setting(None, computed=_hf_endpoint, empty_is_unset=True),
}


# The planner's options: their settings and defaults are Options' table (placement_hosts.py), not
# written again here.
PLANNER_SETTINGS = {name: Setting(default) for name, (_option, default) in planner_settings().items()}
SETTINGS.update(PLANNER_SETTINGS)


class FleetSettingError(KeyError):
    """A name that is not a fleet-wide setting."""

    def __str__(self) -> str:
        return str(self.args[0])


def setting(name: str, value: Callable[[str], Any]) -> Any:
    """The setting ``name``: ``value(name)`` when the play defines it, else its default.

    ``value(name)`` returns the play's (templated) value, or ``None`` when it is not defined.
    """
    entry = SETTINGS.get(name)
    if entry is None:
        raise FleetSettingError(
            "%r is not a fleet-wide setting (known: %s)" % (name, ", ".join(sorted(SETTINGS)))
        )
    given = value(name)
    if given is not None and not (entry.empty_is_unset and given == ""):
        return given
    return entry.computed(value) if entry.computed else entry.default
