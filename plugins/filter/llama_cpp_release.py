# -*- coding: utf-8 -*-
# Copyright: llmfleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
name: llama_cpp_release
short_description: Choose the pinned llama.cpp asset (url + sha256) of a build for a host's flavour
version_added: "1.0.0"
description:
  - Looks up C(releases[build][flavour]) in a release table (build tag -> flavour -> C({url, sha256}))
    and returns it checked - the sha256 must be 64 hex digits and the url non-empty.
  - When the table has no entry, fails with an error that names the host, the build and the
    flavour and lists what the table does have.
  - The flavour C(source) means a pinned source tarball built on the host.
positional: build, flavour, host
options:
  _input:
    description: The release table.
    type: dict
    required: true
  build:
    description: The build tag, e.g. C(b6000).
    type: str
    required: true
  flavour:
    description: The asset flavour, e.g. C(ubuntu-x64), C(ubuntu-arm64), C(ubuntu-vulkan-x64) or C(source).
    type: str
    required: true
  host:
    description: The host name used in error messages.
    type: str
    default: this host
author:
  - llmfleet contributors (@llmfleet)
"""

EXAMPLES = r"""
- name: Pick the asset for this host
  ansible.builtin.set_fact:
    release: "{{ llama_cpp_releases | llmfleet.cluster.llama_cpp_release('b6000', 'ubuntu-x64', inventory_hostname) }}"
# release == {build: b6000, flavour: ubuntu-x64, url: https://.../llama-b6000-bin-ubuntu-x64.tar.gz,
#             sha256: <64 hex>, asset: llama-b6000-bin-ubuntu-x64.tar.gz, source: false}
"""

RETURN = r"""
_value:
  description: The entry with C(build), C(flavour), C(url), C(sha256) (normalised), C(asset) (the file name) and C(source).
  type: dict
"""

from ansible.errors import AnsibleFilterError
from ansible_collections.llmfleet.cluster.plugins.module_utils.artifacts import (
    ReleaseLookupError,
    select_release,
)


def llama_cpp_release(releases, build, flavour, host="this host"):
    try:
        return select_release(releases, build, flavour, str(host))
    except ReleaseLookupError as exc:
        raise AnsibleFilterError(str(exc)) from None


class FilterModule(object):
    def filters(self):
        return {"llama_cpp_release": llama_cpp_release}
