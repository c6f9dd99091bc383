"""scripts/run-molecule.sh: lanes, RUN_ALONE, per-scenario output, summary and exit status.

The script runs against a stand-in `molecule` on PATH in a copy of the checkout's layout: each
stand-in run prints the action lines molecule prints, records when it starts and ends, and does
what its scenario's `behaviour` file says (wait until another scenario has started, sleep, fail).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import textwrap
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

FAKE_MOLECULE = textwrap.dedent(
    """\
    #!/usr/bin/env bash
    # molecule stand-in: `molecule test -s NAME`
    set -u
    s=$3
    events=$FAKE_EVENTS
    echo "start $s" >> "$events"
    echo "INFO     [$s > create] Executing"
    echo "output of $s line 1"
    wait_for="" sleep_s=0 rc=0
    [[ -f molecule/$s/behaviour ]] && source "molecule/$s/behaviour"
    if [[ -n $wait_for ]]; then
      for _ in $(seq 200); do grep -qx "start $wait_for" "$events" && break; sleep 0.05; done
      grep -qx "start $wait_for" "$events" || { echo "$s: $wait_for never started beside it"; rc=1; }
    fi
    sleep "$sleep_s"
    echo "INFO     [$s > converge] Executing"
    echo "output of $s line 2"
    echo "end $s" >> "$events"
    exit $rc
    """
)


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    (repo / "scripts").mkdir(parents=True)
    shutil.copy(ROOT / "scripts" / "run-molecule.sh", repo / "scripts" / "run-molecule.sh")
    bindir = tmp_path / "bin"
    bindir.mkdir()
    fake = bindir / "molecule"
    fake.write_text(FAKE_MOLECULE)
    fake.chmod(0o755)
    return repo


def scenario(
    repo: Path, name: str, behaviour: str = "", alone: bool = False, named_only: bool = False
) -> None:
    d = repo / "molecule" / name
    d.mkdir(parents=True)
    (d / "molecule.yml").write_text("---\n")
    if behaviour:
        (d / "behaviour").write_text(behaviour + "\n")
    if alone:
        (d / "RUN_ALONE").write_text("timing-sensitive\n")
    if named_only:
        (d / "NAMED_ONLY").write_text("too slow\n")


def run(repo: Path, lanes: str | None, *names: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLMFLEET_MOLECULE")}
    env["PATH"] = f"{repo.parent / 'bin'}{os.pathsep}{env['PATH']}"
    env["FAKE_EVENTS"] = str(repo / "events")
    env["LLMFLEET_MOLECULE_LOGS"] = str(repo / "logs")
    if lanes is not None:
        env["LLMFLEET_MOLECULE_LANES"] = lanes
    return subprocess.run(
        ["bash", str(repo / "scripts" / "run-molecule.sh"), *names],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )


def events(repo: Path) -> list[tuple[str, str]]:
    return [tuple(line.split()) for line in (repo / "events").read_text().splitlines()]


def intervals(repo: Path) -> dict[str, tuple[int, int]]:
    ev = events(repo)
    return {s: (ev.index(("start", s)), ev.index(("end", s))) for kind, s in ev if kind == "start"}


def summaries(stdout: str) -> list[str]:
    """The summary block: the run's last lines, one per scenario."""
    block: list[str] = []
    for line in reversed(stdout.splitlines()):
        if not re.match(r"molecule: \S+ +(passed|FAILED) ", line):
            break
        block.insert(0, line)
    return block


SUMMARY = re.compile(r"^molecule: (\S+) +(passed|FAILED) +\d+s  \(create \d+s converge \d+s\)$")


def test_two_lanes_run_two_scenarios_at_once_and_keep_each_output(checkout: Path) -> None:
    # a finishes only once b has started beside it: one lane at a time would fail a.
    scenario(checkout, "a", "wait_for=b")
    scenario(checkout, "b", "wait_for=a")
    scenario(checkout, "c")
    proc = run(checkout, "2")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    spans = intervals(checkout)
    assert spans["a"][0] < spans["b"][1] and spans["b"][0] < spans["a"][1], events(checkout)
    # One summary per scenario at the end, in the scenarios' order, in the usual format.
    tail = proc.stdout.splitlines()[-3:]
    assert [SUMMARY.match(line).groups() for line in tail] == [
        ("a", "passed"),
        ("b", "passed"),
        ("c", "passed"),
    ]
    # Each scenario's output printed whole, not interleaved with another's.
    for s in "abc":
        lines = proc.stdout.splitlines()
        first = lines.index(f"output of {s} line 1")
        assert lines[first + 1] == f"INFO     [{s} > converge] Executing"
        assert lines[first + 2] == f"output of {s} line 2"
        log = (checkout / "logs" / f"{s}.log").read_text().splitlines()
        assert log == [
            f"INFO     [{s} > create] Executing",
            f"output of {s} line 1",
            f"INFO     [{s} > converge] Executing",
            f"output of {s} line 2",
        ]


