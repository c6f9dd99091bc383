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


_COLLECTION_LOADER: list = []


def load_collection_plugins() -> None:
    """Let a bare ``Templar`` in this process find the collection's filters (a unit template calls
    ``llmfleet.cluster.systemd_quote``), as ansible-playbook does once at start.

    The collection finder must own the ``ansible_collections`` packages; tests imported them
    earlier through ``sys.path`` (conftest.py), so those package entries are dropped once and
    imported again through the finder. Modules already imported keep their identity."""
    if _COLLECTION_LOADER:
        return
    from ansible.plugins.loader import init_plugin_loader

    paths = os.environ.get("ANSIBLE_COLLECTIONS_PATH", str(ROOT / ".cache" / "collections"))
    init_plugin_loader([str(Path(p).resolve()) for p in paths.split(os.pathsep) if p])
    for name in [
        n for n, m in sys.modules.items() if n.startswith("ansible_collections") and hasattr(m, "__path__")
    ]:
        del sys.modules[name]
    _COLLECTION_LOADER.append(True)
