# -*- coding: utf-8 -*-
# Copyright: llmfleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
name: systemd_unsafe
short_description: the control characters in inventory values a systemd unit will carry
version_added: 1.0.0
description:
- One line per value with a control character (a newline, a carriage return, ...), naming the variable
  (and the list index or key within it) and the value; an empty list when all are clean.
- The roles' preflights assert on it before any unit is written, so that an inventory value (a chat title,
  llama_rpc_server_extra_args) never becomes a new line of a unit.
- The logic lives in C(plugins/plugin_utils/systemd_unit.py)
  (C(unsafe)).
options:
  _input:
    description: A mapping of variable name to value (strings, numbers, lists, mappings).
    type: dict
    required: true
"""

EXAMPLES = r"""
- name: Refuse control characters in the values the units carry
  ansible.builtin.assert:
    that: __problems | length == 0
    fail_msg: "{{ inventory_hostname }}: {{ __problems | join('; ') }}"
  vars:
    __problems: "{{ {'chat_ui_title': chat_ui_title} | llmfleet.cluster.systemd_unsafe }}"
"""

RETURN = r"""
_value:
  description: One line per control character found, naming the variable and the value.
  type: list
  elements: str
"""

from ansible.errors import AnsibleFilterError
from ansible_collections.llmfleet.cluster.plugins.plugin_utils.systemd_unit import unsafe


def systemd_unsafe(values):
    if not isinstance(values, dict):
        raise AnsibleFilterError(
            "systemd_unsafe: expects a mapping of variable name -> value, got %r" % (values,)
        )
    return unsafe(values)


class FilterModule(object):
    def filters(self):
        return {"systemd_unsafe": systemd_unsafe}
