"""For tests that render a role's defaults with a bare Templar (which loads no collection plugin):
``lookup('llmfleet.cluster.fleet', NAME)`` written as what it returns - the variable, else its one
default from plugins/plugin_utils/fleet_defaults.py (computed defaults are not emulated)."""

from __future__ import annotations

import re

from ansible_collections.llmfleet.cluster.plugins.plugin_utils.fleet_defaults import SETTINGS

_LOOKUP = re.compile(r"lookup\('llmfleet\.cluster\.fleet', '([a-z_]+)'\)")


def inline_fleet_lookups(text: str) -> str:
    """``text`` with every fleet lookup replaced by ``(NAME | default(<its default>))``."""

    def one(match: re.Match) -> str:
        name = match.group(1)
        return f"({name} | default({SETTINGS[name].default!r}))"

    return _LOOKUP.sub(one, text)
