"""Where a role's own names are typed outside it: the lines of playbooks, roles and plugins
(comments aside) that match a pattern, except in the owning role (tests of the names each role
publishes, tests/unit/roles/test_llama_rpc_plan_writer.py and test_k3s_names.py)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def typed_outside(pattern: re.Pattern, owner: str) -> list[str]:
    """``path:line`` of each uncommented line matching ``pattern`` outside ``roles/<owner>/``."""
    paths = [
        *ROOT.glob("playbooks/**/*.yml"),
        *(p for p in ROOT.glob("roles/**/*") if p.suffix in (".yml", ".yaml", ".j2", ".py")),
        *ROOT.glob("plugins/**/*.py"),
    ]
    return [
        f"{rel}:{n}"
        for path in sorted(paths)
        if not (rel := path.relative_to(ROOT).as_posix()).startswith(f"roles/{owner}/")
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if pattern.search(line) and not line.lstrip().startswith("#")
    ]
