#!/usr/bin/env python
# Copyright: llmfleet developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""How long `--dist loadfile` on N workers takes for given test durations, in both file orders.

    pytest -q -n 2 --dist loadfile --durations=0 tests/unit > run.log
    pytest -q -n 0 --collect-only tests/unit > order.txt
    pytest -q -n 0 --collect-only -m slow tests/unit > slow.txt
    python3 scripts/xdist-makespan.py run.log order.txt slow.txt [WORKERS]

Replays pytest-xdist's LoadScopeScheduling on the durations of one run: each worker gets a file,
and another whenever it has two tests or fewer pending. The files come in collection order with
the files that hold a `slow` test first (tests/conftest.py), then either re-sorted by test count
(xdist's default) or kept (--no-loadscope-reorder). Prints the span of each order and the heaviest
files. A machine's load changes every duration alike, so the two spans compare where two wall
times on a shared machine do not.
"""

from __future__ import annotations

import collections
import re
import sys

DURATION = re.compile(r"^\s*([\d.]+)s (?:setup|call|teardown)\s+(\S+)")


def read_durations(path: str) -> dict[str, float]:
    per_test: dict[str, float] = collections.defaultdict(float)
    with open(path, encoding="utf-8") as log:
        for line in log:
            match = DURATION.match(line)
            if match:
                per_test[match.group(2)] += float(match.group(1))
    return per_test


def read_ids(path: str) -> list[str]:
    with open(path, encoding="utf-8") as listing:
        return [line.strip() for line in listing if "::" in line]


def by_file(ids: list[str]) -> dict[str, list[str]]:
    files: dict[str, list[str]] = {}
    for test in ids:
        files.setdefault(test.split("::")[0], []).append(test)
    return files


def span(files: dict[str, list[str]], per_test: dict[str, float], workers: int) -> list[float]:
    """Seconds each worker runs, replaying LoadScopeScheduling (assign a file while pending <= 2)."""
    queue = list(files.values())
    pending: list[list[str]] = [[] for _node in range(workers)]
    clock = [0.0] * workers

    def assign(node: int) -> None:
        if queue:
            pending[node].extend(queue.pop(0))

    for node in range(workers):
        assign(node)
    for node in range(workers):
        if len(pending[node]) <= 2:
            assign(node)
    while any(pending):
        busy = [n for n in range(workers) if pending[n]]
        node = min(busy, key=lambda n: clock[n] + per_test.get(pending[n][0], 0.0))
        clock[node] += per_test.get(pending[node].pop(0), 0.0)
        if len(pending[node]) <= 2:
            assign(node)
    return clock


def main(argv: list[str]) -> int:
    if len(argv) not in (4, 5):
        print(__doc__, file=sys.stderr)
        return 2
    per_test = read_durations(argv[1])
    ids = read_ids(argv[2])
    slow = {test.split("::")[0] for test in read_ids(argv[3])}
    workers = int(argv[4]) if len(argv) == 5 else 2
    hooked = by_file(sorted(ids, key=lambda test: test.split("::")[0] not in slow))
    recount = dict(sorted(hooked.items(), key=lambda item: -len(item[1])))
    total = sum(per_test.values())
    print(
        f"{total:.0f} s of tests ({len(per_test)} with a duration), {total / workers:.0f} s ideal on {workers}"
    )
    for name, files in (
        ("xdist default (re-sorted by test count)", recount),
        ("--no-loadscope-reorder", hooked),
    ):
        clock = span(files, per_test, workers)
        print(f"{name:42} {max(clock):6.0f} s  (workers: {', '.join(f'{c:.0f}' for c in clock)})")
    heaviest = sorted(
        ((sum(per_test.get(t, 0.0) for t in ts), f, len(ts)) for f, ts in hooked.items()), reverse=True
    )
    for seconds, name, count in heaviest[:10]:
        print(f"  {seconds:7.1f} s {count:4d} tests  {name}{'  (slow)' if name in slow else ''}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
