# -*- coding: utf-8 -*-
# Copyright: llmfleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
name: llama_cpp_rpc_proto
short_description: The RPC protocol version of a llama.cpp source (a tree or a source tarball on the controller)
version_added: 1.1.0
description:
  - Reads C(ggml/include/ggml-rpc.h) of a llama.cpp source tree, a tag's source archive or the
    PyPI sdist that vendors the tree, and returns its C(RPC_PROTO_MAJOR_VERSION.MINOR.PATCH), for
    example V(7.0.0) - what a release table entry's C(rpc_proto) records (docs/artifacts.md).
  - Meant for builds made from a source you hold, such as the project's own
    (C(scripts/build-llama-cpp.sh) writes the source it built beside the tarballs as
    C(llama.cpp-<tag>-src.tar.gz)); a lock records it for upstream releases (docs/lock.md).
  - Fails naming the path when the source has no such header; returns V(null) when the header
    declares no version (builds from before the versioned HELLO).
options:
  _terms:
    description: Paths on the controller, each a source tree or a source tarball.
    type: list
    elements: path
    required: true
"""

EXAMPLES = r"""
- name: Record the protocol of the build made from this source
  ansible.builtin.set_fact:
    llama_cpp_releases:
      b0c1e570:
        ubuntu-arm64:
          url: http://mirror/llama-b0c1e570-bin-ubuntu-arm64.tar.gz
          sha256: "{{ lookup('ansible.builtin.file', dist ~ '/llama-b0c1e570-bin-ubuntu-arm64.tar.gz.sha256').split()[0] }}"
          rpc_proto: "{{ lookup('llmfleet.cluster.llama_cpp_rpc_proto', dist ~ '/llama.cpp-b0c1e570-src.tar.gz') }}"
"""

RETURN = r"""
_raw:
  description: One version per path (V(7.0.0)), or null when the header declares none.
  type: list
  elements: str
"""

from ansible.errors import AnsibleLookupError
from ansible.plugins.lookup import LookupBase
from ansible_collections.llmfleet.cluster.plugins.module_utils.artifacts import (
    ArtifactError,
    rpc_proto_from_source,
)


class LookupModule(LookupBase):
    def run(self, terms, variables=None, **kwargs):
        try:
            return [rpc_proto_from_source(str(term)) for term in terms or []]
        except ArtifactError as e:
            raise AnsibleLookupError("llmfleet.cluster.llama_cpp_rpc_proto: %s" % e) from None
