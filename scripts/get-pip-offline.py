# Copyright: llmfleet developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Stand-in for the get-pip.py script that `ansible-test --venv` downloads before each new venv.

ansible-test fetches get-pip from ci-files.testing.ansible.com (not reachable here) unless
~/.ansible/test/cache/get_pip_<version>.py exists; scripts/sanity.sh installs this file there
(under its own HOME in .cache/). Like get-pip, it is run with pip's install options and the
packages to install (`pip==24.2`, ...) plus get-pip's own `--no-setuptools` / `--no-wheel`: it
bootstraps pip from the interpreter's bundled ensurepip wheel, then lets that pip install the
requested packages from PyPI, and removes the setuptools ensurepip brings when it was not wanted.

When the file llmfleet-bootstrap-python beside this script names a Python whose pip can act on
another interpreter (pip >= 22.3, `pip --python`; scripts/sanity.sh writes the checkout's .venv
there: ansible-test passes no environment variable of ours through), that pip installs the
requested packages straight into the new environment instead: no ensurepip, no setuptools to
install and remove again, the same pip version in the end (ansible-test builds one environment
per sanity test on a fresh clone). Any failure there falls back to ensurepip.
"""

from __future__ import annotations

import os
import subprocess
import sys

GET_PIP_ONLY = {"--no-setuptools", "--no-wheel"}


def outer_python() -> str:
    """The Python named in llmfleet-bootstrap-python beside this script, or ""."""
    sidecar = os.path.join(os.path.dirname(os.path.abspath(__file__)), "llmfleet-bootstrap-python")
    try:
        with open(sidecar, encoding="utf-8") as handle:
            path = handle.read(4096).strip()
    except OSError:
        return ""
    return path if os.access(path, os.X_OK) else ""


def bootstrap_with(outer: str, args: list[str]) -> bool:
    """Install ``args`` into this interpreter with another Python's pip; False when that cannot be done."""
    cmd = [outer, "-m", "pip", "--python", sys.executable, "install", "--disable-pip-version-check", *args]
    try:
        return subprocess.run(cmd, check=False).returncode == 0
    except OSError:
        return False


def main(argv: list[str]) -> int:
    args = [a for a in argv if a not in GET_PIP_ONLY]
    python = sys.executable
    if outer_python() and bootstrap_with(outer_python(), args):
        return 0
    subprocess.run([python, "-m", "ensurepip", "--default-pip"], check=True, stdout=subprocess.DEVNULL)
    rc = subprocess.run(
        [python, "-m", "pip", "install", "--disable-pip-version-check", *args], check=False
    ).returncode
    if rc == 0 and "--no-setuptools" in argv and not any(a.startswith("setuptools") for a in args):
        rc = subprocess.run(
            [python, "-m", "pip", "uninstall", "-q", "-y", "setuptools"], check=False
        ).returncode
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
