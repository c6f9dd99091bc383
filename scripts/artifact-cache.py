#!/usr/bin/env python
"""The machine-wide cache of built test artifacts, keyed by what goes into them.

One cache per machine (``$LLMFLEET_CACHE``, default ``${XDG_CACHE_HOME:-~/.cache}/llmfleet``),
shared by every checkout on it: a fresh clone reuses what another one built. Each entry is a
directory ``ROOT/NAME/KEY`` where KEY is the sha256 of its inputs (the build script and any other
file named with ``--file``, by content; pins, flags, tool versions given with ``--text``), so a
changed input makes a new entry and leaves the others alone.

- ``ensure NAME [--file F]... [--text T]... [--link DEST=SUB]... -- COMMAND...``: use the entry
  of these inputs or build it. COMMAND runs with ``LLMFLEET_ENTRY`` (an empty temporary directory
  beside the entry, where it writes its outputs), ``LLMFLEET_ENTRY_FINAL`` (the path the entry
  will have: a venv rewrites its scripts' paths to it) and ``LLMFLEET_ENTRY_KEY``. When it exits 0
  a manifest of every file's size and sha256 (and every symlink's target) is written into the
  directory, which is then renamed to ``ROOT/NAME/KEY`` in one step: an entry is complete or
  absent, never half-written. A failed build leaves nothing. One build per entry at a time (a
  lock file per key): a second caller waits and then reuses it. Each ``--link DEST=SUB`` then
  points DEST (a checkout's ``.cache/llama.cpp``, say) at ``ENTRY/SUB``, replacing what was there.
- Verified on every use: every file present, none unexpected, each symlink's target as recorded,
  each file's size as recorded, and each file's sha256 unless nothing about the entry changed
  since its last full check (the files' sizes, mtimes, ctimes and inodes, recorded then; any write
  changes a ctime, which no tool can set back). ``LLMFLEET_CACHE_VERIFY=full`` hashes every file
  on every use. An entry that fails is removed and rebuilt, never used. ``__pycache__``
  directories are not part of an entry (Python writes them beside the sources it imports and
  checks them against those sources itself).
- ``key NAME ...`` prints the key; ``verify PATH [--full]`` checks one entry; ``root`` prints the
  cache's path; ``clean`` empties it (``make clean-cache``).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time

FORMAT = "1"
MANIFEST = ".llmfleet-manifest.json"
VERIFIED = ".llmfleet-verified"
SKIP_DIRS = {"__pycache__"}


def cache_root() -> str:
    root = os.environ.get("LLMFLEET_CACHE")
    if not root:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        root = os.path.join(base, "llmfleet")
    return os.path.abspath(root)


def log(message: str) -> None:
    print(f"artifact-cache: {message}", file=sys.stderr, flush=True)


def sha256_file(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(4 * 1024 * 1024), b""):
            digest.update(block)
    return digest.hexdigest()


def compute_key(name: str, files: list[str], texts: list[str]) -> str:
    """sha256 over the entry's name, the cache's format, each --file's content and each --text."""
    digest = hashlib.sha256(f"llmfleet-artifact-cache {FORMAT}\nname {name}\n".encode())
    for path in files:
        if not os.path.isfile(path):
            raise SystemExit(f"artifact-cache: {name}: input file {path} does not exist")
        digest.update(f"file {os.path.basename(path)} {sha256_file(path)}\n".encode())
    for text in texts:
        digest.update(f"text {len(text)} {text}\n".encode())
    return digest.hexdigest()


def scan(entry: str) -> tuple[dict[str, str], dict[str, str]]:
    """The entry's regular files (relative path -> full path) and symlinks (relative path -> target).

    Symlinks are never followed; ``__pycache__`` directories and the cache's own records at the top
    are left out.
    """
    files: dict[str, str] = {}
    links: dict[str, str] = {}
    for dirpath, dirnames, filenames in os.walk(entry):
        rel_dir = os.path.relpath(dirpath, entry)
        keep = []
        for d in dirnames:
            full = os.path.join(dirpath, d)
            rel = os.path.normpath(os.path.join(rel_dir, d))
            if os.path.islink(full):
                links[rel] = os.readlink(full)
            elif d not in SKIP_DIRS:
                keep.append(d)
        dirnames[:] = sorted(keep)
        for f in filenames:
            full = os.path.join(dirpath, f)
            rel = os.path.normpath(os.path.join(rel_dir, f))
            if rel in (MANIFEST, VERIFIED):
                continue
            if os.path.islink(full):
                links[rel] = os.readlink(full)
            else:
                files[rel] = full
    return files, links


