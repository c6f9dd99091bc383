#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: llmfleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: artifact_fetch
short_description: Download or adopt a file pinned by sha256, resumable, verified before it is moved into place
version_added: "1.0.0"
description:
  - Makes O(dest) a verified copy of O(url) (or of a file O(src) already on the host).
  - A download goes to C(<dest>.part) and continues an interrupted one with an HTTP
    C(Range) request. Before writing, the free disk space is checked against O(free_mib)
    (the probe's C(disk_free_mib)) and against the file system.
  - The file is renamed to O(dest) only when its sha256 equals O(sha256). A mismatch fails
    with the expected and the actual hash, removes the partial file and leaves O(dest)
    untouched. When the mismatch followed a resumed transfer, the file is fetched once more
    from the start before giving up.
  - The body is cut, whatever the server's headers say (none, or a false C(Content-Length)), at
    O(size) when given and at the free space (O(free_mib) and the file system's, the smaller) less
    O(reserve_mib); the partial file is then removed and the task fails naming the bound.
  - Idempotent; when O(dest) already matches nothing is downloaded.
options:
  url:
    description: http(s):// or file:// URL to download. Exactly one of O(url) and O(src).
    type: str
  src:
    description:
      - A file already on the host (for example copied there from the controller). It is
        consumed - moved to O(dest) when it matches, removed when it does not.
    type: path
  dest:
    description: Final path of the file. Its directory is created when missing.
    type: path
    required: true
  sha256:
    description: The pin, 64 hex digits (an optional C(sha256:) prefix is accepted).
    type: str
    required: true
  resume:
    description: Continue an existing C(<dest>.part) with a Range request.
    type: bool
    default: true
  free_mib:
    description: Free MiB the probe reported for the host; the download must fit with O(reserve_mib).
    type: float
  reserve_mib:
    description: MiB that must stay free after the download.
    type: float
    default: 0
  size:
    description:
      - The file's size in bytes as the lock recorded it. A server announcing another size is
        refused, and no more than this many bytes are ever written. Omitted, only the free space
        bounds the download.
    type: int
  mode:
    description: Permissions of O(dest).
    type: raw
    default: "0644"
  timeout:
    description: Socket timeout in seconds.
    type: int
    default: 30
  validate_certs:
    description: Verify TLS certificates.
    type: bool
    default: true
attributes:
  check_mode:
    support: full
    description: Reports whether O(dest) would change; downloads nothing.
notes:
  - The actual logic lives in C(plugins/module_utils/artifacts.py).
author:
  - llmfleet contributors (@llmfleet)
extends_documentation_fragment:
  - llmfleet.cluster.attributes
"""

EXAMPLES = r"""
- name: Fetch the model, resuming a partial download
  llmfleet.cluster.artifact_fetch:
    url: https://mirror.example/models/gemma-3-270m-Q4_K_M.gguf
    dest: /var/lib/llmfleet/models/gemma-3-270m-Q4_K_M.gguf
    sha256: a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818
    free_mib: "{{ llmfleet_host.disk_free_mib }}"
    reserve_mib: 256

- name: Verify a file copied from the controller and move it into place
  llmfleet.cluster.artifact_fetch:
    src: /var/lib/llmfleet/models/.incoming-model.gguf
    dest: /var/lib/llmfleet/models/model.gguf
    sha256: "{{ model_sha256 }}"
"""

RETURN = r"""
path:
  description: The verified file.
  returned: always
  type: str
  sample: /var/lib/llmfleet/models/gemma-3-270m-Q4_K_M.gguf
sha256:
  description: Its sha256 (the pin).
  returned: always
  type: str
resumed_from:
  description: Bytes already present in the .part file that the download continued from.
  returned: when a download happened
  type: int
  sample: 126556512
downloaded:
  description: Bytes transferred by this run.
  returned: when a download happened
  type: int
retried:
  description: 1 when a resumed download failed verification and was fetched again from the start.
  returned: when that happened
  type: int
"""

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.urls import open_url
from ansible_collections.llmfleet.cluster.plugins.module_utils.artifacts import (
    ArtifactError,
    ChecksumMismatch,
    adopt,
    fetch,
    make_opener,
)


def _mode(module, value):
    if isinstance(value, int):
        return value
    try:
        return int(str(value), 8)
    except ValueError:
        module.fail_json(msg=f"mode: expected an octal string like '0644', got {value!r}")
        raise


def main():
    module = AnsibleModule(
        argument_spec=dict(
            url=dict(type="str"),
            src=dict(type="path"),
            dest=dict(type="path", required=True),
            sha256=dict(type="str", required=True),
            resume=dict(type="bool", default=True),
            free_mib=dict(type="float"),
            reserve_mib=dict(type="float", default=0),
            size=dict(type="int"),
            mode=dict(type="raw", default="0644"),
            timeout=dict(type="int", default=30),
            validate_certs=dict(type="bool", default=True),
        ),
        mutually_exclusive=[("url", "src")],
        required_one_of=[("url", "src")],
        supports_check_mode=True,
    )
    p = module.params
    mode = _mode(module, p["mode"])
    try:
        if p["url"]:
            opener = make_opener(
                open_url, timeout=p["timeout"], validate_certs=p["validate_certs"], follow_redirects="safe"
            )
            result = fetch(
                opener,
                p["url"],
                p["dest"],
                p["sha256"],
                resume=p["resume"],
                free_mib=p["free_mib"],
                reserve_mib=p["reserve_mib"],
                mode=mode,
                check_mode=module.check_mode,
                size=p["size"],
            )
        else:
            result = adopt(p["src"], p["dest"], p["sha256"], mode=mode, check_mode=module.check_mode)
    except ChecksumMismatch as exc:
        module.fail_json(msg=str(exc), expected=exc.expected, actual=exc.actual, path=p["dest"])
    except (ArtifactError, OSError) as exc:
        module.fail_json(msg=f"{p['dest']}: {exc}", path=p["dest"])
    module.exit_json(**result)


if __name__ == "__main__":
    main()
