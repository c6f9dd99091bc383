# -*- coding: utf-8 -*-
# Copyright: llmfleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Read the layout of a Hugging Face model directory: what a vLLM user has.

vLLM serves a Hugging Face checkpoint (``config.json`` plus ``*.safetensors``), not a GGUF, so the
lws target learns the layer sizes from those two, reading only:

- ``config.json`` (at most ``MAX_CONFIG_BYTES``): layers, hidden size, heads, KV heads, head
  dimension, vocabulary, ``tie_word_embeddings``, ``sliding_window``;
- ``model.safetensors.index.json`` when the checkpoint is sharded (at most ``MAX_CONFIG_BYTES``),
  else every ``*.safetensors`` file in the directory;
- each safetensors file's header: 8 bytes little-endian length, then that many bytes of JSON
  (at most ``MAX_HEADER_BYTES``) naming every tensor's dtype, shape and data offsets. The tensor
  data is never read.

Tensors are grouped the way vLLM's pipeline parallelism loads them (``make_layers`` in
vllm/model_executor/models/utils.py): ``model.layers.N.*`` belong to layer N (the rank holding it
loads them), ``model.embed_tokens.*`` to the first rank, ``model.norm.*`` and ``lm_head.*`` to
the last rank (with tied embeddings the last rank still holds an lm_head: the embedding's bytes).
The result has the shape ``gguf_layout`` returns, so the planner reads either.
"""

from __future__ import absolute_import, annotations, division, print_function

import json
import os
import re
import struct
from typing import Any, Dict, List, Tuple

__metaclass__ = type

MAX_CONFIG_BYTES = 1024 * 1024
# A safetensors header lists every tensor once; 64 MiB holds hundreds of thousands of entries.
MAX_HEADER_BYTES = 64 * 1024 * 1024
MAX_FILES = 4096
DTYPE_BYTES = {
    "F64": 8,
    "I64": 8,
    "U64": 8,
    "F32": 4,
    "I32": 4,
    "U32": 4,
    "F16": 2,
    "BF16": 2,
    "I16": 2,
    "U16": 2,
    "I8": 1,
    "U8": 1,
    "BOOL": 1,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
}
_LAYER_RE = re.compile(r"^(?:model\.|transformer\.)?(?:language_model\.)?(?:model\.)?layers\.(\d+)\.")
_EMBED_PREFIXES = ("model.embed_tokens.", "embed_tokens.", "model.language_model.embed_tokens.")
_NORM_PREFIXES = ("model.norm.", "norm.", "model.language_model.norm.")


class HfLayoutError(ValueError):
    """A model directory that cannot be planned; the message names the file and the value."""


def _read_bounded(path: str, limit: int) -> bytes:
    try:
        size = os.path.getsize(path)
    except OSError as err:
        raise HfLayoutError("%s: %s" % (path, err.strerror or err)) from err
    if size > limit:
        raise HfLayoutError("%s: %d bytes, more than the %d this reader accepts" % (path, size, limit))
    with open(path, "rb") as fh:
        return fh.read(limit + 1)


def _json_file(path: str) -> Dict[str, Any]:
    raw = _read_bounded(path, MAX_CONFIG_BYTES)
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as err:
        raise HfLayoutError("%s: not JSON: %s" % (path, err)) from err
    if not isinstance(data, dict):
        raise HfLayoutError("%s: a JSON object was expected, got %s" % (path, type(data).__name__))
    return data


def safetensors_header(path: str, max_header_bytes: int = MAX_HEADER_BYTES) -> Tuple[Dict[str, Any], int]:
    """The header of one safetensors file (tensor name -> {dtype, shape, data_offsets}) and the
    number of bytes read. Only the 8-byte length and the header are read."""
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as fh:
            head = fh.read(8)
            if len(head) != 8:
                raise HfLayoutError("%s: %d bytes, too short for a safetensors file" % (path, len(head)))
            (length,) = struct.unpack("<Q", head)
            if length < 2 or length > max_header_bytes or 8 + length > size:
                raise HfLayoutError(
                    "%s: header length %d is implausible (file %d bytes, limit %d)"
                    % (path, length, size, max_header_bytes)
                )
            raw = fh.read(length)
    except OSError as err:
        raise HfLayoutError("%s: %s" % (path, err.strerror or err)) from err
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as err:
        raise HfLayoutError("%s: the header is not JSON: %s" % (path, err)) from err
    if not isinstance(header, dict):
        raise HfLayoutError("%s: the header is not a JSON object" % path)
    data_bytes = size - 8 - length
    for name, info in header.items():
        if name == "__metadata__":
            continue
        _tensor_bytes(path, name, info, data_bytes)
    return header, 8 + length


def _tensor_bytes(path: str, name: str, info: Any, data_bytes: int) -> int:
    if not isinstance(info, dict):
        raise HfLayoutError("%s: tensor %r: not an object" % (path, name))
    dtype, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
    if dtype not in DTYPE_BYTES:
        raise HfLayoutError("%s: tensor %r: unknown dtype %r" % (path, name, dtype))
    if not isinstance(shape, list) or not all(
        isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape
    ):
        raise HfLayoutError("%s: tensor %r: shape %r is not a list of sizes" % (path, name, shape))
    count = 1
    for d in shape:
        count *= d
    nbytes = count * DTYPE_BYTES[dtype]
    if (
        not isinstance(offsets, list)
        or len(offsets) != 2
        or not all(isinstance(o, int) and not isinstance(o, bool) for o in offsets)
        or offsets[1] - offsets[0] != nbytes
        or offsets[0] < 0
        or offsets[1] > data_bytes
    ):
        raise HfLayoutError(
            "%s: tensor %r: data_offsets %r do not hold %d bytes of %s %r inside %d data bytes"
            % (path, name, offsets, nbytes, dtype, shape, data_bytes)
        )
    return nbytes


def _int(config: Dict[str, Any], key: str, source: str, default: Any = None, low: int = 1) -> int:
    value = config.get(key, default)
    if value is None:
        raise HfLayoutError("%s: %s is missing" % (source, key))
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise HfLayoutError("%s: %s must be an integer >= %d, got %r" % (source, key, low, value))
    return value


def _weight_files(directory: str) -> List[str]:
    index = os.path.join(directory, "model.safetensors.index.json")
    if os.path.exists(index):
        weight_map = _json_file(index).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise HfLayoutError("%s: weight_map is missing or empty" % index)
        names = sorted({str(v) for v in weight_map.values()})
    else:
        names = sorted(n for n in os.listdir(directory) if n.endswith(".safetensors"))
    if not names:
        raise HfLayoutError(
            "%s: no *.safetensors file (vLLM's CPU path needs safetensors weights)" % directory
        )
    if len(names) > MAX_FILES:
        raise HfLayoutError("%s: %d weight files, more than %d" % (directory, len(names), MAX_FILES))
    for n in names:
        if os.path.basename(n) != n:
            raise HfLayoutError("%s: weight file %r is not a plain file name" % (directory, n))
    return [os.path.join(directory, n) for n in names]


def read_hf_layout(directory: str) -> Dict[str, Any]:
    """The layout of the model in ``directory`` (config.json + safetensors headers), in the shape of
    ``GgufLayout.to_dict()`` plus ``format: safetensors`` and ``weights_dtype_bytes``."""
    if not os.path.isdir(directory):
        raise HfLayoutError(
            "%s: not a directory (a Hugging Face model directory with config.json)" % directory
        )
    config_path = os.path.join(directory, "config.json")
    config = _json_file(config_path)
    text = config.get("text_config")
    if isinstance(text, dict):
        config = {**config, **text}
    n_layer = _int(config, "num_hidden_layers", config_path)
    n_embd = _int(config, "hidden_size", config_path)
    n_head = _int(config, "num_attention_heads", config_path)
    n_head_kv = _int(config, "num_key_value_heads", config_path, n_head)
    head_dim = _int(config, "head_dim", config_path, n_embd // n_head)
    n_vocab = _int(config, "vocab_size", config_path)
    n_ff = _int(config, "intermediate_size", config_path, 0, low=0)
    window = config.get("sliding_window") or 0
    if isinstance(window, bool) or not isinstance(window, int) or window < 0:
        raise HfLayoutError("%s: sliding_window must be an integer or null, got %r" % (config_path, window))
    tied_config = bool(config.get("tie_word_embeddings", False))

    layer_bytes = [0] * n_layer
    layer_largest = [0] * n_layer
    embed = output = norm = other = 0
    file_bytes = bytes_read = 0
    seen: Dict[str, str] = {}
    dtype_bytes: Dict[int, int] = {}
    for path in _weight_files(directory):
        header, used = safetensors_header(path)
        bytes_read += used
        file_bytes += os.path.getsize(path)
        data_bytes = os.path.getsize(path) - used
        for name, info in header.items():
            if name == "__metadata__":
                continue
            if name in seen:
                raise HfLayoutError("%s: tensor %r is also in %s" % (path, name, seen[name]))
            seen[name] = path
            nbytes = _tensor_bytes(path, name, info, data_bytes)
            width = DTYPE_BYTES[info["dtype"]]
            dtype_bytes[width] = dtype_bytes.get(width, 0) + nbytes
            m = _LAYER_RE.match(name)
            if m:
                il = int(m.group(1))
                if il >= n_layer:
                    other += nbytes
                    continue
                layer_bytes[il] += nbytes
                layer_largest[il] = max(layer_largest[il], nbytes)
            elif name.startswith(_EMBED_PREFIXES):
                embed += nbytes
            elif name.startswith("lm_head."):
                output += nbytes
            elif name.startswith(_NORM_PREFIXES):
                norm += nbytes
            else:
                other += nbytes
    if embed == 0:
        raise HfLayoutError("%s: no embed_tokens tensor in the safetensors headers" % directory)
    empty = [il for il, b in enumerate(layer_bytes) if b == 0]
    if empty:
        raise HfLayoutError(
            "%s: config.json says %d layers but no tensors of layer(s) %s" % (directory, n_layer, empty[:8])
        )
    tied = output == 0
    if tied:
        # vLLM's last rank ties its lm_head to an embedding of its own: the same bytes again.
        output = embed
    elif tied_config:
        tied = False
    return {
        "source": directory,
        "format": "safetensors",
        "architecture": (config.get("architectures") or [config.get("model_type") or "unknown"])[0],
        "name": os.path.basename(os.path.normpath(directory)),
        "file_bytes": file_bytes,
        "bytes_read": bytes_read,
        "n_layer": n_layer,
        "n_embd": n_embd,
        "n_ff": n_ff,
        "n_head": [n_head] * n_layer,
        "n_head_kv": [n_head_kv] * n_layer,
        "head_dim_k": head_dim,
        "head_dim_v": head_dim,
        "n_vocab": n_vocab,
        "n_ctx_train": _int(config, "max_position_embeddings", config_path, 0, low=0),
        "sliding_window": window,
        "swa_layers": [bool(window)] * n_layer,
        "tied_output": tied,
        "layer_bytes": layer_bytes,
        "layer_largest_tensor": layer_largest,
        "token_embd_bytes": embed,
        "output_bytes": output,
        "output_norm_bytes": norm,
        "other_bytes": other,
        "weights_bytes": sum(layer_bytes) + embed + (0 if tied else output) + norm + other,
        # The checkpoint's dominant element width (4 = float32): the lws role scales the weights to
        # the dtype vLLM serves.
        "weights_dtype_bytes": max(dtype_bytes, key=lambda w: dtype_bytes[w]),
    }
