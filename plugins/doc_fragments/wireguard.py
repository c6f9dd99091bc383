# -*- coding: utf-8 -*-
# Copyright: llmfleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import absolute_import, division, print_function

__metaclass__ = type


class ModuleDocFragment(object):
    """The option and the documentation link of the WireGuard modules."""

    DOCUMENTATION = r"""
options:
  wg:
    description: The C(wg) binary (wireguard-tools).
    type: path
    default: wg
seealso:
  - name: WireGuard documentation
    description: docs/wireguard.md in the collection.
    link: https://example.invalid/llmfleet/cluster/docs/wireguard.md
"""