def fingerprint(entry: str, files: dict[str, str], links: dict[str, str]) -> str:
    digest = hashlib.sha256()
    for rel in sorted(files):
        st = os.lstat(files[rel])
        digest.update(f"f {rel} {st.st_size} {st.st_mtime_ns} {st.st_ctime_ns} {st.st_ino}\n".encode())
    for rel in sorted(links):
        digest.update(f"l {rel} {links[rel]}\n".encode())
    digest.update(f"m {sha256_file(os.path.join(entry, MANIFEST))}\n".encode())
    return digest.hexdigest()


def write_atomic(path: str, text: str) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as handle:
        handle.write(text)
    os.replace(tmp, path)


def write_manifest(entry: str, name: str, key: str, inputs: list[str], seconds: float) -> None:
    files, links = scan(entry)
    manifest = {
        "format": FORMAT,
        "name": name,
        "key": key,
        "inputs": inputs,
        "built": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "build_seconds": round(seconds, 1),
        "files": {rel: [os.lstat(full).st_size, sha256_file(full)] for rel, full in sorted(files.items())},
        "links": dict(sorted(links.items())),
    }
    write_atomic(os.path.join(entry, MANIFEST), json.dumps(manifest, indent=1) + "\n")


def verify(entry: str, full: bool = False) -> str | None:
    """None when ENTRY is intact, else what is wrong with it (the first problem found)."""
    try:
        with open(os.path.join(entry, MANIFEST), encoding="utf-8") as handle:
            manifest = json.load(handle)
        want_files: dict[str, list] = manifest["files"]
        want_links: dict[str, str] = manifest["links"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return f"no readable manifest ({exc})"
    if manifest.get("key") != os.path.basename(entry):
        return f"its manifest names key {manifest.get('key')}, not {os.path.basename(entry)}"
    files, links = scan(entry)
    for rel in sorted(set(want_files) - set(files)):
        return f"{rel} is missing"
    for rel in sorted(set(files) - set(want_files)):
        return f"{rel} is not in its manifest"
    for rel in sorted(set(want_links) | set(links)):
        if want_links.get(rel) != links.get(rel):
            return f"symlink {rel} points to {links.get(rel)}, not {want_links.get(rel)}"
    for rel, (size, _sha) in want_files.items():
        got = os.lstat(files[rel]).st_size
        if got != size:
            return f"{rel} has {got} bytes, not {size}"
    stamp = fingerprint(entry, files, links)
    verified = os.path.join(entry, VERIFIED)
    if not full and os.path.exists(verified):
        with open(verified, encoding="utf-8") as handle:
            if handle.read().strip() == stamp:
                return None
    for rel, (_size, sha) in sorted(want_files.items()):
        got = sha256_file(files[rel])
        if got != sha:
            return f"{rel} has sha256 {got}, not {sha}"
    write_atomic(verified, stamp + "\n")
    return None


def remove_tree(path: str) -> None:
    """Remove PATH: renamed aside first, so a half-removed tree never sits under a real name."""
    if not os.path.lexists(path):
        return
    trash = f"{os.path.dirname(path)}/.trash-{os.path.basename(path)}-{os.getpid()}-{time.monotonic_ns()}"
    os.rename(path, trash)
    shutil.rmtree(trash, ignore_errors=True)


def point(dest: str, target: str) -> None:
    """Make DEST a symlink to TARGET, replacing a link, a file or a directory (the old layout)."""
    parent = os.path.dirname(os.path.abspath(dest))
    os.makedirs(parent, exist_ok=True)
    if os.path.islink(dest) and os.readlink(dest) == target:
        return
    tmp = f"{dest}.{os.getpid()}.link"
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)
    os.symlink(target, tmp)
    if os.path.isdir(dest) and not os.path.islink(dest):
        remove_tree(dest)
    os.replace(tmp, dest)


