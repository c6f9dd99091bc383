"""Write tiny random-weight llama GGUF files that llama.cpp loads and runs (test-only).

The shapes are small on purpose: a model is written in well under a second and llama-server
answers (gibberish) in well under a second, yet the files carry everything the planner reads:
repeating layers, token embeddings, a tied or separate output tensor, grouped-query attention,
a context length and, optionally, a chat template and quantised (Q8_0) weights.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Optional

import gguf
import numpy as np

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


@dataclasses.dataclass(frozen=True)
class TinyLlama:
    """The shape of one generated model."""

    name: str
    n_layer: int = 8
    n_embd: int = 256
    n_head: int = 4
    n_head_kv: int = 2
    n_ff: int = 512
    n_vocab: int = 320
    n_ctx_train: int = 4096
    tied: bool = False
    weight_type: str = "F16"  # F32 | F16 | Q8_0 for the 2-D weight matrices
    chat_template: Optional[str] = CHATML_TEMPLATE
    seed: int = 1234

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    @property
    def filename(self) -> str:
        return f"{self.name}.gguf"


# The shapes scripts/make-test-models.py writes (names are part of the test contract).
SHAPES: tuple[TinyLlama, ...] = (
    TinyLlama("tiny-llama-8L"),
    TinyLlama(
        "tiny-llama-tied-6L",
        n_layer=6,
        n_embd=128,
        n_head=4,
        n_head_kv=4,
        n_ff=384,
        tied=True,
        weight_type="F32",
        n_ctx_train=2048,
    ),
    TinyLlama(
        "tiny-llama-13L",
        n_layer=13,
        n_embd=192,
        n_head=3,
        n_head_kv=1,
        n_ff=512,
        weight_type="Q8_0",
        chat_template=None,
    ),
    TinyLlama(
        "tiny-llama-bigvocab-4L",
        n_layer=4,
        n_embd=128,
        n_head=2,
        n_head_kv=1,
        n_ff=256,
        n_vocab=16384,
        weight_type="F16",
    ),
)


def _vocab(n_vocab: int) -> tuple[list[str], list[float], list[int]]:
    """A SentencePiece-style vocabulary: specials, the 256 byte-fallback tokens, then pieces."""
    specials = ["<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"]
    tokens = list(specials)
    types = [
        int(gguf.TokenType.UNKNOWN),
        int(gguf.TokenType.CONTROL),
        int(gguf.TokenType.CONTROL),
        int(gguf.TokenType.CONTROL),
        int(gguf.TokenType.CONTROL),
    ]
    for byte in range(256):
        tokens.append(f"<0x{byte:02X}>")
        types.append(int(gguf.TokenType.BYTE))
    alphabet = "abcdefghijklmnopqrstuvwxyz"
    pieces = ["\u2581" + c for c in alphabet] + list(alphabet) + ["\u2581the", "\u2581a", "\u2581is", "."]
    i = 0
    while len(tokens) < n_vocab:
        piece = pieces[i] if i < len(pieces) else f"\u2581w{i}"
        if piece not in tokens:
            tokens.append(piece)
            types.append(int(gguf.TokenType.NORMAL))
        i += 1
    tokens, types = tokens[:n_vocab], types[:n_vocab]
    scores = [0.0 if t != int(gguf.TokenType.NORMAL) else -float(k) for k, t in enumerate(types)]
    return tokens, scores, types


def _matrix(rng: np.random.Generator, rows: int, cols: int, weight_type: str):
    data = (rng.standard_normal((rows, cols)) * 0.02).astype(np.float32)
    if weight_type == "F32":
        return data, None
    if weight_type == "F16":
        return data.astype(np.float16), None
    if weight_type == "Q8_0":
        qtype = gguf.GGMLQuantizationType.Q8_0
        return gguf.quants.quantize(data, qtype), qtype
    raise ValueError(f"gguf_gen: unsupported weight type {weight_type!r}")


def expected_tensors(shape: TinyLlama) -> dict[str, tuple[int, ...]]:
    """Tensor name -> GGUF dims (ne0 first), as written by :func:`write_tiny_llama`."""
    hd, e = shape.head_dim, shape.n_embd
    out: dict[str, tuple[int, ...]] = {"token_embd.weight": (e, shape.n_vocab), "output_norm.weight": (e,)}
    if not shape.tied:
        out["output.weight"] = (e, shape.n_vocab)
    for il in range(shape.n_layer):
        p = f"blk.{il}."
        out[p + "attn_norm.weight"] = (e,)
        out[p + "attn_q.weight"] = (e, shape.n_head * hd)
        out[p + "attn_k.weight"] = (e, shape.n_head_kv * hd)
        out[p + "attn_v.weight"] = (e, shape.n_head_kv * hd)
        out[p + "attn_output.weight"] = (shape.n_head * hd, e)
        out[p + "ffn_norm.weight"] = (e,)
        out[p + "ffn_gate.weight"] = (e, shape.n_ff)
        out[p + "ffn_up.weight"] = (e, shape.n_ff)
        out[p + "ffn_down.weight"] = (shape.n_ff, e)
    return out


def write_tiny_llama(path: str, shape: TinyLlama) -> str:
    """Write ``shape`` to ``path`` (atomically) and return the path. Deterministic for a shape."""
    if shape.n_embd % shape.n_head or shape.n_head % shape.n_head_kv:
        raise ValueError(f"gguf_gen: inconsistent heads in {shape}")
    rng = np.random.default_rng(shape.seed)
    tmp = f"{path}.tmp-{os.getpid()}"
    writer = gguf.GGUFWriter(tmp, "llama")
    writer.add_name(shape.name)
    writer.add_block_count(shape.n_layer)
    writer.add_context_length(shape.n_ctx_train)
    writer.add_embedding_length(shape.n_embd)
    writer.add_feed_forward_length(shape.n_ff)
    writer.add_head_count(shape.n_head)
    writer.add_head_count_kv(shape.n_head_kv)
    writer.add_rope_dimension_count(shape.head_dim)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(shape.n_vocab)
    file_type = {"F32": gguf.LlamaFileType.ALL_F32, "F16": gguf.LlamaFileType.MOSTLY_F16}.get(
        shape.weight_type, gguf.LlamaFileType.MOSTLY_Q8_0
    )
    writer.add_file_type(int(file_type))
    tokens, scores, types = _vocab(shape.n_vocab)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(4 if shape.chat_template else 2)
    writer.add_unk_token_id(0)
    writer.add_add_bos_token(True)
    if shape.chat_template:
        writer.add_chat_template(shape.chat_template)

    def add(name: str, dims: tuple[int, ...], kind: str) -> None:
        if len(dims) == 1:
            writer.add_tensor(name, np.ones(dims[0], dtype=np.float32))
            return
        cols, rows = dims
        data, raw = _matrix(rng, rows, cols, kind)
        if raw is None:
            writer.add_tensor(name, data)
        else:
            writer.add_tensor(name, data, raw_dtype=raw)

    for name, dims in expected_tensors(shape).items():
        # Token embeddings stay F32/F16 (Q8_0 rows need n_embd % 32 == 0, true here, but keep them simple).
        kind = "F16" if name == "token_embd.weight" and shape.weight_type == "Q8_0" else shape.weight_type
        add(name, dims, kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    os.replace(tmp, path)
    return path


def write_sparse_model(
    path: str, n_layer: int = 40, n_embd: int = 8192, n_ff: int = 28672, n_vocab: int = 128256
) -> int:
    """Write a GGUF whose header and tensor table describe a large Q4_K llama (about 20 GB for the
    defaults) and whose data region is a hole (a sparse file). Returns the file size.

    llama.cpp could not run it; it exists to prove that planning reads only the header.
    """
    q4k = gguf.GGMLQuantizationType.Q4_K
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_name("sparse-llama")
    writer.add_block_count(n_layer)
    writer.add_context_length(8192)
    writer.add_embedding_length(n_embd)
    writer.add_feed_forward_length(n_ff)
    writer.add_head_count(64)
    writer.add_head_count_kv(8)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list([f"t{i}" for i in range(n_vocab)])
    writer.add_token_types([1] * n_vocab)

    def q4k_bytes(rows: int, cols: int) -> int:
        return rows * cols // 256 * 144

    def add(name: str, rows: int, cols: int, quant: bool = True) -> None:
        if quant:
            writer.add_tensor_info(
                name, (rows, cols * 144 // 256), np.dtype(np.uint8), q4k_bytes(rows, cols), raw_dtype=q4k
            )
        else:
            writer.add_tensor_info(name, (cols,), np.dtype(np.float32), cols * 4)

    head_dim = n_embd // 64
    add("token_embd.weight", n_vocab, n_embd)
    add("output_norm.weight", 1, n_embd, quant=False)
    add("output.weight", n_vocab, n_embd)
    for il in range(n_layer):
        p = f"blk.{il}."
        add(p + "attn_norm.weight", 1, n_embd, quant=False)
        add(p + "attn_q.weight", n_embd, n_embd)
        add(p + "attn_k.weight", 8 * head_dim, n_embd)
        add(p + "attn_v.weight", 8 * head_dim, n_embd)
        add(p + "attn_output.weight", n_embd, n_embd)
        add(p + "ffn_norm.weight", 1, n_embd, quant=False)
        add(p + "ffn_gate.weight", n_ff, n_embd)
        add(p + "ffn_up.weight", n_ff, n_embd)
        add(p + "ffn_down.weight", n_embd, n_ff)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    writer.close()
    total = writer.offset_tensor if hasattr(writer, "offset_tensor") else None
    with open(path, "r+b") as handle:
        handle.seek(0, os.SEEK_END)
        header_end = handle.tell()
        data = sum(ti.nbytes for ti in writer.tensors[0].values()) if total is None else total
        # tensors are aligned to 32 bytes; the data region is left as a hole
        handle.truncate(header_end + data + 32 * (len(writer.tensors[0]) + 1))
    return os.path.getsize(path)
