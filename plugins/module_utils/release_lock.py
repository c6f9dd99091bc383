# -*- coding: utf-8 -*-
# Copyright: llmfleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Pins from the sources' own digests: the lock that ``playbooks/lock.yml`` writes.

Plain Python (stdlib only, no Ansible imports) so that the module ``lock_resolve`` and the filter
``lock_model`` stay thin and the behaviour is unit-tested against local servers:

- :func:`lock_llama_cpp` reads a llama.cpp release from the GitHub release API and keeps the assets
  the fleet's hosts need, each pinned by the asset's ``digest`` (``sha256:<hex>``, computed by
  GitHub at upload); an asset without one (older releases) and the source tarball are downloaded
  and hashed once, and the lock says so (``sha256_from: downloaded``);
- :func:`lock_k3s` reads k3s's ``sha256sum-<arch>.txt`` for each architecture the hosts need and
  checks it against GitHub's digest of the binary (a disagreement refuses both);
- :func:`lock_hf_model` resolves a Hugging Face revision to its commit with one ``HEAD`` of the
  resolve URL (``X-Repo-Commit``, ``X-Linked-Etag``, ``X-Linked-Size``) and pins the URL to it;
- :func:`model_from_lock` fills ``llmfleet_model``'s url and sha256 from the lock when the inventory
  pins none.

Every read from the network is bounded (a size cap and a deadline per answer, enforced by a
watchdog that cuts a server dripping bytes off) and every refusal names the source, the URL and
the value. A token goes over https to its own host and port only.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import base64
import binascii
import contextlib
import hashlib
import http.client
import json
import re
import socket
import threading
import time
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple
from urllib.error import HTTPError, URLError
from urllib.parse import quote, urljoin, urlsplit
from urllib.request import HTTPHandler, HTTPRedirectHandler, HTTPSHandler, Request, build_opener

from ansible_collections.llmfleet.cluster.plugins.module_utils.artifacts import (
    RPC_HEADER,
    ArtifactError,
    rpc_proto_from_header,
)

SCHEMA = 1
HEX64 = re.compile(r"^[0-9a-f]{64}$")
HEX40 = re.compile(r"^[0-9a-f]{40}$")
REPO = re.compile(r"^[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+$")
CHUNK = 1 << 16
MAX_REDIRECTS = 5

# k3s's release asset names per Kubernetes architecture (the binary and its checksum file).
K3S_BINARIES = {"amd64": "k3s", "arm64": "k3s-arm64", "arm": "k3s-armhf"}


class LockError(Exception):
    """A pin that cannot be made: the message names the source, the URL and the value."""


