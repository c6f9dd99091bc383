# -*- coding: utf-8 -*-
# Copyright: llmfleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Values written into systemd unit files (pure, controller-only): the one quoting every unit
template of the collection uses (roles/*/templates/systemd/*.j2, through the filter
``llmfleet.cluster.systemd_quote``), and the check of inventory values for control characters
that the roles' preflights run (``llmfleet.cluster.systemd_unsafe``).

A unit file is line-based: a newline in a value ends the directive and starts another one, so
``Description=a\\nExecStartPre=+/bin/sh ...`` from an inventory value would run a command as
root. No quoting protects a newline (systemd reads the line before it unquotes), so a value with
a control character is refused, never escaped. Everything else is quoted by systemd's own rules
(systemd.service(5) "Command lines", systemd.syntax(7) "Quoting", systemd.unit(5) "Specifiers"):

- ``exec``: one word of ``ExecStart=``: specifiers (``%``) are doubled, variable expansion
  (``$``) is doubled, and a word with anything outside a plain safe set is double-quoted with
  ``\\`` and ``"`` backslash-escaped. The executable (``executable=True``) must be an absolute
  path: systemd reads its prefixes (``-@:+!``, ``+`` runs as root) before unquoting, so no
  quoting can defuse them.
- ``env``: one word of ``Environment=`` or of a path list (``ReadWritePaths=``): the same, but
  ``$`` is literal there and stays single.
- ``line``: the rest of a directive that systemd takes verbatim (``Description=``, ``User=``):
  specifiers doubled, nothing quoted.
"""

from __future__ import absolute_import, annotations, division, print_function

__metaclass__ = type

import re
from typing import Any, Dict, Iterable, List

MODES = ("exec", "env", "line")
# A word made only of these is written as it is (readable units; `--threads 3` stays so).
_SAFE = re.compile(r"[A-Za-z0-9_@+=:,./-]+\Z")
# C0 controls, DEL and the C1 controls: none of them belongs in a unit file.
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


class UnitValueError(ValueError):
    """A value that cannot be written into a unit file; the message names it."""


def control_character(value: str) -> str:
    """A description of the first control character in ``value`` ("" when there is none)."""
    found = _CONTROL.search(value)
    if not found:
        return ""
    return "control character U+%04X at position %d" % (ord(found.group()), found.start())


def quote(value: Any, mode: str = "exec", executable: bool = False, name: str = "value") -> str:
    """``value`` as one word (``exec``, ``env``) or the rest of a line (``line``) of a unit file.

    :class:`UnitValueError` naming ``name`` and the value for a control character, an unknown
    mode, or an executable that is not an absolute path."""
    if mode not in MODES:
        raise UnitValueError("%s: unknown quoting mode %r (one of %s)" % (name, mode, ", ".join(MODES)))
    if isinstance(value, bool) or value is None or isinstance(value, (dict, list, tuple)):
        raise UnitValueError("%s: %r is a %s, not a string or a number" % (name, value, type(value).__name__))
    text = str(value)
    bad = control_character(text)
    if bad:
        raise UnitValueError(
            "%s: %r has a %s; a unit file is line-based, so it is refused, not escaped" % (name, text, bad)
        )
    if executable and not text.startswith("/"):
        raise UnitValueError(
            "%s: the executable %r is not an absolute path (systemd reads the prefixes -@:+! of "
            "ExecStart before any quoting)" % (name, text)
        )
    text = text.replace("%", "%%")
    if mode == "line":
        return text
    if mode == "exec":
        text = text.replace("$", "$$")
    if text and _SAFE.match(text):
        return text
    return '"%s"' % text.replace("\\", "\\\\").replace('"', '\\"')


def quote_words(values: Any, mode: str = "exec", name: str = "value") -> str:
    """A list of words quoted one by one and joined by spaces (an empty list: "")."""
    if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
        return quote(values, mode, name=name)
    return " ".join(quote(v, mode, name="%s[%d]" % (name, i)) for i, v in enumerate(values))


def unsafe(values: Dict[str, Any]) -> List[str]:
    """One line per control character in the values of ``values`` (variable name -> value; lists
    and mappings are searched through), naming the variable and the value; [] when all are clean."""
    problems: List[str] = []

    def walk(path: str, value: Any) -> None:
        if isinstance(value, dict):
            for key, item in value.items():
                walk("%s.%s" % (path, key), item)
        elif isinstance(value, (list, tuple)):
            for i, item in enumerate(value):
                walk("%s[%d]" % (path, i), item)
        elif isinstance(value, str):
            bad = control_character(value)
            if bad:
                problems.append("%s=%r has a %s" % (path, value, bad))

    for key in sorted(values):
        walk(str(key), values[key])
    return problems
