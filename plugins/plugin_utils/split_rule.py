# -*- coding: utf-8 -*-
# Copyright: llmfleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""llama.cpp's split rule (float32, as in llama-model.cpp) and its inverse: the --tensor-split that
gives each RPC device exactly the wanted slots (pure).
"""

from __future__ import absolute_import, annotations, division, print_function

import struct
from typing import List, Sequence

__metaclass__ = type


def _f32(x: float) -> float:
    return struct.unpack("<f", struct.pack("<f", x))[0]


def assign_slots(tensor_split: Sequence[float], n_layer: int, ngl: int) -> List[int]:
    """Device index per slot (n_layer + 1 slots) as llama.cpp assigns them; -1 means the head's CPU.

    ``tensor_split`` has one weight per RPC device (``--rpc`` order). An all-zero split is not
    modelled here (it uses each device's reported memory): the planner never emits one.
    """
    n_dev = len(tensor_split)
    if n_dev == 0 or ngl <= 0:
        return [-1] * (n_layer + 1)
    if all(float(x) == 0.0 for x in tensor_split):
        raise ValueError("an all-zero tensor split is decided by llama.cpp from reported memory")
    splits: List[float] = []
    total = _f32(0.0)
    for x in tensor_split:
        total = _f32(total + _f32(float(x)))
        splits.append(total)
    splits = [_f32(s / total) for s in splits]
    cpu_slots = max(n_layer + 1 - ngl, 0)
    act = min(ngl, n_layer + 1)
    out: List[int] = []
    for il in range(n_layer + 1):
        if il < cpu_slots or il - cpu_slots >= act:
            out.append(-1)
            continue
        x = _f32(_f32(float(il - cpu_slots)) / act)
        # upper_bound: first index whose value is greater than x
        out.append(next((i for i, s in enumerate(splits) if s > x), n_dev))
    return out


def tensor_split_for(slot_counts: Sequence[int]) -> str:
    """The ``--tensor-split`` string that gives each RPC device exactly ``slot_counts[i]`` slots.

    Using the counts themselves makes llama.cpp's cumulative fractions exactly count/total, so
    the upper_bound lands on the intended device (the self-check in :func:`verify_split` proves
    it for every plan).
    """
    if not slot_counts or any(c < 0 for c in slot_counts) or sum(slot_counts) == 0:
        raise ValueError("slot counts must be non-negative with a positive sum: %r" % (list(slot_counts),))
    return ",".join(str(int(c)) for c in slot_counts)


def verify_split(tensor_split: str, slot_counts: Sequence[int], n_layer: int, ngl: int) -> None:
    ts = [float(x) for x in tensor_split.split(",")]
    slots = assign_slots(ts, n_layer, ngl)
    got = [slots.count(i) for i in range(len(ts))]
    if got != list(slot_counts):
        raise AssertionError("tensor split %s gives %r, wanted %r" % (tensor_split, got, list(slot_counts)))


def rpc_device_names(devices_per_endpoint: Sequence[int]) -> List[List[str]]:
    """The names the head gives the RPC devices (what ``--device`` takes): ``RPC<n>``, numbered over every endpoint of
    ``--rpc`` in order and, within one endpoint, in the order its rpc-server offers them (its
    ``-d`` list).

    The pinned build (ggml/src/ggml-rpc/ggml-rpc.cpp, ``ggml_backend_rpc_add_server``) names each
    device of a newly added endpoint ``"RPC" + dev_id`` from one process-wide counter that only
    grows; common/arg.cpp ``add_rpc_devices`` adds the endpoints of ``--rpc`` in the order given,
    while the arguments are parsed (so ``--device`` must come after ``--rpc`` to find them by
    name: ``parse_device_list`` looks them up with ``ggml_backend_dev_by_name``).
    """
    out: List[List[str]] = []
    n = 0
    for count in devices_per_endpoint:
        if count < 1:
            raise ValueError("an RPC endpoint offers at least one device, got %r" % (count,))
        out.append(["RPC%d" % (n + i) for i in range(count)])
        n += count
    return out


def rpc_report_names(endpoints: Sequence[str], devices_per_endpoint: Sequence[int]) -> List[List[str]]:
    """How the head's buffer report prints the RPC devices: ``RPC<i>[<endpoint>]``, ``i`` the
    device's index on its own rpc-server (its place in the ``-d`` list), not the device's name.

    The pinned build names an RPC device's buffer type and backend ``"RPC" + device + "[" +
    endpoint + "]"`` with ``device`` the index within the endpoint (ggml-rpc.cpp
    ``ggml_backend_rpc_buffer_type`` and ``ggml_backend_rpc_init``, called with the device
    context's ``device = ind``); the load_tensors / llama_kv_cache / sched_reserve lines print
    those names (``RPC1[127.0.0.1:50300] model buffer size``: bench/vulkan_buffers.json).
    """
    if len(endpoints) != len(devices_per_endpoint):
        raise ValueError("%d endpoints for %d device counts" % (len(endpoints), len(devices_per_endpoint)))
    rpc_device_names(devices_per_endpoint)  # the same counts must be valid
    return [
        ["RPC%d[%s]" % (i, ep) for i in range(count)] for ep, count in zip(endpoints, devices_per_endpoint)
    ]


def default_device_order(rpc: Sequence[str], gpus: Sequence[str], igpus: Sequence[str]) -> List[str]:
    """The devices llama-server splits over when no ``--device`` is given (pinned build,
    src/llama.cpp ``llama_model_load_from_file_impl``, "default device selection"): the RPC
    devices first ("to minimize network transfers"), then the local discrete GPUs, then the
    local integrated GPUs only when there is no discrete one; CPU devices are never in the list
    (the head's CPU holds the first ``n_layer + 1 - ngl`` slots). With ``--device`` the list is
    the one given, in its order: the planner always passes it (placement_render.split_args), so
    that the head's own GPUs come right after its CPU and every host's layers stay contiguous.
    """
    return [*rpc, *gpus, *([] if gpus else igpus)]
