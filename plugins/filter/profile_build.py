# -*- coding: utf-8 -*-
# Copyright: llmfleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
name: profile_build
short_description: profile.json after a measuring run (compute cost per host and link figures)
version_added: 1.0.0
description:
  - Turns the verify role's CPU samples of one real request into each host's decode cost in ms
    per layer per token (the unit's CPU seconds during the request, times the decode share of its
    time, over the CPUs it could use at once, over the tokens and the host's layers - the output
    layer counted by its weight), adds the link probe's figures, and returns the new profile with
    each host's fingerprint, the llama.cpp build, the model's sha256 and when it was measured.
  - With O(moved) (requests through the same split with the output layer moved), the output
    layer's cost is measured on each worker that held it, a worker's layers are priced from a
    request in which it held no output layer, and the head is priced from the requests' wall
    time - its output layer, its layers and C(token_ms), what a token takes beyond every worker's
    terms (docs/profile.md).
  - What could not be measured is kept as C(not_measured) sentences naming the host. A zero,
    negative, non-finite figure or a 0 Mbit link fails the filter naming the host.
  - The logic lives in C(plugins/plugin_utils/profile_figures.py) (C(measure)) and C(plugins/plugin_utils/profile.py) (C(build_profile)).
options:
  _input:
    description: Host name -> the three C(llmfleet.cluster.host_usage) samples of the verify role.
    type: dict
    required: true
  plan:
    description: The plan that served the request (C(llmfleet_plan)).
    type: dict
    required: true
  timings:
    description: llama-server's C(timings) of the request.
    type: dict
    required: true
  facts:
    description: Host name -> C(llmfleet_host).
    type: dict
    required: true
  units:
    description: Plan role -> the llama.cpp unit sampled on such hosts.
    type: dict
    required: true
  links:
    description: Host name -> the M(llmfleet.cluster.link_probe) result.
    type: dict
    default: {}
  moved:
    description:
      - The other measuring requests, through the same split with the output layer moved - each
        with C(plan) (its placement), C(samples) (host -> samples, as O(_input)) and C(timings);
        one dict or a list (entries with an empty C(plan) are left out). Empty - one request only.
    type: raw
    default: []
  previous:
    description: The profile of an earlier run (its hosts are kept when build and model are the same).
    type: dict
    default: {}
  build:
    description: The llama.cpp build (C(llama_cpp_build)).
    type: str
    required: true
  model:
    description: The model (C(name), C(sha256)).
    type: dict
    required: true
  now:
    description: The UTC time to record.
    type: str
    required: true
"""

EXAMPLES = r"""
- name: Build the profile
  ansible.builtin.set_fact:
    profile: >-
      {{ samples | llmfleet.cluster.profile_build(plan=llmfleet_plan, timings=answer.json.timings,
           facts=facts, units=verify_units, links=links, build=llama_cpp_build,
           model=llmfleet_model, now=now(utc=true).strftime('%Y-%m-%dT%H:%M:%SZ')) }}
"""

RETURN = r"""
_value:
  description: The profile (docs/profile.schema.json).
  type: dict
"""

from ansible.errors import AnsibleFilterError
from ansible_collections.llmfleet.cluster.plugins.plugin_utils.profile import ProfileError, build_profile
from ansible_collections.llmfleet.cluster.plugins.plugin_utils.profile_figures import measure


def profile_build(
    samples, plan, timings, facts, units, build, model, now, links=None, previous=None, moved=None
):
    try:
        got = measure(
            plan, samples or {}, timings or {}, facts or {}, units or {}, links or {}, moved or None
        )
        return build_profile(
            previous or None,
            str(build),
            model or {},
            facts or {},
            got["hosts"],
            links or {},
            str(now),
            {"output_layers": got["output_layers"], "token": got["token"]},
        )
    except ProfileError as err:
        raise AnsibleFilterError("profile_build: %s" % err) from err
    except (TypeError, ValueError, AttributeError) as err:
        raise AnsibleFilterError("profile_build: malformed input: %s" % err) from err


class FilterModule(object):
    def filters(self):
        return {"profile_build": profile_build}
