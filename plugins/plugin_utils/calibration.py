# -*- coding: utf-8 -*-
# Copyright: llmfleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The memory model's calibrated constants, one entry per llama.cpp build they were measured on
(pure, stdlib only).

The formulas (memory_model.py) follow llama.cpp's allocations; these constants are what a formula
cannot derive and was measured instead (bench/planner_accuracy.py, docs/planner-accuracy.md): the
processes at rest, the compute buffer's slack and how many copies of the graph inputs the
scheduler keeps when it pipelines. Another build may allocate differently: the planner looks up
the inventory's pinned build (``llama_cpp_build``) here, and when that build has no entry it plans
with the nearest calibrated one (the closest ``bNNNN`` number, else ``DEFAULT_BUILD``) and says so
in the plan's ``warnings``.

To calibrate a new build: run bench/planner_accuracy.py against it, adjust the figures until every
worker is within the goal, and add an entry (docs/planner-accuracy.md).
"""

from __future__ import absolute_import, annotations, division, print_function

import dataclasses
import functools
import re
from typing import Dict, Optional, Tuple

__metaclass__ = type


@dataclasses.dataclass(frozen=True)
class Calibration:
    build: str  # the llama.cpp build tag the figures were measured on
    measured: str  # where and when (the document that holds the measurements)
    worker_process_mib: float  # rpc-server at rest
    head_process_mib: float  # llama-server at rest
    compute_slack_mib: float  # added to every compute buffer that holds layers
    # llama.cpp's scheduler keeps this many copies of the graph inputs when it pipelines over
    # several devices (GGML_SCHED_MAX_COPIES), which it does with more than one RPC device, every
    # layer offloaded (-ngl > n_layer) and no tensor override.
    pp_copies: int

    def to_dict(self) -> Dict[str, object]:
        return dataclasses.asdict(self)


CALIBRATIONS: Dict[str, Calibration] = {
    # commit 0c1e570, built by scripts/build-llama-cpp.sh (the tag the inventories pin)
    "b0c1e570": Calibration(
        build="b0c1e570",
        measured="docs/planner-accuracy.md, 2026-11-30 (llama.cpp commit 0c1e570)",
        worker_process_mib=6.0,
        head_process_mib=30.0,
        compute_slack_mib=0.5,
        pp_copies=4,
    ),
}
DEFAULT_BUILD = "b0c1e570"

_NUMBERED = re.compile(r"^b(\d+)$")


@dataclasses.dataclass(frozen=True)
class Choice:
    """The calibration a plan uses for a pinned build, and the warning when it is not that build's."""

    pinned: str  # the inventory's llama_cpp_build ("" - none pinned)
    calibration: Calibration
    warning: Optional[str]

    def to_dict(self) -> Dict[str, object]:
        return {
            "build": self.pinned or None,
            "calibration": self.calibration.build,
            "calibrated": self.warning is None and bool(self.pinned),
            "constants": self.calibration.to_dict(),
        }


def _nearest(build: str) -> Tuple[Calibration, str]:
    match = _NUMBERED.match(build)
    numbered = [(int(m.group(1)), c) for c in CALIBRATIONS.values() for m in [_NUMBERED.match(c.build)] if m]
    if match and numbered:
        number = int(match.group(1))
        best = min(numbered, key=lambda nc: (abs(nc[0] - number), -nc[0]))[1]
        return best, "the nearest calibrated build"
    return CALIBRATIONS[DEFAULT_BUILD], "the default calibration"


@functools.lru_cache(maxsize=64)
def for_build(build: Optional[str]) -> Choice:
    """The calibration for ``build`` (the inventory's ``llama_cpp_build``; empty: not pinned)."""
    pinned = str(build or "").strip()
    if not pinned:
        return Choice("", CALIBRATIONS[DEFAULT_BUILD], None)
    if pinned in CALIBRATIONS:
        return Choice(pinned, CALIBRATIONS[pinned], None)
    chosen, why = _nearest(pinned)
    warning = (
        "llama.cpp build %s has no memory calibration (calibrated: %s): planned with %s's figures, %s;"
        " the predictions may be off for this build - measure it with bench/planner_accuracy.py and add"
        " it to plugins/plugin_utils/calibration.py"
        % (pinned, ", ".join(sorted(CALIBRATIONS)), chosen.build, why)
    )
    return Choice(pinned, chosen, warning)
