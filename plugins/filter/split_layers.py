# -*- coding: utf-8 -*-
# Copyright: llmfleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
name: split_layers
short_description: The layers llama.cpp gives each RPC device for a --tensor-split
version_added: 1.0.0
description:
  - Applies llama.cpp's layer assignment (float32 cumulative fractions of the split, upper_bound
    over n_layer + 1 slots, the first n_layer + 1 - ngl slots on the head's CPU) and returns
    what each device receives. Useful to show what an arbitrary split would do.
options:
  _input:
    description: The C(--tensor-split) value (comma-separated) or a list of weights.
    type: raw
    required: true
  n_layer:
    description: Repeating layers of the model.
    type: int
    required: true
  ngl:
    description: The C(-ngl) value (default all layers and the output layer).
    type: int
"""

EXAMPLES = r"""
- name: What "1,1,6" does to an 8-layer model
  ansible.builtin.debug:
    msg: "{{ '1,1,6' | llmfleet.cluster.split_layers(n_layer=8) }}"
  # -> {"cpu_slots": 0, "slots": [2, 1, 6], "layers": [2, 1, 5], "output_device": 2}
"""

RETURN = r"""
_value:
  description: C(cpu_slots), C(slots) per device, C(layers) per device (without the output slot), C(output_device) (-1 for the CPU).
  type: dict
"""

from ansible.errors import AnsibleFilterError
from ansible_collections.llmfleet.cluster.plugins.plugin_utils.placement import assign_slots


def split_layers(value, n_layer, ngl=None):
    try:
        if isinstance(value, str):
            weights = [float(x) for x in value.replace("/", ",").split(",") if x.strip()]
        else:
            weights = [float(x) for x in value]
        n_layer = int(n_layer)
        ngl = n_layer + 1 if ngl is None else int(ngl)
        slots = assign_slots(weights, n_layer, ngl)
    except (TypeError, ValueError) as err:
        raise AnsibleFilterError("split_layers: %s (input %r)" % (err, value)) from err
    per_device = [slots.count(i) for i in range(len(weights))]
    output = slots[n_layer]
    layers = list(per_device)
    if output >= 0:
        layers[output] -= 1
    return {"cpu_slots": slots.count(-1), "slots": per_device, "layers": layers, "output_device": output}


class FilterModule(object):
    def filters(self):
        return {"split_layers": split_layers}
