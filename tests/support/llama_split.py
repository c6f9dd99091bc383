"""An independent emulation of llama.cpp's layer assignment (test-only).

Written from the rule in llama.cpp's src/llama-model.cpp (load_tensors), not from placement.py:

- n_layer + 1 slots: repeating layers 0..n_layer-1, then the output layer as slot n_layer;
- the first max(n_layer + 1 - ngl, 0) slots stay on the CPU of the host running llama-server;
- the tensor split is summed cumulatively and normalised in float32; slot il of the offloaded
  ones goes to the first device whose fraction is greater than (il - cpu_slots) / act_slots
  (std::upper_bound), act_slots = min(ngl, n_layer + 1);
- the output layer therefore lands on the last device with a non-zero share.

numpy's float32 arithmetic and searchsorted(side="right") play the roles of C++ float and
upper_bound.
"""

from __future__ import annotations

import numpy as np

CPU = -1


def parse_tensor_split(text: str) -> list[float]:
    """Parse a --tensor-split value the way llama.cpp's argument parser does (commas or slashes)."""
    parts = text.replace("/", ",").split(",")
    return [float(p) for p in parts]


def slot_devices(tensor_split: list[float], n_layer: int, ngl: int) -> list[int]:
    """Device index (in --rpc order) of every slot, CPU (-1) for slots kept on the head."""
    n_devices = len(tensor_split)
    if n_devices == 0:
        return [CPU] * (n_layer + 1)
    fractions = np.cumsum(np.asarray(tensor_split, dtype=np.float32), dtype=np.float32)
    fractions = (fractions / fractions[-1]).astype(np.float32)
    cpu_slots = max(n_layer + 1 - ngl, 0)
    act = min(ngl, n_layer + 1)
    devices = []
    for il in range(n_layer + 1):
        if il < cpu_slots or act <= 0:
            devices.append(CPU)
            continue
        x = np.float32(il - cpu_slots) / np.float32(act)
        devices.append(int(np.searchsorted(fractions, np.float32(x), side="right")))
    return devices


def layer_counts(tensor_split: list[float], n_layer: int, ngl: int) -> tuple[int, list[int], int]:
    """(slots on the head's CPU, slots per device, index of the device holding the output slot;
    -1 when the output stays on the CPU)."""
    devices = slot_devices(tensor_split, n_layer, ngl)
    per_device = [devices.count(i) for i in range(len(tensor_split))]
    return devices.count(CPU), per_device, devices[n_layer]


def from_args(args: list[str], n_layer: int) -> tuple[int, list[int], int]:
    """Apply the rule to a llama-server argument list (--rpc, --tensor-split, -ngl)."""
    rpc: list[str] = []
    ts: list[float] = []
    ngl = -1
    for flag, value in zip(args, args[1:]):
        if flag == "--rpc":
            rpc = value.split(",")
        elif flag in ("--tensor-split", "-ts"):
            ts = parse_tensor_split(value)
        elif flag in ("-ngl", "--n-gpu-layers", "--gpu-layers"):
            ngl = n_layer + 1 if value in ("all", "auto") else int(value)
    if ngl < 0:
        ngl = n_layer + 1
    if not rpc:
        return n_layer + 1, [], CPU
    if not ts:
        raise ValueError("no --tensor-split: the default split depends on reported memory")
    if len(ts) != len(rpc):
        raise ValueError(f"{len(ts)} tensor-split weights for {len(rpc)} RPC devices")
    return layer_counts(ts, n_layer, ngl)
