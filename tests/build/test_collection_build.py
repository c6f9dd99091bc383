"""The built collection tarball installs into an empty collections path and works from there."""

from __future__ import annotations

import os
import subprocess
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _run(cmd: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=600, check=False)


def test_build_install_and_use(tmp_path: Path) -> None:
    env = dict(os.environ)
    env.pop("ANSIBLE_CONFIG", None)
    env["ANSIBLE_COLLECTIONS_PATH"] = str(tmp_path / "collections")
    built = _run(
        ["ansible-galaxy", "collection", "build", "--output-path", str(tmp_path), str(ROOT)], env, tmp_path
    )
    assert built.returncode == 0, built.stderr
    tarballs = list(tmp_path.glob("llmfleet-cluster-*.tar.gz"))
    assert len(tarballs) == 1, built.stdout
    tarball = tarballs[0]
    with tarfile.open(tarball) as tar:
        names = tar.getnames()
    assert "MANIFEST.json" in names
    assert not any(n.startswith((".venv", ".cache", ".git/", "build/")) for n in names), [
        n for n in names if n.startswith((".venv", ".cache", ".git/", "build/"))
    ]
    assert tarball.stat().st_size < 20 * 1024 * 1024, "the collection tarball is suspiciously large"

    installed = _run(
        [
            "ansible-galaxy",
            "collection",
            "install",
            "--no-deps",
            "-p",
            str(tmp_path / "collections"),
            str(tarball),
        ],
        env,
        tmp_path,
    )
    assert installed.returncode == 0, installed.stderr
    target = tmp_path / "collections" / "ansible_collections" / "llmfleet" / "cluster"
    assert (target / "MANIFEST.json").is_file()

    # Every module and filter in the checkout is listed from the installed copy.
    listed = _run(["ansible-doc", "-l", "llmfleet.cluster"], env, tmp_path)
    assert listed.returncode == 0, listed.stderr
    for module in sorted((ROOT / "plugins" / "modules").glob("*.py")):
        if module.stem != "__init__":
            assert f"llmfleet.cluster.{module.stem}" in listed.stdout, listed.stdout
    filters = _run(["ansible-doc", "-t", "filter", "-l", "llmfleet.cluster"], env, tmp_path)
    # filters are grouped by stage; each one has its sidecar docs plugins/filter/<name>.yml
    for flt in sorted((ROOT / "plugins" / "filter").glob("*.yml")):
        assert f"llmfleet.cluster.{flt.stem}" in filters.stdout, filters.stdout

    # A playbook of the installed collection runs from there, by its FQCN.
    playbooks = sorted(p.stem for p in (target / "playbooks").glob("*.yml"))
    assert playbooks, "the installed collection has no playbooks"
    inventory = tmp_path / "inventory.yml"
    inventory.write_text(
        "all:\n  children:\n    llm_head:\n      hosts:\n        localhost:\n"
        "          ansible_connection: local\n"
        "          ansible_python_interpreter: '{{ ansible_playbook_python }}'\n"
    )
    probe = _run(
        ["ansible-playbook", "-i", str(inventory), "llmfleet.cluster.probe"],
        env,
        tmp_path,
    )
    assert probe.returncode == 0, probe.stdout[-3000:] + probe.stderr[-2000:]
    # the fleet summary line of the probe role, printed from the installed copy
    assert "localhost" in probe.stdout and "usable" in probe.stdout, probe.stdout[-2000:]
