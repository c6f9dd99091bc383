# -*- coding: utf-8 -*-
# Copyright: llmfleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import absolute_import, division, print_function

__metaclass__ = type


class ModuleDocFragment(object):
    """Options the tune.yml filters share."""

    # tune_decide, tune_needs_profile: the running plan they are applied to.
    DOCUMENTATION = r"""
options:
  _input:
    description: The running plan (C(plan.json)).
    type: dict
    required: true
notes:
  - The logic lives in C(plugins/plugin_utils/tune.py); docs/tune.md describes tune.yml.
"""
