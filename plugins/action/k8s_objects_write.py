# -*- coding: utf-8 -*-
# Copyright: llmfleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The controller side of llmfleet.cluster.k8s_objects_write: the render, with no module run.

Documentation: plugins/modules/k8s_objects_write.py. The work is
``plugin_utils.k8s_objects.write_manifests``; this only reads the task's arguments, check and diff
mode, and turns its errors into a failed result once.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ansible import constants as C
from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase
from ansible.plugins.filter.core import to_nice_yaml
from ansible_collections.llmfleet.cluster.plugins.plugin_utils.k8s_objects import (
    ObjectsError,
    write_manifests,
)

ARGUMENT_SPEC = {
    "objects": {"type": "list", "elements": "dict", "required": True},
    "dir": {"type": "path", "required": True},
    "stale_pattern": {"type": "str", "default": ""},
    "keep": {"type": "list", "elements": "str", "default": []},
}


def _dump(obj):
    # What the role's templates wrote before: to_nice_yaml(indent=2, sort_keys=false, width=1000).
    return to_nice_yaml(obj, indent=2, sort_keys=False, width=1000)


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _VALID_ARGS = frozenset(ARGUMENT_SPEC)
    _requires_connection = False

    def run(self, tmp=None, task_vars=None):
        result = super(ActionModule, self).run(tmp, task_vars)
        del tmp  # no remote temporary directory: everything happens on the controller
        args = self.validate_argument_spec(argument_spec=ARGUMENT_SPEC)[1]
        try:
            written = write_manifests(
                args["objects"],
                args["dir"],
                _dump,
                stale_pattern=args["stale_pattern"],
                keep=args["keep"],
                check_mode=bool(self._task.check_mode),
                diff=bool(self._task.diff),
                diff_limit=C.MAX_FILE_SIZE_FOR_DIFF,
            )
        except ObjectsError as exc:
            raise AnsibleActionFail(str(exc)) from exc
        result.update(written)
        return result
