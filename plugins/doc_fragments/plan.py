# -*- coding: utf-8 -*-
# Copyright: llmfleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import absolute_import, division, print_function

__metaclass__ = type


class ModuleDocFragment(object):
    """Options the planning and the vLLM filters share."""

    # plan_placement, plan_keep: the model the plan is for.
    DOCUMENTATION = r"""
options:
  model:
    description: The inventory's C(llmfleet_model) (C(name), C(file) or C(url), C(sha256)).
    type: dict
    required: true
"""

    # vllm_lws_preflight, vllm_lws_manifests: the probe's facts of the stage hosts.
    FACTS = r"""
options:
  facts:
    description: Host name to that host's C(llmfleet_host) facts, for every stage host.
    type: dict
    required: true
"""
