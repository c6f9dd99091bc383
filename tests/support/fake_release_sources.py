# -*- coding: utf-8 -*-
# Copyright: llmfleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A local stand-in for the release sources that playbooks/lock.yml reads, on loopback.

The shapes follow the public documentation (the real services are not reachable here):

- GitHub REST API, "Get a release by tag name" (``GET /repos/{owner}/{repo}/releases/tags/{tag}``,
  docs.github.com/rest/releases/releases): a release object with ``tag_name``, ``tarball_url``,
  ``zipball_url`` and ``assets[]``, each asset with ``url``, ``id``, ``name``, ``label``, ``state``
  (``uploaded``), ``content_type``, ``size``, ``download_count``, ``browser_download_url`` and, for
  assets uploaded since June 2025, ``digest`` (``sha256:<hex>``). A missing release answers 404 with
  ``{"message": "Not Found", "documentation_url": ..., "status": "404"}``; an exhausted rate limit
  answers 403 with ``X-RateLimit-Remaining: 0`` and ``X-RateLimit-Reset``.
- Release downloads (``/{owner}/{repo}/releases/download/{tag}/{name}``) answer with the bytes; the
  API's ``tarball_url`` (``/repos/{owner}/{repo}/tarball/{tag}``) answers 302 to codeload
  (``/codeload/{owner}/{repo}/legacy.tar.gz/refs/tags/{tag}``), which answers with the bytes.
- Hugging Face ``HEAD {endpoint}/{repo}/resolve/{revision}/{file}``: for an LFS file a 302 to the
  CDN with ``X-Repo-Commit`` (the commit the revision resolved to), ``X-Linked-Etag`` (the quoted
  sha256), ``X-Linked-Size`` and an ``ETag`` that is not the file's hash; a regular (non-LFS) file
  answers 200 with ``X-Repo-Commit`` and the git blob ETag. Unknown repos, revisions and files answer
  404 with ``X-Error-Code`` (``RepositoryNotFound``, ``RevisionNotFound``, ``EntryNotFound``). ``GET``
  follows to ``/cdn/...``, which honours ``Range``. ``GET /api/models/{repo}/revision/{revision}``
  answers ``{id, sha, siblings: [{rfilename}]}``.

Tests change the state (``Fake.releases``, ``Fake.tampered``, ``Fake.padding``) between runs.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Optional
from urllib.parse import quote, unquote, urlsplit


@dataclass
class Asset:
    name: str
    data: bytes
    digest: bool = True  # GitHub computed a digest (assets uploaded since 2025-06)


@dataclass
class HfFile:
    data: bytes
    lfs: bool = True


@dataclass
class Fake:
    # (repo, tag) -> assets; (repo, tag) -> source tarball bytes
    releases: dict[tuple[str, str], list[Asset]] = field(default_factory=dict)
    tarballs: dict[tuple[str, str], bytes] = field(default_factory=dict)
    # (repo, tag) -> {path in the tree: bytes}: what the contents API answers for the tag
    sources: dict[tuple[str, str], dict[str, bytes]] = field(default_factory=dict)
    # HF: repo -> {branch or commit -> commit}; (repo, commit, file) -> file
    hf_refs: dict[str, dict[str, str]] = field(default_factory=dict)
    hf_files: dict[tuple[str, str, str], HfFile] = field(default_factory=dict)
    # Names of release assets served with other bytes than the ones GitHub's digest was made of.
    tampered: set = field(default_factory=set)
    # Release tag -> extra bytes of release notes in the API's answer (an oversized answer).
    padding: dict[str, int] = field(default_factory=dict)
    rate_limited: bool = False
    requests: list[str] = field(default_factory=list)
    base: str = ""

    @property
    def github_api(self) -> str:
        return self.base + "/api"

    @property
    def hf_endpoint(self) -> str:
        return self.base + "/hf"

    def release_json(self, repo: str, tag: str) -> dict:
        assets = []
        for index, asset in enumerate(self.releases[(repo, tag)], start=1):
            entry = {
                "url": f"{self.github_api}/repos/{repo}/releases/assets/{index}",
                "id": index,
                "node_id": f"RA_{index}",
                "name": asset.name,
                "label": None,
                "uploader": {"login": "github-actions[bot]"},
                "content_type": "application/octet-stream",
                "state": "uploaded",
                "size": len(asset.data),
                "download_count": 7,
                "created_at": "2025-09-01T00:00:00Z",
                "updated_at": "2025-09-01T00:00:00Z",
                "browser_download_url": f"{self.base}/{repo}/releases/download/{quote(tag, safe='')}/{asset.name}",
            }
            entry["digest"] = "sha256:" + hashlib.sha256(asset.data).hexdigest() if asset.digest else None
            assets.append(entry)
        return {
            "url": f"{self.github_api}/repos/{repo}/releases/1",
            "html_url": f"{self.base}/{repo}/releases/tag/{tag}",
            "id": 1,
            "tag_name": tag,
            "target_commitish": "master",
            "name": tag,
            "draft": False,
            "prerelease": False,
            "created_at": "2025-09-01T00:00:00Z",
            "published_at": "2025-09-01T00:00:00Z",
            "assets": assets,
            "tarball_url": f"{self.github_api}/repos/{repo}/tarball/{quote(tag, safe='')}",
            "zipball_url": f"{self.github_api}/repos/{repo}/zipball/{quote(tag, safe='')}",
            "body": "x" * self.padding.get(tag, 0),
        }

    def asset_bytes(self, repo: str, tag: str, name: str) -> Optional[bytes]:
        for asset in self.releases.get((repo, tag), []):
            if asset.name == name:
                return asset.data + b"tampered" if name in self.tampered else asset.data
        return None