class _NoRedirect(HTTPRedirectHandler):
    """Redirects are followed by :class:`Http` itself, so a token never goes to another host."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        return None


class _Watchdog:
    """Shuts down every socket of one answer when its deadline passes, whatever the exchange is
    doing then (a TLS handshake, headers or a body sent one byte at a time each within the
    per-read timeout): the read in progress ends at once."""

    def __init__(self, seconds: float) -> None:
        self.expired = False
        self._sockets: List[socket.socket] = []
        self._lock = threading.Lock()
        self._timer = threading.Timer(max(0.0, seconds), self._expire)
        self._timer.daemon = True
        self._timer.start()

    def watch(self, sock: socket.socket) -> None:
        with self._lock:
            self._sockets.append(sock)
            if self.expired:
                self._shut(sock)

    def _expire(self) -> None:
        with self._lock:
            self.expired = True
            for sock in self._sockets:
                self._shut(sock)

    @staticmethod
    def _shut(sock: socket.socket) -> None:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)

    def cancel(self) -> None:
        self._timer.cancel()


def _watched(connection_class: Any) -> Any:
    """``connection_class`` whose socket is handed to the request's :class:`_Watchdog`."""

    class Watched(connection_class):  # type: ignore[misc, valid-type]
        def __init__(self, *args: Any, watchdog: Optional[_Watchdog] = None, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            create = self._create_connection

            def create_and_watch(*c_args: Any, **c_kwargs: Any) -> socket.socket:
                sock = create(*c_args, **c_kwargs)
                if watchdog is not None:
                    watchdog.watch(sock)
                return sock

            self._create_connection = create_and_watch

    return Watched


_WatchedHTTP = _watched(http.client.HTTPConnection)
_WatchedHTTPS = _watched(http.client.HTTPSConnection)


class _WatchedHTTPHandler(HTTPHandler):
    def http_open(self, req):
        return self.do_open(_WatchedHTTP, req, watchdog=getattr(req, "llmfleet_watchdog", None))


class _WatchedHTTPSHandler(HTTPSHandler):
    def https_open(self, req):
        kwargs: Dict[str, Any] = {"context": self._context}
        if getattr(self, "_check_hostname", None) is not None:  # Python < 3.12
            kwargs["check_hostname"] = self._check_hostname
        return self.do_open(_WatchedHTTPS, req, watchdog=getattr(req, "llmfleet_watchdog", None), **kwargs)


def _origin(url: str) -> Optional[Tuple[str, str, int]]:
    """(scheme, host, port) of a URL; a bare ``host[:port]`` is taken as https."""
    parts = urlsplit(url if "://" in url else "https://" + url)
    scheme = parts.scheme.lower()
    try:
        port = parts.port or {"https": 443, "http": 80}.get(scheme)
    except ValueError:
        return None
    if not parts.hostname or port is None:
        return None
    return scheme, parts.hostname.lower(), port


class Answer:
    def __init__(self, status: int, headers: Mapping[str, str], body: bytes, url: str) -> None:
        self.status = status
        self.headers = {k.lower(): v for k, v in headers.items()}
        self.body = body
        self.url = url


class Http:
    """Bounded HTTP: every answer within ``deadline`` seconds and ``cap`` bytes, redirects by hand.

    ``deadline`` bounds the whole answer, redirects included: a watchdog shuts the socket down
    when it passes, so a server that drips bytes (each within ``timeout``) is cut off in time.
    ``tokens`` maps an API's URL (or a bare ``host[:port]``, taken as https) to an
    ``Authorization`` value, sent over https to that host and port only: never over plain http,
    not even to the same host name after a redirect, and never when the API itself is http.
    """

    def __init__(
        self,
        timeout: float = 30.0,
        deadline: float = 120.0,
        tokens: Optional[Mapping[str, str]] = None,
        opener: Optional[Callable[..., Any]] = None,
    ) -> None:
        self.timeout = float(timeout)
        self.deadline = float(deadline)
        self.tokens: Dict[Tuple[str, str, int], str] = {}
        for where, value in (tokens or {}).items():
            origin = _origin(where)
            if origin is not None and origin[0] == "https" and value:
                self.tokens[origin] = value
        self._open = opener or build_opener(_NoRedirect, _WatchedHTTPHandler, _WatchedHTTPSHandler).open

    def _headers(self, url: str, extra: Optional[Mapping[str, str]]) -> Dict[str, str]:
        headers = {"User-Agent": "llmfleet-lock/1"}
        headers.update(extra or {})
        origin = _origin(url) if "://" in url else None
        token = self.tokens.get(origin) if origin is not None and origin[0] == "https" else None
        if token:
            headers["Authorization"] = token
        return headers

    def request(
        self,
        url: str,
        source: str,
        cap: int,
        method: str = "GET",
        headers: Optional[Mapping[str, str]] = None,
        follow: bool = True,
        sink: Optional[Callable[[bytes], None]] = None,
    ) -> Answer:
        """One answer (redirects followed when ``follow``); the body is kept unless ``sink`` takes it."""
        start = time.monotonic()
        watchdog = _Watchdog(self.deadline)
        try:
            return self._request(url, source, cap, method, headers, follow, sink, start, watchdog)
        except (OSError, http.client.HTTPException) as exc:
            if watchdog.expired or time.monotonic() - start >= self.deadline:
                raise LockError(f"{source} ({url}): no whole answer within {self.deadline:g} s") from None
            raise LockError(f"{source} ({url}): the answer broke off: {exc}") from None
        finally:
            watchdog.cancel()

    def _request(self, url, source, cap, method, headers, follow, sink, start, watchdog) -> Answer:
        current = url
        for _unused in range(MAX_REDIRECTS + 1):
            if urlsplit(current).scheme not in ("http", "https"):
                raise LockError(f"{source} ({url}): redirected to a non-HTTP URL {current!r}")
            req = Request(current, method=method, headers=self._headers(current, headers))
            req.llmfleet_watchdog = watchdog  # type: ignore[attr-defined]
            remaining = self.deadline - (time.monotonic() - start)
            if remaining <= 0:
                raise LockError(f"{source} ({url}): no answer within {self.deadline:g} s")
            try:
                resp = self._open(req, timeout=min(self.timeout, remaining))
            except HTTPError as exc:
                resp = exc
            except (URLError, OSError, ValueError, http.client.HTTPException) as exc:
                if watchdog.expired:
                    raise LockError(f"{source} ({url}): no whole answer within {self.deadline:g} s") from None
                reason = getattr(exc, "reason", exc)
                raise LockError(f"{source} ({current}): cannot connect: {reason}") from None
            try:
                status = int(resp.getcode() or 0)
                rheaders = dict(resp.headers.items()) if resp.headers is not None else {}
                lower = {k.lower(): v for k, v in rheaders.items()}
                if follow and status in (301, 302, 303, 307, 308) and lower.get("location"):
                    current = urljoin(current, lower["location"])
                    continue
                if method == "HEAD" or status >= 400:
                    body = _read(
                        resp, source, current, min(cap, 1 << 16), start, self.deadline, None, strict=False
                    )
                else:
                    body = _read(resp, source, current, cap, start, self.deadline, sink, strict=True)
                return Answer(status, rheaders, body, current)
            finally:
                with contextlib.suppress(Exception):
                    resp.close()
        raise LockError(f"{source} ({url}): more than {MAX_REDIRECTS} redirects")


def _read(resp, source, url, cap, start, deadline, sink, strict) -> bytes:
    length = resp.headers.get("Content-Length") if resp.headers is not None else None
    if strict and length is not None:
        try:
            declared = int(length)
        except ValueError:
            raise LockError(f"{source} ({url}): Content-Length {length!r} is not a number") from None
        if declared > cap:
            raise LockError(
                f"{source} ({url}): {declared} bytes (Content-Length), more than the {cap} allowed"
            )
    parts: List[bytes] = []
    total = 0
    while True:
        if time.monotonic() - start >= deadline:
            raise LockError(f"{source} ({url}): no whole answer within {deadline:g} s")
        chunk = resp.read(CHUNK)
        if not chunk:
            if time.monotonic() - start >= deadline:  # the watchdog ended it: not a whole answer
                raise LockError(f"{source} ({url}): no whole answer within {deadline:g} s")
            break
        total += len(chunk)
        if total > cap:
            if not strict:
                break
            raise LockError(f"{source} ({url}): more than the {cap} bytes allowed")
        if sink is not None:
            sink(chunk)
        else:
            parts.append(chunk)
    return b"".join(parts)


def _http_error(source: str, answer: Answer) -> LockError:
    h = answer.headers
    if answer.status in (403, 429) and (h.get("x-ratelimit-remaining") == "0" or answer.status == 429):
        reset = h.get("x-ratelimit-reset", "unknown")
        return LockError(
            f"{source} ({answer.url}): rate limited (HTTP {answer.status}, X-RateLimit-Reset {reset}); "
            f"set GITHUB_TOKEN for a higher limit or wait"
        )
    detail = ""
    try:
        message = json.loads(answer.body.decode("utf-8", "replace")).get("message")
        if isinstance(message, str):
            detail = f": {message[:200]}"
    except (ValueError, AttributeError):
        pass
    if h.get("x-error-code"):
        detail += f" (X-Error-Code {h['x-error-code'][:80]})"
    what = "not found" if answer.status == 404 else f"HTTP {answer.status}"
    return LockError(f"{source} ({answer.url}): {what}{detail}")


def hash_download(http: Http, url: str, source: str, cap: int, headers=None) -> Tuple[str, int]:
    """sha256 and size of what ``url`` answers, read in chunks under ``cap`` bytes."""
    digest = hashlib.sha256()
    size = [0]

    def sink(chunk: bytes) -> None:
        digest.update(chunk)
        size[0] += len(chunk)

    answer = http.request(url, source, cap, headers=headers, sink=sink)
    if answer.status != 200:
        raise _http_error(source, answer)
    return digest.hexdigest(), size[0]


def _check_repo(repo: Any, what: str) -> str:
    if not isinstance(repo, str) or not REPO.match(repo):
        raise LockError(f"{what}: {repo!r} is not an owner/name repository")
    return repo


def github_release(http: Http, api: str, repo: str, tag: str, max_json: int, what: str) -> Dict[str, Any]:
    """The release ``tag`` of ``repo`` as GitHub's API answers it (``GET /repos/R/releases/tags/T``)."""
    _check_repo(repo, what)
    if not isinstance(tag, str) or not tag or "/" in tag:
        raise LockError(f"{what}: {tag!r} is not a release tag")
    url = f"{api.rstrip('/')}/repos/{repo}/releases/tags/{quote(tag, safe='')}"
    source = f"GitHub API, release {tag} of {repo}"
    answer = http.request(
        url,
        source,
        max_json,
        headers={"Accept": "application/vnd.github+json", "X-GitHub-Api-Version": "2022-11-28"},
    )
    if answer.status != 200:
        raise _http_error(source, answer)
    try:
        release = json.loads(answer.body.decode("utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise LockError(f"{source} ({url}): the answer is not JSON ({exc})") from None
    if not isinstance(release, dict) or not isinstance(release.get("assets"), list):
        raise LockError(f"{source} ({url}): the answer has no assets list")
    if release.get("tag_name") not in (None, tag):
        raise LockError(f"{source} ({url}): the answer is release {release.get('tag_name')!r}, not {tag!r}")
    release["_url"] = url
    release["_source"] = source
    return release


def asset_digest(asset: Mapping[str, Any], source: str) -> Optional[str]:
    """The hex sha256 of GitHub's ``digest`` field, None when GitHub computed none."""
    value = asset.get("digest")
    if value is None or value == "":
        return None
    if not isinstance(value, str) or not value.startswith("sha256:") or not HEX64.match(value[7:].lower()):
        raise LockError(f"{source}: asset {asset.get('name')!r} has digest {value!r}, not sha256:<64 hex>")
    return value[7:].lower()


def _assets(release: Mapping[str, Any]) -> Dict[str, Mapping[str, Any]]:
    return {str(a.get("name")): a for a in release["assets"] if isinstance(a, Mapping)}


def _asset_url(asset: Mapping[str, Any], source: str) -> str:
    url = asset.get("browser_download_url")
    if not isinstance(url, str) or urlsplit(url).scheme not in ("http", "https"):
        raise LockError(
            f"{source}: asset {asset.get('name')!r} has no http(s) browser_download_url ({url!r})"
        )
    return url


def _by_value(needs: Mapping[str, Any]) -> Dict[str, List[str]]:
    groups: Dict[str, List[str]] = {}
    for host, value in sorted(needs.items()):
        if value:
            groups.setdefault(str(value), []).append(str(host))
    return groups


def _previous_download(previous: Optional[Mapping[str, Any]], url: str) -> Optional[Dict[str, Any]]:
    """A hash made by downloading ``url`` on an earlier run (hashed once, not every run)."""
    if (
        isinstance(previous, Mapping)
        and previous.get("url") == url
        and previous.get("sha256_from") == "downloaded"
    ):
        sha = str(previous.get("sha256", ""))
        if HEX64.match(sha) and isinstance(previous.get("size"), int):
            return {"sha256": sha, "size": previous["size"]}
    return None


def _downloaded(http, url, source, cap, previous) -> Dict[str, Any]:
    known = _previous_download(previous, url)
    if known:
        return dict(known, sha256_from="downloaded")
    sha, size = hash_download(http, url, source, cap)
    return {"sha256": sha, "size": size, "sha256_from": "downloaded"}


def llama_cpp_rpc_proto(http: Http, api: str, repo: str, tag: str, max_json: int) -> Optional[str]:
    """The RPC protocol version of release ``tag``'s source: its ``ggml/include/ggml-rpc.h``, read
    through GitHub's contents API (``GET /repos/R/contents/P?ref=T``: a JSON object whose
    ``content`` is the file in base64). Every asset of a release is built from that one commit, so
    it is every flavour's version. None when the tag has no such file (older trees) or the header
    declares no version (builds from before the versioned HELLO).
    """
    url = f"{api.rstrip('/')}/repos/{repo}/contents/{RPC_HEADER}?ref={quote(tag, safe='')}"
    source = f"GitHub API, {RPC_HEADER} of {repo} at {tag}"
    answer = http.request(
        url,
        source,
        max_json,
        headers={"Accept": "application/vnd.github+json", "X-GitHub-Api-Version": "2022-11-28"},
    )
    if answer.status == 404:
        return None
    if answer.status != 200:
        raise _http_error(source, answer)
    try:
        data = json.loads(answer.body.decode("utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise LockError(f"{source} ({url}): the answer is not JSON ({exc})") from None
    if not isinstance(data, dict) or data.get("type") != "file" or data.get("encoding") != "base64":
        shown = (
            {k: data.get(k) for k in ("type", "encoding")} if isinstance(data, dict) else type(data).__name__
        )
        raise LockError(f"{source} ({url}): not a file in base64 ({shown})")
    try:
        text = base64.b64decode("".join(str(data.get("content") or "").split()), validate=True)
        return rpc_proto_from_header(text.decode("utf-8", errors="replace"), f"{source} ({url})")
    except (binascii.Error, ValueError) as exc:
        raise LockError(f"{source} ({url}): the content is not base64 ({exc})") from None
    except ArtifactError as exc:
        raise LockError(str(exc)) from None


def lock_llama_cpp(
    http: Http,
    api: str,
    repo: str,
    build: str,
    needs: Mapping[str, str],
    previous: Optional[Mapping[str, Any]] = None,
    max_json: int = 8 << 20,
    max_download: int = 1 << 30,
) -> Dict[str, Any]:
    """``{repo, build, releases: {build: {flavour: {url, sha256, sha256_from, size, hosts}}}}``.

    ``needs`` maps each host to its flavour (``ubuntu-x64``, ``ubuntu-arm64``, ..., ``source``).
    """
    what = f"llama.cpp release {build} of {repo}"
    release = github_release(http, api, repo, build, max_json, what)
    source, url = release["_source"], release["_url"]
    assets = _assets(release)
    old = (((previous or {}).get("releases") or {}).get(build) or {}) if isinstance(previous, Mapping) else {}
    entries: Dict[str, Any] = {}
    for flavour, hosts in sorted(_by_value(needs).items()):
        if flavour == "source":
            tarball = release.get("tarball_url")
            if not isinstance(tarball, str) or urlsplit(tarball).scheme not in ("http", "https"):
                raise LockError(
                    f"{source} ({url}): no tarball_url for the source build {', '.join(hosts)} need"
                )
            entry = _downloaded(
                http, tarball, f"llama.cpp {build} source tarball", max_download, old.get("source")
            )
            entries["source"] = dict(entry, url=tarball, hosts=hosts)
            continue
        names = [f"llama-{build}-bin-{flavour}.tar.gz", f"llama-{build}-bin-{flavour}.zip"]
        asset = next((assets[n] for n in names if n in assets), None)
        if asset is None:
            have = ", ".join(sorted(assets)) or "none"
            raise LockError(
                f"{what} ({url}) has no asset {names[0]} (or .zip), which {', '.join(hosts)} ({flavour}) "
                f"need; its assets: {have}"
            )
        asset_url = _asset_url(asset, source)
        sha = asset_digest(asset, f"{source} ({url})")
        if sha:
            size = asset.get("size")
            entry = {
                "sha256": sha,
                "sha256_from": "github-digest",
                "size": size if isinstance(size, int) else None,
            }
        else:
            entry = _downloaded(
                http, asset_url, f"{what}, asset {asset['name']}", max_download, old.get(flavour)
            )
        entries[flavour] = dict(entry, url=asset_url, hosts=hosts)
    if entries:
        rpc_proto = llama_cpp_rpc_proto(http, api, repo, build, max_json)
        if rpc_proto:
            for entry in entries.values():
                entry.update(rpc_proto=rpc_proto, rpc_proto_from=f"{RPC_HEADER} at {build}")
    return {"repo": repo, "build": build, "releases": {build: entries}}


def parse_sha256sums(text: str) -> Dict[str, str]:
    """``<sha256>  <file>`` lines (``*file`` in binary mode) as ``{file: sha256}``."""
    sums: Dict[str, str] = {}
    for line in text.splitlines():
        parts = line.strip().split(None, 1)
        if len(parts) == 2 and HEX64.match(parts[0].lower()):
            sums[parts[1].strip().lstrip("*")] = parts[0].lower()
    return sums


def lock_k3s(
    http: Http,
    api: str,
    repo: str,
    version: str,
    needs: Mapping[str, str],
    max_json: int = 8 << 20,
) -> Dict[str, Any]:
    """``{repo, version, releases: {version: {arch: {url, sha256, sha256_from, size, hosts}}}}``."""
    what = f"k3s release {version} of {repo}"
    release = github_release(http, api, repo, version, max_json, what)
    source, url = release["_source"], release["_url"]
    assets = _assets(release)
    entries: Dict[str, Any] = {}
    for arch, hosts in sorted(_by_value(needs).items()):
        who = f"{', '.join(hosts)} ({arch})"
        binary_name = K3S_BINARIES.get(arch)
        if binary_name is None:
            raise LockError(f"{what}: no k3s build for architecture {arch!r}, which {', '.join(hosts)} have")
        sums_name = f"sha256sum-{arch}.txt"
        for name in (sums_name, binary_name):
            if name not in assets:
                raise LockError(f"{what} ({url}) has no {name}, which {who} need")
        sums_asset, binary = assets[sums_name], assets[binary_name]
        sums_url = _asset_url(sums_asset, source)
        answer = http.request(sums_url, f"k3s {version} {sums_name}", 1 << 20)
        if answer.status != 200:
            raise _http_error(f"k3s {version} {sums_name}", answer)
        sums_digest = asset_digest(sums_asset, f"{source} ({url})")
        if sums_digest and hashlib.sha256(answer.body).hexdigest() != sums_digest:
            raise LockError(
                f"k3s {version}: {sums_name} ({sums_url}) hashes to {hashlib.sha256(answer.body).hexdigest()}, "
                f"GitHub's digest of it says {sums_digest}; refusing it"
            )
        listed = parse_sha256sums(answer.body.decode("utf-8", "replace")).get(binary_name)
        if listed is None:
            raise LockError(f"k3s {version}: {sums_name} ({sums_url}) lists no sha256 for {binary_name}")
        github = asset_digest(binary, f"{source} ({url})")
        if github and github != listed:
            raise LockError(
                f"k3s {version}: {sums_name} ({sums_url}) says {binary_name} is {listed}, "
                f"GitHub's digest of {binary_name} says {github}; refusing both"
            )
        size = binary.get("size")
        entries[arch] = {
            "url": _asset_url(binary, source),
            "sha256": listed,
            "sha256_from": sums_name + (" + github-digest" if github else ""),
            "size": size if isinstance(size, int) else None,
            "hosts": hosts,
        }
    return {"repo": repo, "version": version, "releases": {version: entries}}


def _unquote_etag(value: Optional[str]) -> str:
    value = (value or "").strip()
    if value.startswith("W/"):
        value = value[2:]
    return value.strip('"').lower()


def lock_hf_model(
    http: Http,
    endpoint: str,
    model: Mapping[str, Any],
    previous: Optional[Mapping[str, Any]] = None,
    max_download: int = 64 << 30,
) -> Dict[str, Any]:
    """The model's file pinned to the commit its revision resolves to, with sha256 and size."""
    repo = _check_repo(model.get("hf_repo"), "llmfleet_model.hf_repo")
    hf_file = model.get("hf_file")
    if not isinstance(hf_file, str) or not hf_file or hf_file.startswith("/") or ".." in hf_file.split("/"):
        raise LockError(f"llmfleet_model.hf_file: {hf_file!r} is not a file path inside {repo}")
    revision = str(model.get("hf_revision") or "main")
    base = endpoint.rstrip("/")
    source = f"Hugging Face, {hf_file} of {repo} at {revision}"
    url = f"{base}/{repo}/resolve/{quote(revision, safe='')}/{quote(hf_file)}"
    current = url
    answer = None
    for _unused in range(MAX_REDIRECTS + 1):
        answer = http.request(current, source, 1 << 16, method="HEAD", follow=False)
        if answer.status >= 400:
            raise _http_error(source, answer)
        if answer.headers.get("x-repo-commit") or answer.status not in (301, 302, 303, 307, 308):
            break
        # A renamed repository answers with a relative redirect to its new name first.
        current = urljoin(current, answer.headers.get("location", ""))
    if answer is None:  # the loop runs at least once
        raise LockError(f"{source}: no answer")
    commit = (answer.headers.get("x-repo-commit") or "").strip().lower()
    if not HEX40.match(commit):
        raise LockError(f"{source} ({answer.url}): X-Repo-Commit {commit!r} is not a 40-hex commit")
    pinned = f"{base}/{repo}/resolve/{commit}/{quote(hf_file)}"
    linked = answer.headers.get("x-linked-etag")
    entry: Dict[str, Any]
    if linked is not None:
        sha = _unquote_etag(linked)
        if not HEX64.match(sha):
            raise LockError(f"{source} ({answer.url}): X-Linked-Etag {linked!r} is not a sha256")
        size_text = answer.headers.get("x-linked-size", "")
        try:
            size = int(size_text)
        except ValueError:
            raise LockError(f"{source} ({answer.url}): X-Linked-Size {size_text!r} is not a number") from None
        entry = {"sha256": sha, "size": size, "sha256_from": "x-linked-etag"}
    else:
        # Not an LFS file: the ETag is git's blob hash, so the file is hashed once.
        entry = _downloaded(http, pinned, source, max_download, previous)
    return dict(
        entry,
        hf_repo=repo,
        hf_file=hf_file,
        hf_revision=revision,
        commit=commit,
        endpoint=base,
        url=pinned,
    )


def model_from_lock(model: Any, lock: Any) -> Any:
    """``llmfleet_model`` with url and sha256 from the lock when the inventory pins neither.

    The lock's ``size`` comes along when the sha256 is the lock's (it is that file's size).
    """
    if not isinstance(model, Mapping):
        return model
    if model.get("url") or model.get("file") or not model.get("hf_repo"):
        return dict(model)
    pinned = lock.get("model") if isinstance(lock, Mapping) else None
    if not isinstance(pinned, Mapping):
        return dict(model)
    wanted = (model.get("hf_repo"), model.get("hf_file"), str(model.get("hf_revision") or "main"))
    have = (pinned.get("hf_repo"), pinned.get("hf_file"), str(pinned.get("hf_revision") or "main"))
    if wanted != have:
        raise LockError(
            f"llmfleet_lock.model pins {'/'.join(map(str, have))}, but llmfleet_model asks for "
            f"{'/'.join(map(str, wanted))}: run playbooks/lock.yml again"
        )
    merged = dict(model)
    merged["url"] = pinned.get("url")
    merged["sha256"] = model.get("sha256") or pinned.get("sha256")
    size = pinned.get("size")
    if (
        "size" not in model
        and isinstance(size, int)
        and not isinstance(size, bool)
        and str(merged["sha256"]).lower() == str(pinned.get("sha256")).lower()
    ):
        merged["size"] = size  # the download stops there (the size of the file the pin is of)
    return merged


def build_lock(
    http: Http,
    github_api: str,
    llama_cpp: Optional[Mapping[str, Any]] = None,
    k3s: Optional[Mapping[str, Any]] = None,
    model: Optional[Mapping[str, Any]] = None,
    hf_endpoint: str = "https://huggingface.co",
    previous: Optional[Mapping[str, Any]] = None,
    max_json: int = 8 << 20,
    max_download: int = 1 << 30,
) -> Dict[str, Any]:
    """The whole lock: ``{schema, llama_cpp?, k3s?, model?}`` (a part only when asked for)."""
    previous = previous if isinstance(previous, Mapping) else {}
    lock: Dict[str, Any] = {"schema": SCHEMA}
    if llama_cpp and llama_cpp.get("build") and any(llama_cpp.get("needs", {}).values()):
        old = (
            previous.get("llama_cpp")
            if previous.get("llama_cpp", {}).get("repo") == llama_cpp["repo"]
            else None
        )
        lock["llama_cpp"] = lock_llama_cpp(
            http,
            github_api,
            llama_cpp["repo"],
            llama_cpp["build"],
            llama_cpp["needs"],
            old,
            max_json,
            max_download,
        )
    if k3s and k3s.get("version") and any(k3s.get("needs", {}).values()):
        lock["k3s"] = lock_k3s(http, github_api, k3s["repo"], k3s["version"], k3s["needs"], max_json)
    if model and model.get("hf_repo") and not (model.get("url") or model.get("file")):
        old_model = previous.get("model")
        lock["model"] = lock_hf_model(http, hf_endpoint, model, old_model, max_download)
    return lock


def summary(lock: Mapping[str, Any]) -> List[str]:
    """One line per pin, for the play's output."""
    lines: List[str] = []
    for part, key in (("llama_cpp", "build"), ("k3s", "version")):
        section = lock.get(part) or {}
        for flavour, entry in sorted(((section.get("releases") or {}).get(section.get(key)) or {}).items()):
            rpc = f", RPC protocol {entry['rpc_proto']}" if entry.get("rpc_proto") else ""
            lines.append(
                f"{part} {section.get(key)} {flavour}: sha256 {entry['sha256'][:16]}... "
                f"({entry['sha256_from']}{rpc}) for {', '.join(entry.get('hosts') or [])}"
            )
    model = lock.get("model")
    if model:
        lines.append(
            f"model {model['hf_repo']}/{model['hf_file']} {model['hf_revision']} -> {model['commit'][:12]}: "
            f"sha256 {model['sha256'][:16]}... ({model['sha256_from']}), {model['size']} bytes"
        )
    return lines