def test_a_run_alone_scenario_has_nothing_beside_it(checkout: Path) -> None:
    scenario(checkout, "a", "sleep_s=0.3")
    scenario(checkout, "b", "sleep_s=0.3")
    scenario(checkout, "tune", "sleep_s=0.5", alone=True)
    proc = run(checkout, "2")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    spans = intervals(checkout)
    start, end = spans["tune"]
    assert end == start + 1, f"something ran beside tune: {events(checkout)}"
    assert spans["a"][0] < spans["b"][1] and spans["b"][0] < spans["a"][1], events(checkout)
    assert [SUMMARY.match(line).group(1) for line in summaries(proc.stdout)] == ["a", "b", "tune"]
    assert "molecule: tune runs alone (molecule/tune/RUN_ALONE says why)" in proc.stdout


def test_a_failing_scenario_fails_the_run_and_the_others_still_run(checkout: Path) -> None:
    scenario(checkout, "a", "sleep_s=0.2")
    scenario(checkout, "b", "rc=3")
    scenario(checkout, "c")
    for lanes in ("2", None):
        (checkout / "events").unlink(missing_ok=True)
        proc = run(checkout, lanes)
        assert proc.returncode == 1, proc.stdout + proc.stderr
        tail = [SUMMARY.match(line).groups() for line in proc.stdout.splitlines()[-3:]]
        assert tail == [("a", "passed"), ("b", "FAILED"), ("c", "passed")], lanes
        assert {s for kind, s in events(checkout) if kind == "end"} == {"a", "b", "c"}


def test_one_lane_runs_in_turn_and_streams(checkout: Path) -> None:
    scenario(checkout, "a")
    scenario(checkout, "b")
    scenario(checkout, "tune", alone=True)
    proc = run(checkout, None)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert events(checkout) == [
        ("start", "a"),
        ("end", "a"),
        ("start", "b"),
        ("end", "b"),
        ("start", "tune"),
        ("end", "tune"),
    ]
    assert "started in lane" not in proc.stdout and "runs alone" not in proc.stdout
    assert (checkout / "logs" / "b.log").read_text().count("output of b") == 2


def test_named_only_and_named_scenarios(checkout: Path) -> None:
    scenario(checkout, "a")
    scenario(checkout, "slow", named_only=True)
    proc = run(checkout, "2")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "molecule: slow runs only when named" in proc.stdout
    assert [SUMMARY.match(line).group(1) for line in summaries(proc.stdout)] == ["a"]
    proc = run(checkout, "2", "slow")
    assert [SUMMARY.match(line).group(1) for line in summaries(proc.stdout)] == ["slow"]


@pytest.mark.parametrize("lanes", ["0", "two", "-1", ""])
def test_a_bad_lane_count_is_refused_before_any_scenario(checkout: Path, lanes: str) -> None:
    scenario(checkout, "a")
    proc = run(checkout, lanes)
    if lanes == "":
        # empty means unset: the default, one lane
        assert proc.returncode == 0, proc.stderr
        return
    assert proc.returncode == 2
    assert f"LLMFLEET_MOLECULE_LANES must be a whole number of at least 1, not '{lanes}'" in proc.stderr
    assert not (checkout / "events").exists()


def test_lanes_are_faster_than_one_lane_when_the_scenarios_wait(checkout: Path) -> None:
    for s in "abcd":
        scenario(checkout, s, "sleep_s=1")
    start = time.monotonic()
    assert run(checkout, "2").returncode == 0
    two = time.monotonic() - start
    start = time.monotonic()
    assert run(checkout, "1").returncode == 0
    one = time.monotonic() - start
    assert two < one - 1.0, (two, one)
