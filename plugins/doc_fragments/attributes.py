# -*- coding: utf-8 -*-
# Copyright: llmfleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import absolute_import, division, print_function

__metaclass__ = type


class ModuleDocFragment(object):
    """The attributes the collection's modules share (community.general's convention)."""

    # Every module: no diff.
    DOCUMENTATION = r"""
attributes:
  diff_mode:
    support: none
    description: The module reports no differences.
"""

    # A module that reads and never writes.
    READ_ONLY = r"""
attributes:
  check_mode:
    support: full
    description: The module never changes anything; it runs the same way in check mode.
  diff_mode:
    support: none
    description: The module reports no differences.
"""
