# -*- coding: utf-8 -*-
# Copyright: llmfleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Filters that write systemd unit values (roles/llama_rpc and every role with a unit).

Thin wrappers over plugins/plugin_utils and plugins/module_utils. Each filter's documentation is
its sidecar file beside this one (plugins/filter/<name>.yml: ``ansible-doc -t filter
llmfleet.cluster.<name>``).
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ansible.errors import AnsibleFilterError
from ansible_collections.llmfleet.cluster.plugins.plugin_utils.systemd_unit import (
    UnitValueError,
    quote,
    quote_words,
    unsafe,
)


def systemd_quote(value, mode="exec", executable=False, name="value"):
    try:
        if isinstance(value, (list, tuple)):
            return quote_words(list(value), mode, name=name)
        return quote(value, mode, executable=bool(executable), name=name)
    except UnitValueError as err:
        raise AnsibleFilterError("systemd_quote: %s" % err) from err


def systemd_unsafe(values):
    if not isinstance(values, dict):
        raise AnsibleFilterError(
            "systemd_unsafe: expects a mapping of variable name -> value, got %r" % (values,)
        )
    return unsafe(values)


class FilterModule(object):
    def filters(self):
        return {
            "systemd_quote": systemd_quote,
            "systemd_unsafe": systemd_unsafe,
        }
