# -*- coding: utf-8 -*-
# Copyright: llmfleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Host-side WireGuard helpers (stdlib only): key checks, the key file, ``wg show dump`` parsing.

The private key is made on the host by ``wg genkey`` and written to its own 0600 file; nothing
here returns it. ``parse_dump`` drops the interface's private key (the first field of the first
line of ``wg show IFACE dump``) and every peer's preshared key before anything leaves this file.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import base64
import os
import re

KEY_RE = re.compile(r"^[A-Za-z0-9+/]{42}[AEIMQUYcgkosw048]=$")
# The largest ``wg show dump`` read (a line per peer, about 200 bytes each).
MAX_DUMP_BYTES = 1024 * 1024


class WireguardError(Exception):
    """A WireGuard value or file that cannot be used."""


def valid_key(value):
    """True when ``value`` is a WireGuard key: 32 bytes in base64 (44 characters)."""
    if not isinstance(value, str) or not KEY_RE.match(value):
        return False
    try:
        return len(base64.b64decode(value, validate=True)) == 32
    except (ValueError, TypeError):
        return False


def read_key_file(path, max_bytes=256):
    """The key in ``path`` (stripped), or None when the file does not exist.

    Raises WireguardError (naming the path, never the content) when it is not a key.
    """
    try:
        with open(path, "rb") as handle:
            data = handle.read(max_bytes + 1)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise WireguardError("%s: cannot be read: %s" % (path, exc.strerror)) from None
    if len(data) > max_bytes:
        raise WireguardError("%s: longer than %d bytes, not a WireGuard key" % (path, max_bytes))
    text = data.decode("ascii", "replace").strip()
    if not valid_key(text):
        raise WireguardError("%s: does not hold a WireGuard key (44 base64 characters)" % path)
    return text


def write_key_file(path, key):
    """Write ``key`` to ``path`` with mode 0600, atomically (a 0600 temporary file renamed)."""
    if not valid_key(key):
        raise WireguardError("%s: refusing to write something that is not a WireGuard key" % path)
    directory = os.path.dirname(path) or "."
    os.makedirs(directory, mode=0o700, exist_ok=True)
    tmp = "%s.tmp-%d" % (path, os.getpid())
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, (key + "\n").encode("ascii"))
        os.fsync(fd)
    finally:
        os.close(fd)
    os.chmod(tmp, 0o600)
    os.rename(tmp, path)


def _int(value, what):
    try:
        return int(value)
    except (TypeError, ValueError):
        raise WireguardError("wg show dump: %s is not a number: %r" % (what, value[:40])) from None


def parse_dump(text, max_bytes=MAX_DUMP_BYTES):
    """``wg show IFACE dump`` as a dict without any secret.

    Returns {public_key, listen_port, fwmark, peers: [{public_key, endpoint, allowed_ips,
    latest_handshake, rx_bytes, tx_bytes, persistent_keepalive}]}; an empty text gives None.
    """
    if text is None:
        return None
    if len(text) > max_bytes:
        raise WireguardError("wg show dump: more than %d bytes" % max_bytes)
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        return None
    head = lines[0].split("\t")
    if len(head) != 4:
        raise WireguardError("wg show dump: the interface line has %d fields, not 4" % len(head))
    # head[0] is the private key: never kept.
    out = {
        "public_key": head[1] if valid_key(head[1]) else None,
        "listen_port": _int(head[2], "listen port"),
        "fwmark": head[3],
        "peers": [],
    }
    for number, line in enumerate(lines[1:], start=2):
        fields = line.split("\t")
        if len(fields) != 8:
            raise WireguardError("wg show dump: peer line %d has %d fields, not 8" % (number, len(fields)))
        # fields[1] is the preshared key: never kept.
        allowed = [] if fields[3] in ("(none)", "") else fields[3].split(",")
        out["peers"].append(
            {
                "public_key": fields[0],
                "endpoint": None if fields[2] == "(none)" else fields[2],
                "allowed_ips": allowed,
                "latest_handshake": _int(fields[4], "latest handshake"),
                "rx_bytes": _int(fields[5], "transfer rx"),
                "tx_bytes": _int(fields[6], "transfer tx"),
                "persistent_keepalive": 0 if fields[7] == "off" else _int(fields[7], "keepalive"),
            }
        )
    return out


def dump_secrets(text):
    """The secrets in a ``wg show dump`` text (private and preshared keys), to mask them in output."""
    secrets = []
    for number, line in enumerate((text or "").splitlines()):
        fields = line.split("\t")
        if number == 0 and fields and valid_key(fields[0]):
            secrets.append(fields[0])
        elif len(fields) > 1 and valid_key(fields[1]):
            secrets.append(fields[1])
    return secrets


def addresses_from_ip_json(data):
    """The ``address/prefixlen`` strings of ``ip -j addr show`` output (a parsed list)."""
    out = []
    for link in data or []:
        for info in link.get("addr_info", []) or []:
            if info.get("local") and info.get("prefixlen") is not None:
                out.append("%s/%s" % (info["local"], info["prefixlen"]))
    return out
