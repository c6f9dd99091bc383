"""The filter llmfleet.cluster.llama_cpp_release: the lookup errors reach Jinja as AnsibleFilterError."""

from __future__ import annotations

import pytest
from ansible.errors import AnsibleFilterError
from ansible_collections.llmfleet.cluster.plugins.filter.release import (
    FilterModule,
    llama_cpp_release,
)

TABLE = {"b6000": {"ubuntu-x64": {"url": "http://m/llama-b6000-bin-ubuntu-x64.tar.gz", "sha256": "0f" * 32}}}


def test_filter_is_registered_in_the_release_stage_file() -> None:
    assert FilterModule().filters()["llama_cpp_release"] is llama_cpp_release


def test_filter_returns_the_entry() -> None:
    assert (
        llama_cpp_release(TABLE, "b6000", "ubuntu-x64", "w1")["asset"] == "llama-b6000-bin-ubuntu-x64.tar.gz"
    )


def test_filter_error_names_the_host_and_flavour() -> None:
    with pytest.raises(
        AnsibleFilterError, match=r"^nas1: no llama.cpp b6000 asset for flavour 'ubuntu-arm64'"
    ):
        llama_cpp_release(TABLE, "b6000", "ubuntu-arm64", "nas1")
