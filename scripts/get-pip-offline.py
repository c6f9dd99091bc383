# Copyright: llmfleet developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Stand-in for the get-pip.py script that `ansible-test --venv` downloads before each new venv.

ansible-test fetches get-pip from ci-files.testing.ansible.com (not reachable here) unless
~/.ansible/test/cache/get_pip_<version>.py exists; scripts/sanity.sh installs this file there
(under its own HOME in .cache/). Like get-pip, it is run with pip's install options and the
packages to install (`pip==24.2`, ...) plus get-pip's own `--no-setuptools` / `--no-wheel`: it
bootstraps pip from the interpreter's bundled ensurepip wheel, then lets that pip install the
requested packages from PyPI, and removes the setuptools ensurepip brings when it was not wanted.
"""

from __future__ import annotations

import subprocess
import sys

GET_PIP_ONLY = {"--no-setuptools", "--no-wheel"}


def main(argv: list[str]) -> int:
    args = [a for a in argv if a not in GET_PIP_ONLY]
    python = sys.executable
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
