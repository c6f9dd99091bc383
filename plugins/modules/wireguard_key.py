#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: llmfleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: wireguard_key
short_description: Make the host's WireGuard key pair on the host and return only its public key
version_added: 1.0.0
description:
  - Keeps the private key in O(path) (mode 0600, owned by the user the module runs as) and returns
    the public key. The private key is made on the host with C(wg genkey), is never returned and is
    masked in any output of the module.
  - An existing key file is kept (a host that is re-added to the fleet keeps its key); O(rotate=true)
    replaces it with a new key.
  - In check mode nothing is written; a new or rotated key is reported as a change with a null
    public key.
author: llmfleet contributors (@llmfleet)
options:
  path:
    description: The private key file on the host.
    type: path
    default: /etc/wireguard/llmfleet.key
  rotate:
    description: Replace the key with a new one.
    type: bool
    default: false
attributes:
  check_mode:
    support: full
    description: In check mode the module makes no key and writes nothing; it reports whether it would.
extends_documentation_fragment:
  - llmfleet.cluster.attributes
  - llmfleet.cluster.wireguard
"""

EXAMPLES = r"""
- name: Make or keep the key pair
  llmfleet.cluster.wireguard_key:
  register: __wireguard_key

- name: Rotate it
  llmfleet.cluster.wireguard_key:
    rotate: true
"""

RETURN = r"""
public_key:
  description: The public key (null in check mode when the key would be made or rotated).
  returned: success
  type: str
  sample: xTIBA5rboUvnH4htodjb6e697QjLERt1NAB4mZqp8Dg=
path:
  description: The private key file.
  returned: success
  type: str
  sample: /etc/wireguard/llmfleet.key
created:
  description: True when a new key was (or in check mode would be) written.
  returned: success
  type: bool
"""

import os
import stat

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.llmfleet.cluster.plugins.module_utils.wireguard import (
    WireguardError,
    read_key_file,
    valid_key,
    write_key_file,
)


def _wg(module, args, data=None):
    rc, out, err = module.run_command([module.params["wg"], *args], data=data)
    if rc != 0:
        module.fail_json(
            msg="wireguard_key: %s %s failed (rc %d): %s"
            % (module.params["wg"], args[0], rc, (err or "")[:300])
        )
    return (out or "").strip()


def _public(module, private):
    public = _wg(module, ["pubkey"], data=private)
    if not valid_key(public):
        module.fail_json(msg="wireguard_key: wg pubkey returned something that is not a key")
    return public


def main():
    module = AnsibleModule(
        argument_spec=dict(
            path=dict(type="path", default="/etc/wireguard/llmfleet.key"),
            rotate=dict(type="bool", default=False),
            wg=dict(type="path", default="wg"),
        ),
        supports_check_mode=True,
    )
    path = module.params["path"]
    try:
        private = read_key_file(path)
    except WireguardError as exc:
        module.fail_json(msg="wireguard_key: %s" % exc)
    if private is not None:
        module.no_log_values.add(private)
    changed = created = False
    if private is None or module.params["rotate"]:
        if module.check_mode:
            module.exit_json(changed=True, created=True, path=path, public_key=None)
        private = _wg(module, ["genkey"])
        module.no_log_values.add(private)
        if not valid_key(private):
            module.fail_json(msg="wireguard_key: wg genkey returned something that is not a key")
        try:
            write_key_file(path, private)
        except (WireguardError, OSError) as exc:
            module.fail_json(msg="wireguard_key: %s" % exc)
        changed = created = True
    elif stat.S_IMODE(os.stat(path).st_mode) != 0o600:
        if not module.check_mode:
            os.chmod(path, 0o600)
        changed = True
    module.exit_json(changed=changed, created=created, path=path, public_key=_public(module, private))


if __name__ == "__main__":
    main()
