#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: llmfleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: lock_resolve
short_description: Pin llama.cpp, k3s and the model from the sources' own digests
version_added: "1.0.0"
description:
  - Reads the llama.cpp release O(llama_cpp_build) from the GitHub release API and pins the assets
    the hosts need (O(llama_cpp_needs), host -> flavour) by the asset's C(digest). An asset without
    a digest, and the source tarball (flavour C(source)), are downloaded and hashed once
    (C(sha256_from=downloaded)); O(previous) carries those hashes to the next run.
  - Records the release's llama.cpp RPC protocol version in every entry (C(rpc_proto), for example
    C(7.0.0), and C(rpc_proto_from)), read from the tag's C(ggml/include/ggml-rpc.h) through the
    contents API (C(GET /repos/<repo>/contents/ggml/include/ggml-rpc.h?ref=<tag>)); every asset of a
    release is built from that commit. A tag without the file or without the version records none.
  - Reads k3s's C(sha256sum-<arch>.txt) for each architecture of O(k3s_needs) and checks it against
    GitHub's digest of the binary; a disagreement refuses both.
  - Resolves the Hugging Face revision of O(model) to its commit with one C(HEAD) of the resolve URL
    and pins the URL to that commit, sha256 and size from C(X-Linked-Etag) and C(X-Linked-Size).
  - Every answer is read under a size cap and a deadline; a refusal names the source, the URL and
    the value. Read-only (never reports a change); the play writes the lock file.
  - Tokens come from the controller's environment (C(GITHUB_TOKEN) or C(GH_TOKEN), C(HF_TOKEN)) when
    not given, and are sent over https to the API's own host and port only - never over plain http
    (not even to the same host name after a redirect); an http O(github_api) or O(hf_endpoint) gets
    no token (a warning says so).
  - O(deadline) bounds each whole answer, redirects included; a server that sends its answer a byte
    at a time is cut off when it passes.
options:
  github_api:
    description: The GitHub API base URL.
    type: str
    default: https://api.github.com
  github_token:
    description: A token for the GitHub API (raises the rate limit). Default from the environment.
    type: str
  llama_cpp_repo:
    description: The llama.cpp repository.
    type: str
    default: ggml-org/llama.cpp
  llama_cpp_build:
    description: The release tag to pin, e.g. C(b6000). Empty skips llama.cpp.
    type: str
    default: ""
  llama_cpp_needs:
    description: Host name -> the flavour it needs (C(ubuntu-x64), C(ubuntu-arm64), ..., C(source)).
    type: dict
    default: {}
  k3s_repo:
    description: The k3s repository.
    type: str
    default: k3s-io/k3s
  k3s_version:
    description: The k3s release to pin, e.g. C(v1.33.4+k3s1). Empty skips k3s.
    type: str
    default: ""
  k3s_needs:
    description: Host name -> its Kubernetes architecture (C(amd64), C(arm64), C(arm)).
    type: dict
    default: {}
  model:
    description: The fleet's C(llmfleet_model) (C(hf_repo), C(hf_file), C(hf_revision)); skipped when it
      has a C(url) or C(file) of its own.
    type: dict
    default: {}
  hf_endpoint:
    description: The Hugging Face endpoint.
    type: str
    default: https://huggingface.co
  hf_token:
    description: A Hugging Face token (gated models). Default from the environment.
    type: str
  previous:
    description: The lock of the last run (hashes made by downloading are not made again).
    type: dict
    default: {}
  timeout:
    description: Seconds to wait for a connection or a read.
    type: int
    default: 30
  deadline:
    description: Seconds for one whole answer (a tarball hashed included).
    type: int
    default: 600
  max_json_bytes:
    description: The largest API answer accepted.
    type: int
    default: 8388608
  max_download_bytes:
    description: The largest file hashed by downloading it.
    type: int
    default: 1073741824
author:
  - llmfleet contributors (@llmfleet)
"""

EXAMPLES = r"""
- name: Resolve the pins
  llmfleet.cluster.lock_resolve:
    llama_cpp_build: b6000
    llama_cpp_needs: {head: ubuntu-x64, pi: ubuntu-arm64}
    k3s_version: v1.33.4+k3s1
    k3s_needs: {head: amd64, pi: arm64}
    model: {hf_repo: ggml-org/gemma-3-270m-GGUF, hf_file: gemma-3-270m-Q8_0.gguf, hf_revision: main}
  register: lock
"""

RETURN = r"""
lock:
  description: The lock (C(schema), and C(llama_cpp), C(k3s), C(model) as asked), as docs/lock.md describes.
  returned: success
  type: dict
summary:
  description: One line per pin.
  returned: success
  type: list
  elements: str
"""

import os
from urllib.parse import urlsplit

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.llmfleet.cluster.plugins.module_utils.release_lock import (
    Http,
    LockError,
    build_lock,
    summary,
)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            github_api=dict(type="str", default="https://api.github.com"),
            github_token=dict(type="str", no_log=True),
            llama_cpp_repo=dict(type="str", default="ggml-org/llama.cpp"),
            llama_cpp_build=dict(type="str", default=""),
            llama_cpp_needs=dict(type="dict", default={}),
            k3s_repo=dict(type="str", default="k3s-io/k3s"),
            k3s_version=dict(type="str", default=""),
            k3s_needs=dict(type="dict", default={}),
            model=dict(type="dict", default={}),
            hf_endpoint=dict(type="str", default="https://huggingface.co"),
            hf_token=dict(type="str", no_log=True),
            previous=dict(type="dict", default={}),
            timeout=dict(type="int", default=30),
            deadline=dict(type="int", default=600),
            max_json_bytes=dict(type="int", default=8 << 20),
            max_download_bytes=dict(type="int", default=1 << 30),
        ),
        supports_check_mode=True,
    )
    p = module.params
    tokens = {}
    github_token = p["github_token"] or os.environ.get("GITHUB_TOKEN") or os.environ.get("GH_TOKEN")
    hf_token = p["hf_token"] or os.environ.get("HF_TOKEN")
    for name, token, where in (
        ("github_token", github_token, p["github_api"]),
        ("hf_token", hf_token, p["hf_endpoint"]),
    ):
        if not token:
            continue
        if urlsplit(where).scheme != "https":
            module.warn(f"{name} is not sent: {where} is not https (a token goes over https only)")
            continue
        tokens[where] = "Bearer " + token
    http = Http(timeout=p["timeout"], deadline=p["deadline"], tokens=tokens)
    try:
        lock = build_lock(
            http,
            p["github_api"],
            llama_cpp={
                "repo": p["llama_cpp_repo"],
                "build": p["llama_cpp_build"],
                "needs": p["llama_cpp_needs"],
            },
            k3s={"repo": p["k3s_repo"], "version": p["k3s_version"], "needs": p["k3s_needs"]},
            model=p["model"],
            hf_endpoint=p["hf_endpoint"],
            previous=p["previous"],
            max_json=p["max_json_bytes"],
            max_download=p["max_download_bytes"],
        )
    except LockError as exc:
        module.fail_json(msg=str(exc))
    module.exit_json(changed=False, lock=lock, summary=summary(lock))


if __name__ == "__main__":
    main()
