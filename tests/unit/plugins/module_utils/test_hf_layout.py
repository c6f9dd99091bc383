"""plugins/module_utils/hf_layout.py: the layout of a Hugging Face directory, from config.json and
the safetensors headers only. The files are written here from the safetensors format (8-byte
little-endian header length, JSON header, data), not by the code under test."""

from __future__ import annotations

import struct

import pytest
from ansible_collections.llmfleet.cluster.plugins.module_utils.hf_layout import HfLayoutError, read_hf_layout
from ansible_collections.llmfleet.cluster.plugins.plugin_utils.placement import plan_llama_cpp

from tests.support.hf_craft import llama, write_safetensors


def expected_layer_bytes(hidden=256, ff=512, width=4) -> int:
    kv = 2 * hidden // 4
    return width * (2 * hidden * hidden + 2 * kv * hidden + 3 * ff * hidden + 2 * hidden)


def test_layer_sizes_from_the_headers(tmp_path):
    layout = read_hf_layout(str(llama(tmp_path / "m")))
    assert layout["n_layer"] == 4
    assert layout["layer_bytes"] == [expected_layer_bytes()] * 4
    assert layout["token_embd_bytes"] == 4 * 512 * 256
    assert layout["output_bytes"] == 4 * 512 * 256
    assert layout["output_norm_bytes"] == 4 * 256
    assert layout["n_head_kv"] == [2] * 4 and layout["head_dim_k"] == 64
    assert layout["weights_dtype_bytes"] == 4
    assert layout["tied_output"] is False
    # Only the headers were read, never the data.
    assert layout["bytes_read"] < 8192 < layout["file_bytes"]


def test_sharded_checkpoint_and_bf16(tmp_path):
    layout = read_hf_layout(str(llama(tmp_path / "m", dtype="BF16", shards=3)))
    assert layout["layer_bytes"] == [expected_layer_bytes(width=2)] * 4
    assert layout["weights_dtype_bytes"] == 2


def test_tied_embeddings_count_on_the_last_rank(tmp_path):
    layout = read_hf_layout(str(llama(tmp_path / "m", tied=True)))
    assert layout["tied_output"] is True
    assert layout["output_bytes"] == layout["token_embd_bytes"] == 4 * 512 * 256


def test_the_plan_carries_each_stages_weights(tmp_path):
    layout = read_hf_layout(str(llama(tmp_path / "m")))
    head = {"name": "big", "usable_mib": 12288, "cpus": 2}
    worker = {"name": "small", "usable_mib": 4096, "cpus": 2, "address": "10.0.0.2"}
    plan = plan_llama_cpp(layout, head, [worker], {"context": 512, "vllm_hosts": "all"}, fallbacks=False)
    vllm = plan["vllm"]
    assert vllm["pp_layer_partition"] == "3,1"
    mib = 1024 * 1024
    layer = expected_layer_bytes()
    assert vllm["stage_weights_mib"] == [
        pytest.approx((3 * layer + 4 * 512 * 256) / mib, abs=1e-3),
        pytest.approx((layer + 4 * 256 + 4 * 512 * 256) / mib, abs=1e-3),
    ]
    assert vllm["weights_dtype_bytes"] == 4


@pytest.mark.parametrize(
    "damage, needle",
    [
        (lambda d: (d / "config.json").write_text("{"), "config.json: not JSON"),
        (
            lambda d: (d / "config.json").write_text('{"num_hidden_layers": "4"}'),
            "num_hidden_layers must be an integer",
        ),
        (
            lambda d: (d / "model.safetensors").write_bytes(struct.pack("<Q", 1 << 40) + b"{}"),
            "header length",
        ),
        (lambda d: (d / "model.safetensors").write_bytes(b"abc"), "too short"),
        (
            lambda d: write_safetensors(
                d / "model.safetensors", {"model.embed_tokens.weight": ("F32", [4, 4])}
            ),
            "no tensors of layer",
        ),
        (
            lambda d: write_safetensors(
                d / "model.safetensors", {"model.embed_tokens.weight": ("F32", [512, 256])}, data=False
            ),
            "data_offsets",
        ),
        (lambda d: (d / "model.safetensors").unlink(), "no *.safetensors"),
    ],
)
def test_damaged_directories_are_refused_by_name(tmp_path, damage, needle):
    d = llama(tmp_path / "m")
    damage(d)
    with pytest.raises(HfLayoutError, match=None) as err:
        read_hf_layout(str(d))
    assert needle in str(err.value)
    assert str(d) in str(err.value)


def test_an_oversized_config_is_not_read_whole(tmp_path):
    d = llama(tmp_path / "m")
    (d / "config.json").write_text(" " * (2 * 1024 * 1024) + "{}")
    with pytest.raises(HfLayoutError, match="more than"):
        read_hf_layout(str(d))
