"""The HTML docs site `make docs` builds: a page per module, filter and role, and the docs/ pages.

The build is strict (scripts/build-docs.sh: antsibull-docs --fail-on-error, Sphinx -W): a plugin
or role whose documentation does not validate, or a broken link between the docs/ pages, fails it.
"""

from __future__ import annotations

import ast
import html
import os
import re
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
MODULES = sorted(p.stem for p in (ROOT / "plugins" / "modules").glob("*.py") if p.stem != "__init__")
# filters are grouped by stage in a few files; each has its sidecar docs plugins/filter/<name>.yml
FILTERS = sorted(p.stem for p in (ROOT / "plugins" / "filter").glob("*.yml"))
ROLES = sorted(p.parent.parent.name for p in ROOT.glob("roles/*/meta/argument_specs.yml"))
GUIDES = sorted(p.stem for p in (ROOT / "docs").glob("*.md"))


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("docsite") / "site"
    env = dict(os.environ, DOCS_STRICT=os.environ.get("DOCS_STRICT", "1"))
    proc = subprocess.run(
        ["bash", str(ROOT / "scripts" / "build-docs.sh"), "site", str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=1200,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-6000:]
    return out / "html"


def _text(page: Path) -> str:
    # Sphinx's smartquotes print ' and " as typographic quotes; compare against the source's.
    text = html.unescape(re.sub(r"<[^>]+>", " ", page.read_text()))
    return text.translate(str.maketrans({"\u2018": "'", "\u2019": "'", "\u201c": '"', "\u201d": '"'}))


def _documentation(path: Path) -> dict:
    """A plugin's DOCUMENTATION, read from its source (not by importing it) or its sidecar .yml."""
    if path.suffix == ".yml":
        return yaml.safe_load(path.read_text())["DOCUMENTATION"]
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == [
            "DOCUMENTATION"
        ]:
            return yaml.safe_load(ast.literal_eval(node.value))
    raise AssertionError(f"{path} has no DOCUMENTATION")


MALFORMED = "was malformed"  # antsibull-docs' page for documentation that does not validate


def test_the_collection_has_what_the_site_must_show() -> None:
    assert len(MODULES) >= 6 and len(FILTERS) >= 15 and len(ROLES) >= 13 and "index" in GUIDES


@pytest.mark.parametrize(
    ("name", "kind"), [(m, "module") for m in MODULES] + [(f, "filter") for f in FILTERS]
)
def test_a_page_per_plugin(site: Path, name: str, kind: str) -> None:
    page = site / f"{name}_{kind}.html"
    assert page.is_file(), sorted(p.name for p in site.glob("*.html"))
    text = _text(page)
    assert f"llmfleet.cluster.{name}" in text
    assert MALFORMED not in text, text[text.find(MALFORMED) : text.find(MALFORMED) + 1500]
    source = (
        ROOT / "plugins" / "modules" / f"{name}.py"
        if kind == "module"
        else ROOT / "plugins" / "filter" / f"{name}.yml"
    )
    for option in _documentation(source).get("options") or {}:
        if option == "_input":  # a filter's input: the page's "Input" section
            assert "Input" in text
            continue
        assert option in text, f"{name}: option {option} not on its page"
    index = (site / "index.html").read_text()
    assert f'href="{name}_{kind}.html' in index


@pytest.mark.parametrize("role", ROLES)
def test_a_page_per_role_with_its_options(site: Path, role: str) -> None:
    page = site / f"{role}_role.html"
    assert page.is_file()
    text = _text(page)
    assert f"llmfleet.cluster.{role}" in text
    assert MALFORMED not in text, text[text.find(MALFORMED) : text.find(MALFORMED) + 1500]
    specs = yaml.safe_load((ROOT / "roles" / role / "meta" / "argument_specs.yml").read_text())
    for entry_point, spec in specs["argument_specs"].items():
        assert entry_point in text
        for option in spec.get("options") or {}:
            assert option in text, f"{role}: {entry_point} option {option} not on its page"
    assert f'href="{role}_role.html' in (site / "index.html").read_text()


@pytest.mark.parametrize("guide", GUIDES)
def test_the_docs_pages_are_on_the_site(site: Path, guide: str) -> None:
    page = site / "guides" / f"{guide}.html"
    assert page.is_file()
    title = next(
        line[2:].strip()
        for line in (ROOT / "docs" / f"{guide}.md").read_text().splitlines()
        if line.startswith("# ")
    )
    assert html.unescape(re.sub(r"<[^>]+>", "", title)).replace("`", "") in _text(page)
    assert f'href="guides/{guide}.html' in (site / "index.html").read_text()
