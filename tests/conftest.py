"""Shared pytest setup: make ``tests.support`` and ``ansible_collections.llmfleet.cluster`` importable."""

import os
import sys

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_COLLECTIONS = os.environ.get("ANSIBLE_COLLECTIONS_PATH", os.path.join(_ROOT, ".cache", "collections"))

for _path in (_ROOT, *_COLLECTIONS.split(os.pathsep)):
    if _path and os.path.isdir(_path) and _path not in sys.path:
        sys.path.insert(0, _path)


def pytest_collection_modifyitems(session, config, items):
    """Under pytest-xdist, the files with a ``slow`` test first, each file's tests in their order.

    ``--dist loadfile`` hands out whole files in collection order; a long file handed out last
    leaves the other worker idle at the end. Every worker collects the same order (a stable
    sort on the file's path), as xdist requires. One process (no xdist) keeps the usual order.
    """
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    slow_files = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in slow_files)
