#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: llmfleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
module: hf_layout
short_description: Read the layout of a Hugging Face model directory (config.json and safetensors headers)
version_added: 1.1.0
description:
  - Reads what a vLLM user has, a Hugging Face checkpoint directory, and returns the layout the
    planner reads (the same shape as M(llmfleet.cluster.gguf_layout)), so the lws target plans the
    model vLLM serves.
  - Reads C(config.json) (at most 1 MiB), C(model.safetensors.index.json) when the checkpoint is
    sharded, and only the header of each C(*.safetensors) file (8 bytes of length, then at most
    64 MiB of JSON); tensor data is never read. Every tensor's dtype, shape and offsets are checked.
  - Tensors are grouped as vLLM's pipeline ranks load them, C(model.layers.N.*) to layer N,
    C(model.embed_tokens.*) to the first rank, C(model.norm.*) and C(lm_head.*) to the last (tied
    embeddings count again there).
  - Read-only; supports check mode. Run it on the controller (C(delegate_to=localhost)).
options:
  src:
    description: A local directory holding C(config.json) and C(*.safetensors).
    type: path
    required: true
author:
  - llmfleet contributors (@llmfleet)
extends_documentation_fragment:
  - llmfleet.cluster.attributes.read_only
"""

EXAMPLES = r"""
- name: Read the model layout on the controller
  llmfleet.cluster.hf_layout:
    src: /srv/models/tiny-llama-hf
  delegate_to: localhost
  run_once: true
  register: layout
"""

RETURN = r"""
layout:
  description: The layout (n_layer, n_embd, n_head_kv, head_dim_k, n_vocab, tied_output, layer_bytes,
    layer_largest_tensor, token_embd_bytes, output_bytes, output_norm_bytes, file_bytes, bytes_read,
    format C(safetensors), weights_dtype_bytes, ...).
  returned: success
  type: dict
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.llmfleet.cluster.plugins.module_utils.hf_layout import HfLayoutError, read_hf_layout


def main():
    module = AnsibleModule(
        argument_spec=dict(src=dict(type="path", required=True)),
        supports_check_mode=True,
    )
    src = module.params["src"]
    try:
        layout = read_hf_layout(src)
    except HfLayoutError as err:
        module.fail_json(msg="hf_layout: %s" % err, src=src)
    except OSError as err:
        module.fail_json(msg="hf_layout: %s: %s" % (src, err), src=src)
    module.exit_json(changed=False, layout=layout)


if __name__ == "__main__":
    main()
