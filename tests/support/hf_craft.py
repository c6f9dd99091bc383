"""Write Hugging Face model directories for tests: config.json and safetensors files made from the
format's definition (8-byte little-endian header length, JSON header, data), not by the reader."""

from __future__ import annotations

import json
import struct
from pathlib import Path

WIDTH = {"F32": 4, "BF16": 2, "F16": 2}


def write_safetensors(path: Path, tensors: dict[str, tuple[str, list[int]]], data: bool = True) -> None:
    header, offset = {}, 0
    for name, (dtype, shape) in tensors.items():
        n = WIDTH[dtype]
        for d in shape:
            n *= d
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + n]}
        offset += n
    header["__metadata__"] = {"format": "pt"}
    raw = json.dumps(header).encode()
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(raw)) + raw)
        fh.write(b"\0" * (offset if data else 0))


def llama(tmp: Path, n_layer=4, hidden=256, ff=512, vocab=512, dtype="F32", tied=False, shards=1) -> Path:
    tmp.mkdir(parents=True, exist_ok=True)
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": hidden,
        "intermediate_size": ff,
        "num_hidden_layers": n_layer,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": vocab,
        "max_position_embeddings": 1024,
        "tie_word_embeddings": tied,
    }
    (tmp / "config.json").write_text(json.dumps(config))
    kv = 2 * hidden // 4
    tensors: dict[str, tuple[str, list[int]]] = {"model.embed_tokens.weight": (dtype, [vocab, hidden])}
    for il in range(n_layer):
        p = f"model.layers.{il}."
        tensors[p + "self_attn.q_proj.weight"] = (dtype, [hidden, hidden])
        tensors[p + "self_attn.k_proj.weight"] = (dtype, [kv, hidden])
        tensors[p + "self_attn.v_proj.weight"] = (dtype, [kv, hidden])
        tensors[p + "self_attn.o_proj.weight"] = (dtype, [hidden, hidden])
        tensors[p + "mlp.gate_proj.weight"] = (dtype, [ff, hidden])
        tensors[p + "mlp.up_proj.weight"] = (dtype, [ff, hidden])
        tensors[p + "mlp.down_proj.weight"] = (dtype, [hidden, ff])
        tensors[p + "input_layernorm.weight"] = (dtype, [hidden])
        tensors[p + "post_attention_layernorm.weight"] = (dtype, [hidden])
    tensors["model.norm.weight"] = (dtype, [hidden])
    if not tied:
        tensors["lm_head.weight"] = (dtype, [vocab, hidden])
    names = list(tensors)
    if shards == 1:
        write_safetensors(tmp / "model.safetensors", tensors)
    else:
        weight_map = {}
        for s in range(shards):
            part = {n: tensors[n] for n in names[s::shards]}
            fname = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
            write_safetensors(tmp / fname, part)
            weight_map.update({n: fname for n in part})
        (tmp / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    return tmp
