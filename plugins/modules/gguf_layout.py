#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: llmfleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
module: gguf_layout
short_description: Read the layout of a GGUF model (header and tensor table only)
version_added: 1.0.0
description:
  - Reads a GGUF model's hyperparameters and the bytes of its tensors per repeating layer, the
    token embeddings and the output layer (tied or not), from a local file or an http(s) URL.
  - With a URL only the header and the tensor table are fetched, with HTTP Range requests
    (a 20 GB model costs a few MB) through ansible's C(open_url). Every answer is checked; a
    server that ignores Range (HTTP 200 past the first window), a Content-Range that does not
    answer the request, an implausible Content-Length or file size are refused; the whole read
    has one deadline (O(deadline)) and reads at most 64 MiB of header.
  - Every count and hyperparameter is range- and type-checked; a failure names the key or tensor.
  - Read-only; supports check mode. Run it on the controller (C(delegate_to=localhost)).
options:
  src:
    description: A path to a C(.gguf) file or an http(s) URL of one.
    type: str
    required: true
  timeout:
    description: Seconds to wait for the server at any one moment (connect, or the next bytes).
    type: float
    default: 30
  deadline:
    description:
      - Seconds for the whole read of a URL, however the server answers (a server that drips
        bytes is cut off here). The module fails naming the URL when the header is not read by then.
    type: float
    default: 120
  tensors:
    description: Also return every tensor (name, type, dims, offset, bytes).
    type: bool
    default: false
author:
  - llmfleet contributors (@llmfleet)
extends_documentation_fragment:
  - llmfleet.cluster.attributes.read_only
"""

EXAMPLES = r"""
- name: Read the model layout on the controller
  llmfleet.cluster.gguf_layout:
    src: /srv/models/gemma-3-270m-Q4_K_M.gguf
  delegate_to: localhost
  run_once: true
  register: layout
"""

RETURN = r"""
layout:
  description: The layout (n_layer, n_embd, n_head, n_head_kv, head_dim_k, n_vocab, n_ctx_train,
    sliding_window, swa_layers, tied_output, layer_bytes, layer_largest_tensor, token_embd_bytes,
    output_bytes, output_norm_bytes, file_bytes, bytes_read, ...).
  returned: success
  type: dict
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.llmfleet.cluster.plugins.module_utils.gguf_layout import GgufError, read_layout


def main():
    module = AnsibleModule(
        argument_spec=dict(
            src=dict(type="str", required=True),
            timeout=dict(type="float", default=30.0),
            deadline=dict(type="float", default=120.0),
            tensors=dict(type="bool", default=False),
        ),
        supports_check_mode=True,
    )
    src = module.params["src"]
    try:
        layout = read_layout(src, timeout=module.params["timeout"], deadline=module.params["deadline"])
    except GgufError as err:
        module.fail_json(msg="gguf_layout: %s" % err, src=src)
    except (OSError, ValueError) as err:
        module.fail_json(msg="gguf_layout: %s: %s" % (src, err), src=src)
    module.exit_json(changed=False, layout=layout.to_dict(tensors=module.params["tensors"]))


if __name__ == "__main__":
    main()
