# -*- coding: utf-8 -*-
# Copyright: llmfleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Filters of the release lock and the pinned llama.cpp release (docs/artifacts.md).

Thin wrappers over plugins/plugin_utils and plugins/module_utils. Each filter's documentation is
its sidecar file beside this one (plugins/filter/<name>.yml: ``ansible-doc -t filter
llmfleet.cluster.<name>``).
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ansible.errors import AnsibleFilterError
from ansible_collections.llmfleet.cluster.plugins.module_utils.artifacts import (
    ReleaseLookupError,
    select_release,
)
from ansible_collections.llmfleet.cluster.plugins.module_utils.release_lock import (
    LockError,
    model_from_lock,
)
from ansible_collections.llmfleet.cluster.plugins.plugin_utils.rpc_fleet import (
    RpcProtoMismatch,
    check_hosts,
)


def lock_model(model, lock=None):
    try:
        return model_from_lock(model, lock or {})
    except LockError as exc:
        raise AnsibleFilterError(str(exc)) from None


def llama_cpp_release(releases, build, flavour, host="this host"):
    try:
        return select_release(releases, build, flavour, str(host))
    except ReleaseLookupError as exc:
        raise AnsibleFilterError(str(exc)) from None


def llama_cpp_rpc_check(head, workers, hostvars, lock=None):
    llama_cpp = ((lock or {}).get("llama_cpp") or {}) if hasattr(lock or {}, "get") else {}
    try:
        return check_hosts(
            str(head), [str(w) for w in workers or []], hostvars, llama_cpp.get("releases") or {}
        )
    except RpcProtoMismatch as exc:
        raise AnsibleFilterError("plan: %s" % exc) from None


class FilterModule(object):
    def filters(self):
        return {
            "lock_model": lock_model,
            "llama_cpp_release": llama_cpp_release,
            "llama_cpp_rpc_check": llama_cpp_rpc_check,
        }
