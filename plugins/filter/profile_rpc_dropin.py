# -*- coding: utf-8 -*-
# Copyright: llmfleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
name: profile_rpc_dropin
short_description: the systemd drop-in that runs an installed rpc-server at one thread while it is measured
version_added: 1.0.0
description:
  - From the rpc-server unit the llama_rpc role installed, the drop-in (C(ExecStart=) cleared, then
    the same command line with C(--threads 1)) that playbooks/profile.yml puts in /run while the
    measuring request runs, or an empty string when the unit already runs one thread.
  - rpc-server has no C(--poll); with more threads its CPU seconds are mostly its threads spinning,
    not its work, so the profile measures every worker at one thread (docs/profile.md).
  - The logic lives in C(plugins/plugin_utils/profile.py) (C(single_thread_dropin)).
options:
  _input:
    description: The text of the installed unit file.
    type: str
    required: true
  host:
    description: The worker's inventory name (named in errors).
    type: str
    required: true
"""

EXAMPLES = r"""
- name: The drop-in for this worker
  ansible.builtin.set_fact:
    dropin: "{{ unit.content | b64decode | llmfleet.cluster.profile_rpc_dropin(inventory_hostname) }}"
"""

RETURN = r"""
_value:
  description: The drop-in's text, or an empty string when the unit runs one thread already.
  type: str
"""

from ansible.errors import AnsibleFilterError
from ansible_collections.llmfleet.cluster.plugins.plugin_utils.profile import (
    ProfileError,
    single_thread_dropin,
)


def profile_rpc_dropin(unit_text, host):
    try:
        return single_thread_dropin(str(unit_text or ""), str(host))
    except ProfileError as err:
        raise AnsibleFilterError("profile_rpc_dropin: %s" % err) from err


class FilterModule(object):
    def filters(self):
        return {"profile_rpc_dropin": profile_rpc_dropin}
