#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: llmfleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: artifact_install
short_description: Install a pinned tar or zip archive, or a built tree, into a versioned directory, atomically
version_added: "1.0.0"
description:
  - Verifies O(archive) against O(sha256) B(before) unpacking it. A mismatch fails with the
    expected and the actual hash, removes the archive and changes nothing else.
  - Unpacks the archive (a tar, plain or compressed, or a zip, told apart by their content, not
    by the file name; it must hold exactly one top folder, like a llama.cpp release
    C(llama-<tag>/) or the C(build/bin/) of older release zips, and the deepest folder holding
    every member is stripped) or copies O(src_dir) into a hidden staging
    directory next to O(dest), checks the required executables, writes a marker file
    C(.llmfleet-artifact.json) (O(info) plus the sha256) and renames the staging directory to
    O(dest). Any failure removes the staging directory; what was at O(dest) stays untouched.
  - Archive members are all checked before anything is written - absolute paths, C(..),
    devices, duplicate names, members below a symlink, symlinks that leave the tree (also
    through another symlink), encrypted zip members and archives whose files add up to more
    than 16 GiB are refused. Executable bits come from the tar header or from the unix mode
    a zip carries; a zip without unix modes (made on Windows) has no executables.
  - Idempotent - when O(dest) carries a marker with the same sha256 nothing is read or
    written, and the archive or tree need not exist any more.
options:
  dest:
    description: The versioned directory to create, e.g. C(/opt/llmfleet/llama.cpp/b6000).
    type: path
    required: true
  sha256:
    description: The pin of the archive (or, with O(src_dir), of the source it was built from).
    type: str
    required: true
  archive:
    description:
      - A tar (.tar.gz, .tar.xz, .tar.bz2, .tar) or zip archive on the host. Exactly one of
        O(archive) and O(src_dir).
      - Any other file fails with a message naming it.
    type: path
  src_dir:
    description: A directory on the host whose content is copied (symlinks kept), e.g. a build's C(bin/).
    type: path
  info:
    description: Extra data recorded in the marker (build, flavour, url, ...).
    type: dict
    default: {}
  require_one_of:
    description: At least one of these executables must be in the tree; the first found is returned as RV(binary).
    type: list
    elements: str
    default: []
  require:
    description: All of these executables must be in the tree.
    type: list
    elements: str
    default: []
attributes:
  check_mode:
    support: full
    description: The module runs in check mode and reports what it would change.
notes:
  - The actual logic lives in C(plugins/module_utils/artifacts.py).
author:
  - llmfleet contributors (@llmfleet)
extends_documentation_fragment:
  - llmfleet.cluster.attributes
"""

EXAMPLES = r"""
- name: Unpack a llama.cpp release verified by sha256
  llmfleet.cluster.artifact_install:
    archive: /var/cache/llmfleet/llama.cpp/llama-b6000-bin-ubuntu-x64.tar.gz
    sha256: "{{ release.sha256 }}"
    dest: /opt/llmfleet/llama.cpp/b6000
    info: {build: b6000, flavour: ubuntu-x64}
    require_one_of: [ggml-rpc-server, rpc-server]
    require: [llama-server]

- name: Unpack an older release published as a zip (its binaries lie below build/bin/)
  llmfleet.cluster.artifact_install:
    archive: /var/cache/llmfleet/llama.cpp/llama-b4000-bin-ubuntu-x64.zip
    sha256: "{{ release.sha256 }}"
    dest: /opt/llmfleet/llama.cpp/b4000
    require_one_of: [ggml-rpc-server, rpc-server]
    require: [llama-server]
"""

RETURN = r"""
path:
  description: The installed directory.
  returned: always
  type: str
sha256:
  description: The pin recorded in the marker.
  returned: always
  type: str
binary:
  description: The first of O(require_one_of) present in the tree (e.g. C(ggml-rpc-server) or the older C(rpc-server)).
  returned: when not in check mode
  type: str
  sample: ggml-rpc-server
found:
  description: Which of O(require) are present.
  returned: when not in check mode
  type: list
  elements: str
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.llmfleet.cluster.plugins.module_utils.artifacts import (
    ArtifactError,
    ChecksumMismatch,
    install,
)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            dest=dict(type="path", required=True),
            sha256=dict(type="str", required=True),
            archive=dict(type="path"),
            src_dir=dict(type="path"),
            info=dict(type="dict", default={}),
            require_one_of=dict(type="list", elements="str", default=[]),
            require=dict(type="list", elements="str", default=[]),
        ),
        mutually_exclusive=[("archive", "src_dir")],
        required_one_of=[("archive", "src_dir")],
        supports_check_mode=True,
    )
    p = module.params
    try:
        result = install(
            p["dest"],
            p["sha256"],
            archive=p["archive"],
            src_dir=p["src_dir"],
            info=p["info"],
            require_one_of=p["require_one_of"],
            require=p["require"],
            check_mode=module.check_mode,
        )
    except ChecksumMismatch as exc:
        module.fail_json(
            msg=f"{exc}; {p['dest']} was not touched",
            expected=exc.expected,
            actual=exc.actual,
            path=p["dest"],
        )
    except (ArtifactError, OSError) as exc:
        module.fail_json(msg=f"{p['dest']}: {exc}", path=p["dest"])
    module.exit_json(**result)


if __name__ == "__main__":
    main()
