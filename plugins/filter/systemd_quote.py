# -*- coding: utf-8 -*-
# Copyright: llmfleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
name: systemd_quote
short_description: a value (or a list of them) quoted for a systemd unit file
version_added: 1.0.0
description:
  - The one quoting every unit template of the collection uses (roles/*/templates/systemd/*.j2),
    by systemd's own rules (systemd.service(5) "Command lines", systemd.syntax(7) "Quoting",
    systemd.unit(5) "Specifiers"); a value with a control character (a newline would start a new
    directive of the unit, C(ExecStartPre=+...) included) is refused with an error naming it.
  - A list gives its words quoted one by one, joined by spaces.
  - The companion filter C(systemd_unsafe) lists the control characters in inventory values for
    the roles' preflights.
  - The logic lives in C(plugins/plugin_utils/systemd_unit.py).
options:
  _input:
    description: The value (string or number) or a list of values.
    type: raw
    required: true
  mode:
    description:
      - C(exec) a word of C(ExecStart=) (C(%) and C($) doubled, quoted when not plain);
        C(env) a word of C(Environment=) or a path list (C($) literal);
        C(line) the rest of a verbatim directive such as C(Description=) (C(%) doubled only).
    type: str
    default: exec
    choices: [exec, env, line]
  executable:
    description: The word is the command of C(ExecStart=); it must be an absolute path.
    type: bool
    default: false
  name:
    description: The variable named in errors.
    type: str
    default: value
"""

EXAMPLES = r"""
# ExecStart={{ binary | llmfleet.cluster.systemd_quote(executable=true) }} --title {{ title | llmfleet.cluster.systemd_quote }}
# Environment={{ ('LLAMA_CACHE=' ~ cache) | llmfleet.cluster.systemd_quote('env') }}
# Description=llmfleet chat page ({{ title | llmfleet.cluster.systemd_quote('line') }})
"""

RETURN = r"""
_value:
  description: The quoted text.
  type: str
"""

from ansible.errors import AnsibleFilterError
from ansible_collections.llmfleet.cluster.plugins.plugin_utils.systemd_unit import (
    UnitValueError,
    quote,
    quote_words,
)


def systemd_quote(value, mode="exec", executable=False, name="value"):
    try:
        if isinstance(value, (list, tuple)):
            return quote_words(list(value), mode, name=name)
        return quote(value, mode, executable=bool(executable), name=name)
    except UnitValueError as err:
        raise AnsibleFilterError("systemd_quote: %s" % err) from err


class FilterModule(object):
    def filters(self):
        return {"systemd_quote": systemd_quote}
