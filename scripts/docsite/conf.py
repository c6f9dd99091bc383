# Copyright: llmfleet developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Sphinx configuration of the collection's HTML docs (scripts/build-docs.sh, docs/development.md).

antsibull-docs writes the plugin and role pages (reStructuredText) into the source tree; the
build script adds the Markdown pages of docs/ under guides/, which myst-parser reads (a link
from them to a file of the collection outside docs/, such as ``../roles/chat_ui/meta/...``, is
shown as that path: the site holds no copy of it; a link to a path that does not exist stays
a broken link, which fails the build). Offline:
no intersphinx inventory can be fetched, so the few labels of Ansible's own documentation that
antsibull-docs' pages refer to resolve to links into docs.ansible.com here (EXTERNAL_LABELS);
any other unresolved reference stays an error.
"""

from __future__ import annotations

import re
from pathlib import Path

from docutils import nodes

COLLECTION = Path(__file__).resolve().parents[2]

project = "llmfleet.cluster"
copyright = "llmfleet developers"
title = "llmfleet.cluster documentation"
html_short_title = title

extensions = ["sphinx_antsibull_ext", "myst_parser"]
source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
myst_heading_anchors = 3

pygments_style = "ansible"
highlight_language = "YAML+Jinja"
html_theme = "sphinx_ansible_theme"
html_show_sphinx = False
display_version = False
html_use_smartypants = True
html_use_modindex = False
html_use_index = False
html_copy_source = False
default_role = "any"
nitpicky = True

ANSIBLE_DOCS = "https://docs.ansible.com/projects/ansible/devel/"
EXTERNAL_LABELS = {
    "ansible_configuration_settings": ("reference_appendices/config.html", "Ansible Configuration Settings"),
    "common_return_values": ("reference_appendices/common_return_values.html", "Return Values"),
    # the note antsibull-docs puts on a module with an action plugin (k8s_objects_write), its seealso
    "action_plugins": ("plugins/action.html", "Action plugins"),
    "ansible_collections.ansible.builtin.copy_module": (
        "collections/ansible/builtin/copy_module.html",
        "ansible.builtin.copy",
    ),
}


def _external_label(app, env, node, contnode):
    if node.get("refdomain") != "std" or node.get("reftype") != "ref":
        return None
    target = EXTERNAL_LABELS.get(node.get("reftarget"))
    if target is None:
        return None
    path, text = target
    ref = nodes.reference("", "", internal=False, refuri=ANSIBLE_DOCS + path)
    ref += contnode if node.get("refexplicit") else nodes.inline(text, text)
    return ref


_COLLECTION_LINK = re.compile(r"\[([^\]]+)\]\(\.\./([^)#\s]+)\)")


def _collection_file_links(app, docname, source):
    if not docname.startswith("guides/"):
        return

    def plain(match):
        text, path = match.groups()
        if not (COLLECTION / path).exists():
            return match.group(0)
        return f"{text} (in the collection: `{path}`)"

    source[0] = _COLLECTION_LINK.sub(plain, source[0])


def setup(app):
    app.connect("missing-reference", _external_label)
    app.connect("source-read", _collection_file_links)
