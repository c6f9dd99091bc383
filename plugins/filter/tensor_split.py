# -*- coding: utf-8 -*-
# Copyright: llmfleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
name: tensor_split
short_description: The llama.cpp --tensor-split that gives each RPC worker exactly the wanted layers
version_added: 1.0.0
description:
  - Turns whole layer counts per RPC device (in C(--rpc) order) into a C(--tensor-split) value
    that llama.cpp's own rule (float32 cumulative fractions, upper_bound over n_layer + 1 slots)
    maps back to exactly those counts. The last device with a share also receives the output layer.
  - The result is checked against the rule before it is returned.
options:
  _input:
    description: Repeating layers per RPC device, in C(--rpc) order.
    type: list
    elements: int
    required: true
  head_layers:
    description: Leading layers kept on the head's own CPU (C(-ngl) is then n_layer + 1 - head_layers).
    type: int
    default: 0
"""

EXAMPLES = r"""
- name: Three workers with 6 layers each (the output layer goes to the third)
  ansible.builtin.debug:
    msg: "{{ [6, 6, 6] | llmfleet.cluster.tensor_split }}"  # -> "6,6,7"
"""

RETURN = r"""
_value:
  description: The comma-separated C(--tensor-split) value.
  type: str
"""

from ansible.errors import AnsibleFilterError
from ansible_collections.llmfleet.cluster.plugins.plugin_utils.placement import (
    tensor_split_for,
    verify_split,
)


def tensor_split(counts, head_layers=0):
    try:
        counts = [int(c) for c in counts]
        head_layers = int(head_layers)
        if not counts or any(c < 0 for c in counts) or head_layers < 0:
            raise ValueError(
                "layer counts and head_layers must be non-negative, got %r, %r" % (counts, head_layers)
            )
        slots = list(counts)
        slots[-1] += 1
        n_layer = sum(counts) + head_layers
        value = tensor_split_for(slots)
        verify_split(value, slots, n_layer, n_layer + 1 - head_layers)
    except (TypeError, ValueError, AssertionError) as err:
        raise AnsibleFilterError("tensor_split: %s" % err) from err
    return value


class FilterModule(object):
    def filters(self):
        return {"tensor_split": tensor_split}
