# -*- coding: utf-8 -*-
# Copyright: llmfleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
name: lock_model
short_description: The fleet's model with its url and sha256 from the lock when the inventory pins none
version_added: "1.0.0"
description:
  - When C(llmfleet_model) names a Hugging Face file (C(hf_repo), C(hf_file), C(hf_revision)) and has
    neither C(url) nor C(file), returns it with C(url) (pinned to the commit the revision resolved to)
    and C(sha256) from C(llmfleet_lock.model), which C(playbooks/lock.yml) writes, and C(size) (the
    pinned file's bytes, where the download stops) when the sha256 is the lock's and the model sets
    no C(size) of its own.
  - A model with a C(url) or C(file) of its own is returned unchanged (the inventory's pin wins), and
    so is every model when there is no lock.
  - Fails when the lock pins another repository, file or revision than the model asks for.
positional: lock
options:
  _input:
    description: The fleet's C(llmfleet_model).
    type: dict
    required: true
  lock:
    description: C(llmfleet_lock) (empty when there is none).
    type: dict
    default: {}
author:
  - llmfleet contributors
"""

EXAMPLES = r"""
- name: The model the roles install
  ansible.builtin.debug:
    msg: "{{ llmfleet_model | llmfleet.cluster.lock_model(llmfleet_lock | default({})) }}"
"""

RETURN = r"""
_value:
  description: The model, with C(url), C(sha256) and C(size) from the lock where it pinned none.
  type: dict
"""

from ansible.errors import AnsibleFilterError
from ansible_collections.llmfleet.cluster.plugins.module_utils.release_lock import (
    LockError,
    model_from_lock,
)


def lock_model(model, lock=None):
    try:
        return model_from_lock(model, lock or {})
    except LockError as exc:
        raise AnsibleFilterError(str(exc)) from None


class FilterModule(object):
    def filters(self):
        return {"lock_model": lock_model}
