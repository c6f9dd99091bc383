"""Run a command in a process group of its own, killed whole on a timeout.

For the network-namespace scenarios (``unshare -rn ...``): a watcher or a supervisor left running
in the background must not outlive the test that started it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Sequence


def run_group(argv: Sequence[str], timeout: float, **kwargs) -> subprocess.CompletedProcess:
    proc = subprocess.Popen(
        list(argv),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        **kwargs,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        raise AssertionError(f"{list(argv)} ran past {timeout:g} s:\n{out}\n{err}") from None
    finally:
        # the command ended: whatever it left in its group ends too
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    return subprocess.CompletedProcess(list(argv), proc.returncode, out, err)