@contextlib.contextmanager
def locked(path: str):
    with open(path, "a", encoding="utf-8") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def ensure(name: str, files: list[str], texts: list[str], links: list[str], command: list[str]) -> str:
    if "/" in name or name.startswith("."):
        raise SystemExit(f"artifact-cache: entry name {name!r} must be a plain name")
    pairs = []
    for spec in links:
        dest, sep, sub = spec.partition("=")
        if not sep or not dest:
            raise SystemExit(f"artifact-cache: --link {spec!r} is not DEST=SUB")
        pairs.append((dest, sub or "."))
    key = compute_key(name, files, texts)
    base = os.path.join(cache_root(), name)
    os.makedirs(base, exist_ok=True)
    entry = os.path.join(base, key)
    full = os.environ.get("LLMFLEET_CACHE_VERIFY") == "full"
    with locked(os.path.join(base, f".{key}.lock")):
        if os.path.isdir(entry):
            problem = verify(entry, full=full)
            if problem is None:
                log(f"{name}: reused {entry}")
            else:
                log(f"{name}: {entry} is corrupt ({problem}): removed, rebuilding")
                remove_tree(entry)
        if not os.path.isdir(entry):
            if not command:
                raise SystemExit(f"artifact-cache: {name}: no entry {key} and no command to build it")
            for stale in os.listdir(base):
                if stale.startswith(f".tmp-{key}-"):
                    remove_tree(os.path.join(base, stale))
            tmp = os.path.join(base, f".tmp-{key}-{os.getpid()}")
            os.makedirs(tmp)
            env = dict(os.environ, LLMFLEET_ENTRY=tmp, LLMFLEET_ENTRY_FINAL=entry, LLMFLEET_ENTRY_KEY=key)
            log(f"{name}: building {entry}")
            started = time.monotonic()
            try:
                rc = subprocess.run(command, env=env, check=False).returncode
            except BaseException:
                remove_tree(tmp)
                raise
            if rc != 0:
                remove_tree(tmp)
                log(f"{name}: the build failed (exit {rc}); nothing was kept")
                raise SystemExit(rc)
            seconds = time.monotonic() - started
            inputs = [f"file {os.path.abspath(f)}" for f in files] + [f"text {t}" for t in texts]
            write_manifest(tmp, name, key, inputs, seconds)
            os.rename(tmp, entry)
            problem = verify(entry, full=True)  # records the fingerprint after the rename
            if problem is not None:
                remove_tree(entry)
                raise SystemExit(f"artifact-cache: {name}: the new entry failed its own check ({problem})")
            log(f"{name}: built {entry} in {seconds:.0f} s")
        for dest, sub in pairs:
            target = os.path.normpath(os.path.join(entry, sub))
            if not os.path.exists(target):
                raise SystemExit(f"artifact-cache: {name}: the entry has no {sub} for --link {dest}")
            point(dest, target)
    return entry


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    for cmd in ("key", "ensure"):
        p = sub.add_parser(cmd)
        p.add_argument("name")
        p.add_argument("--file", action="append", default=[], help="an input file (by content)")
        p.add_argument("--text", action="append", default=[], help="an input value (pins, flags, versions)")
        if cmd == "ensure":
            p.add_argument("--link", action="append", default=[], help="DEST=SUB: DEST -> ENTRY/SUB")
    p = sub.add_parser("verify")
    p.add_argument("path")
    p.add_argument("--full", action="store_true")
    sub.add_parser("root")
    sub.add_parser("clean")
    argv = list(sys.argv[1:] if argv is None else argv)
    command: list[str] = []
    if "--" in argv:  # ensure ... -- COMMAND...: the builder's own arguments are never parsed here
        command = argv[argv.index("--") + 1 :]
        argv = argv[: argv.index("--")]
    args = parser.parse_args(argv)

    if args.cmd == "key":
        print(compute_key(args.name, args.file, args.text))
    elif args.cmd == "ensure":
        print(ensure(args.name, args.file, args.text, args.link, command))
    elif args.cmd == "verify":
        problem = verify(os.path.abspath(args.path), full=args.full)
        if problem is not None:
            print(f"artifact-cache: {args.path}: {problem}", file=sys.stderr)
            return 1
        print(f"artifact-cache: {args.path}: intact")
    elif args.cmd == "root":
        print(cache_root())
    elif args.cmd == "clean":
        root = cache_root()
        if os.path.isdir(root):
            for child in os.listdir(root):
                path = os.path.join(root, child)
                if os.path.isdir(path) and not os.path.islink(path):
                    shutil.rmtree(path)
                else:
                    os.unlink(path)
        print(f"artifact-cache: emptied {root}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
