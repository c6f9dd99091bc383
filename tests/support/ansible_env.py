"""The environment a test gives to the ansible-playbook it runs: the checkout's settings, no colour."""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def ansible_env() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("ANSIBLE_CONFIG", str(ROOT / "ansible.cfg"))
    env.setdefault("ANSIBLE_COLLECTIONS_PATH", str(ROOT / ".cache" / "collections"))
    env.update({"ANSIBLE_NOCOLOR": "1", "ANSIBLE_FORCE_COLOR": "0", "PY_COLORS": "0"})
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return env
