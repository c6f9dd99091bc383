"""Shared pytest setup: make ``tests.support`` and ``ansible_collections.llmfleet.cluster`` importable."""

import os
import sys

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_COLLECTIONS = os.environ.get("ANSIBLE_COLLECTIONS_PATH", os.path.join(_ROOT, ".cache", "collections"))

for _path in (_ROOT, *_COLLECTIONS.split(os.pathsep)):
    if _path and os.path.isdir(_path) and _path not in sys.path:
        sys.path.insert(0, _path)
