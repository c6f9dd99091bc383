#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: llmfleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: wireguard_status
short_description: Read a WireGuard interface (peers, handshakes, addresses) without its keys
version_added: 1.0.0
description:
  - Runs C(wg show <interface> dump) and C(ip -j addr show dev <interface>) and returns the
    interface's public key, port, addresses and peers. The private key and any preshared key in
    the dump are dropped and masked; they are never returned.
  - Also reports whether the kernel has WireGuard (C(/sys/module/wireguard)), whether
    C(/dev/net/tun) exists (for C(wireguard-go)), which implementation runs the interface and the
    host's default IPv4 address (the endpoint its peers reach it by).
  - Read-only; runs the same in check mode.
author: llmfleet contributors (@llmfleet)
options:
  interface:
    description: The WireGuard interface.
    type: str
    default: llmfleet
extends_documentation_fragment:
  - llmfleet.cluster.attributes.read_only
  - llmfleet.cluster.wireguard
"""

EXAMPLES = r"""
- name: Read the tunnel
  llmfleet.cluster.wireguard_status:
  register: __wireguard_status
"""

RETURN = r"""
wireguard:
  description: The interface as seen on the host.
  returned: success
  type: dict
  contains:
    up:
      description: True when the interface exists and C(wg show) answers for it.
      type: bool
    implementation:
      description: C(kernel), C(userspace) (wireguard-go's socket in C(/var/run/wireguard)) or null when down.
      type: str
    kernel_module:
      description: True when the kernel has WireGuard loaded or built in.
      type: bool
    tun:
      description: True when C(/dev/net/tun) exists (wireguard-go can run).
      type: bool
    public_key:
      description: The interface's public key (null when down).
      type: str
    listen_port:
      description: The UDP port.
      type: int
    addresses:
      description: The interface's C(address/prefixlen) list.
      type: list
      elements: str
    default_ipv4:
      description: The address of the default route's interface (null without one).
      type: str
    peers:
      description: C({public_key, endpoint, allowed_ips, latest_handshake, rx_bytes, tx_bytes, persistent_keepalive}) per peer.
      type: list
      elements: dict
  sample:
    up: true
    implementation: userspace
    kernel_module: false
    tun: true
    public_key: xTIBA5rboUvnH4htodjb6e697QjLERt1NAB4mZqp8Dg=
    listen_port: 51820
    addresses: [10.213.0.7/24]
    default_ipv4: 10.89.0.3
    peers: []
"""

import json
import os

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.llmfleet.cluster.plugins.module_utils.wireguard import (
    MAX_DUMP_BYTES,
    WireguardError,
    addresses_from_ip_json,
    dump_secrets,
    parse_dump,
)


def _ip_json(module, args):
    rc, out, _err = module.run_command(["ip", "-j", *args])
    if rc != 0 or not out or len(out) > MAX_DUMP_BYTES:
        return []
    try:
        data = json.loads(out)
    except ValueError:
        return []
    return data if isinstance(data, list) else []


def _default_ipv4(module):
    routes = _ip_json(module, ["-4", "route", "show", "default"])
    dev = next((r.get("dev") for r in routes if isinstance(r, dict) and r.get("dev")), None)
    if not dev:
        return None
    addrs = addresses_from_ip_json(_ip_json(module, ["-4", "addr", "show", "dev", dev]))
    return addrs[0].split("/")[0] if addrs else None


def status(module, interface, root="/"):
    out = {
        "up": False,
        "implementation": None,
        "kernel_module": os.path.isdir(os.path.join(root, "sys/module/wireguard")),
        "tun": os.path.exists(os.path.join(root, "dev/net/tun")),
        "public_key": None,
        "listen_port": None,
        "addresses": [],
        "default_ipv4": _default_ipv4(module),
        "peers": [],
    }
    rc, dump, _err = module.run_command([module.params["wg"], "show", interface, "dump"])
    for secret in dump_secrets(dump):
        module.no_log_values.add(secret)
    if rc != 0:
        return out
    try:
        parsed = parse_dump(dump)
    except WireguardError as exc:
        module.fail_json(msg="wireguard_status: %s: %s" % (interface, exc))
    if parsed is None:
        return out
    out.update(parsed)
    out.pop("fwmark", None)
    out["up"] = True
    sock = os.path.join(root, "var/run/wireguard", interface + ".sock")
    out["implementation"] = "userspace" if os.path.exists(sock) else "kernel"
    out["addresses"] = addresses_from_ip_json(_ip_json(module, ["-4", "addr", "show", "dev", interface]))
    return out


def main():
    module = AnsibleModule(
        argument_spec=dict(
            interface=dict(type="str", default="llmfleet"),
            wg=dict(type="path", default="wg"),
        ),
        supports_check_mode=True,
    )
    module.exit_json(changed=False, wireguard=status(module, module.params["interface"]))


if __name__ == "__main__":
    main()
