#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: llmfleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# The documentation of the action plugin plugins/action/k8s_objects_write.py, which does the work
# on the controller (no module is sent anywhere).

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: k8s_objects_write
short_description: Write Kubernetes objects into a manifests directory on the controller
version_added: "1.0.0"
description:
  - The render of the role C(llmfleet.cluster.k8s_objects), as an action plugin. On the controller,
    with no module run per file, it makes the manifests directory O(dir) (mode C(0755)) and writes
    each entry of O(objects) to be rendered into its file, a Secret (C(secret)) with mode C(0600),
    the others C(0644). An entry's C(content) is written as given, an C(object) as C(---) and
    C(to_nice_yaml) with C(indent=2), C(sort_keys=false), C(width=1000).
  - A file is written only when its content or mode differs, through a temporary file in O(dir)
    and a rename, so a reader never sees half a file.
  - The files of O(dir) matching O(stale_pattern) that this call does not write and O(keep) does not
    name are removed (an architecture left the plan, the Ingress was turned off).
  - The result names files only; the diff of a Secret says its name, never its content. Give the
    task C(no_log) when O(objects) holds a Secret (its arguments hold the value).
  - Runs on the controller whatever the task is delegated to.
options:
  objects:
    description: The entries, as the filter P(llmfleet.cluster.k8s_objects#filter) returns them (C(file),
      C(secret), C(render), C(content) or C(object)); C(render=false) ones are skipped.
    type: list
    elements: dict
    required: true
  dir:
    description: The manifests directory on the controller; made when missing.
    type: path
    required: true
  stale_pattern:
    description: Shell pattern of the files this render owns (for example C(llama-rpc-*.yaml)). Empty
      removes nothing.
    type: str
    default: ""
  keep:
    description: File names this render writes through another call (its Secrets), never removed.
    type: list
    elements: str
    default: []
attributes:
  check_mode:
    support: full
    description: Writes and removes nothing and reports what it would change.
  diff_mode:
    support: full
    description: The unified diff of each file written (a Secret's name only), the directory made, the
      files removed.
  platform:
    support: full
    platforms: posix
    description: The controller's file system.
seealso:
  - module: ansible.builtin.copy
author:
  - llmfleet contributors (@llmfleet)
"""

EXAMPLES = r"""
- name: Write the objects, one per file (the Secrets in the next task)
  llmfleet.cluster.k8s_objects_write:
    objects: "{{ objects | rejectattr('secret') }}"
    dir: /srv/render/manifests
    stale_pattern: llama-rpc-*.yaml
    keep: "{{ objects | selectattr('secret') | map(attribute='file') }}"

- name: Write the Secrets, readable by the owner only
  llmfleet.cluster.k8s_objects_write:
    objects: "{{ objects | selectattr('secret') }}"
    dir: /srv/render/manifests
  no_log: true
"""

RETURN = r"""
dir:
  description: The manifests directory.
  returned: always
  type: str
written:
  description: The files created or changed (content or mode), or that would be in check mode.
  returned: always
  type: list
  elements: str
  sample: [llama-rpc-03-configmap.yaml]
unchanged:
  description: The files already as they would be written.
  returned: always
  type: list
  elements: str
removed:
  description: The stale files removed (or that would be in check mode).
  returned: always
  type: list
  elements: str
"""