def _git_blob_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


class _Handler(BaseHTTPRequestHandler):
    fake: Fake
    protocol_version = "HTTP/1.1"

    def log_message(self, format, *args):
        pass

    def _send(self, status: int, body: bytes = b"", headers: Optional[dict[str, str]] = None, head=False):
        self.send_response(status)
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if not head:
            self.wfile.write(body)

    def _json(self, status: int, data, headers=None):
        self._send(
            status, json.dumps(data).encode(), dict({"Content-Type": "application/json"}, **(headers or {}))
        )

    def do_HEAD(self):
        self._route(head=True)

    def do_GET(self):
        self._route(head=False)

    def _route(self, head: bool) -> None:
        fake = self.fake
        path = urlsplit(self.path).path
        rng = self.headers.get("Range")
        fake.requests.append(("HEAD " if head else "GET ") + path + (f" Range: {rng}" if rng else ""))
        m = re.match(r"^/api/repos/([^/]+/[^/]+)/releases/tags/([^/]+)$", path)
        if m:
            repo, tag = m.group(1), unquote(m.group(2))
            if fake.rate_limited:
                return self._json(
                    403,
                    {
                        "message": "API rate limit exceeded for 127.0.0.1.",
                        "documentation_url": "https://docs.github.com",
                    },
                    {
                        "X-RateLimit-Limit": "60",
                        "X-RateLimit-Remaining": "0",
                        "X-RateLimit-Reset": "1764612000",
                    },
                )
            if (repo, tag) not in fake.releases:
                return self._json(
                    404,
                    {
                        "message": "Not Found",
                        "documentation_url": "https://docs.github.com/rest",
                        "status": "404",
                    },
                )
            return self._json(200, fake.release_json(repo, tag), {"X-RateLimit-Remaining": "59"})
        m = re.match(r"^/api/repos/([^/]+/[^/]+)/contents/(.+)$", path)
        if m:
            # docs.github.com "Get repository content": a file is {type: file, encoding: base64,
            # content: base64 in lines of 60 characters, ...}; ?ref= names the tag.
            ref = unquote((re.search(r"(?:^|&)ref=([^&]*)", urlsplit(self.path).query) or [None, ""])[1])
            name = unquote(m.group(2))
            data = fake.sources.get((m.group(1), ref), {}).get(name)
            if data is None:
                return self._json(404, {"message": "Not Found", "status": "404"})
            encoded = base64.b64encode(data).decode()
            return self._json(
                200,
                {
                    "type": "file",
                    "encoding": "base64",
                    "size": len(data),
                    "name": name.rsplit("/", 1)[-1],
                    "path": name,
                    "sha": _git_blob_sha1(data),
                    "content": "\n".join(encoded[i : i + 60] for i in range(0, len(encoded), 60)) + "\n",
                },
            )
        m = re.match(r"^/api/repos/([^/]+/[^/]+)/tarball/([^/]+)$", path)
        if m:
            repo, tag = m.group(1), unquote(m.group(2))
            return self._send(
                302, b"", {"Location": f"{fake.base}/codeload/{repo}/legacy.tar.gz/refs/tags/{tag}"}
            )
        m = re.match(r"^/codeload/([^/]+/[^/]+)/legacy\.tar\.gz/refs/tags/(.+)$", path)
        if m:
            data = fake.tarballs.get((m.group(1), unquote(m.group(2))))
            return (
                self._send(200, data, {"Content-Type": "application/x-gzip"}, head)
                if data
                else self._send(404)
            )
        m = re.match(r"^/([^/]+/[^/]+)/releases/download/([^/]+)/([^/]+)$", path)
        if m:
            data = fake.asset_bytes(m.group(1), unquote(m.group(2)), unquote(m.group(3)))
            if data is None:
                return self._send(404, b"Not Found")
            return self._send(200, data, {"Content-Type": "application/octet-stream"}, head)
        m = re.match(r"^/hf/api/models/([^/]+/[^/]+)/revision/([^/]+)$", path)
        if m:
            repo, revision = m.group(1), unquote(m.group(2))
            commit = fake.hf_refs.get(repo, {}).get(revision)
            if commit is None:
                code = "RepositoryNotFound" if repo not in fake.hf_refs else "RevisionNotFound"
                return self._json(404, {"error": code}, {"X-Error-Code": code})
            files = sorted(f for (r, c, f) in fake.hf_files if r == repo and c == commit)
            return self._json(200, {"id": repo, "sha": commit, "siblings": [{"rfilename": f} for f in files]})
        m = re.match(r"^/hf/([^/]+/[^/]+)/resolve/([^/]+)/(.+)$", path)
        if m:
            return self._resolve(m.group(1), unquote(m.group(2)), unquote(m.group(3)), head)
        m = re.match(r"^/cdn/([0-9a-f]{64})$", path)
        if m:
            for entry in fake.hf_files.values():
                if hashlib.sha256(entry.data).hexdigest() == m.group(1):
                    return self._ranged(entry.data, head)
            return self._send(404)
        self._send(404, b"Not Found")

    def _resolve(self, repo: str, revision: str, name: str, head: bool) -> None:
        fake = self.fake
        if repo not in fake.hf_refs:
            return self._send(404, b"", {"X-Error-Code": "RepositoryNotFound"}, head)
        commit = fake.hf_refs[repo].get(revision)
        if commit is None:
            return self._send(404, b"", {"X-Error-Code": "RevisionNotFound"}, head)
        entry = fake.hf_files.get((repo, commit, name))
        if entry is None:
            return self._send(404, b"", {"X-Error-Code": "EntryNotFound", "X-Repo-Commit": commit}, head)
        if not entry.lfs:
            headers = {"X-Repo-Commit": commit, "ETag": f'"{_git_blob_sha1(entry.data)}"'}
            return self._send(200, entry.data, headers, head)
        sha = hashlib.sha256(entry.data).hexdigest()
        headers = {
            "Location": f"{fake.base}/cdn/{sha}",
            "X-Repo-Commit": commit,
            "X-Linked-Etag": f'"{sha}"',
            "X-Linked-Size": str(len(entry.data)),
            "ETag": f'"{_git_blob_sha1(entry.data)}"',
        }
        return self._send(302, b"", headers, head)

    def _ranged(self, data: bytes, head: bool) -> None:
        spec = self.headers.get("Range", "")
        m = re.match(r"^bytes=(\d+)-(\d*)$", spec)
        if not m:
            return self._send(200, data, {"Accept-Ranges": "bytes"}, head)
        start = int(m.group(1))
        end = min(int(m.group(2)) if m.group(2) else len(data) - 1, len(data) - 1)
        part = data[start : end + 1]
        return self._send(206, part, {"Content-Range": f"bytes {start}-{end}/{len(data)}"}, head)


class FakeReleaseSources:
    """``with FakeReleaseSources(fake) as fake: ...`` serves ``fake`` on 127.0.0.1 in a thread."""

    def __init__(self, fake: Optional[Fake] = None) -> None:
        self.fake = fake or Fake()
        handler = type("Handler", (_Handler,), {"fake": self.fake})
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.server.daemon_threads = True
        self.fake.base = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> Fake:
        self.thread.start()
        return self.fake

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()
