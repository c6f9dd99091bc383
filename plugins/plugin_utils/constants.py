# -*- coding: utf-8 -*-
# Copyright: llmfleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The planner's constants, each written once (pure, stdlib only).

Every module of the planner, the speed model, profile and tune imports its limits and defaults
from here (as gguf-py's ``gguf/constants.py``): a bound written twice drifts (the speed figures'
``mbit_s`` bound was 10^6 in profile.py and 10^7 in speed.py; both now read
:data:`SPEED_LIMITS`).
"""

from __future__ import absolute_import, annotations, division, print_function

from typing import Dict, Tuple

__metaclass__ = type

MIB = 1024 * 1024
# llama.cpp pads the KV cache's cells to this many
KV_PAD = 256
DEFAULT_RPC_PORT = 50052
DEFAULT_RESERVE_MIB = 64
# VRAM kept free on each discrete GPU (a desktop's display, the driver): llmfleet_gpu_reserve_mib
DEFAULT_GPU_RESERVE_MIB = 512

# The KV cache types llama.cpp takes: (elements per block, bytes per block).
CACHE_TYPES: Dict[str, Tuple[int, int]] = {
    "f32": (1, 4),
    "f16": (1, 2),
    "bf16": (1, 2),
    "q8_0": (32, 34),
    "q4_0": (32, 18),
    "q4_1": (32, 20),
    "iq4_nl": (32, 18),
    "q5_0": (32, 22),
    "q5_1": (32, 24),
}

# The memory search (placement_search.py): worker sets of more candidates than this are chosen
# greedily (the fastest, then the roomiest prefix), and orders beyond MEMORY_MAX_ORDERS are not
# enumerated (every worker as the output holder still is).
MEMORY_EXACT_WORKERS = 10
MEMORY_MAX_ORDERS = 120
# The speed search (speed_search.py, docs/planner.md "The search"): exact over every subset of up
# to SPEED_EXACT_WORKERS candidates, every --rpc order of sets of up to SPEED_MAX_PERMUTED workers;
# beyond SPEED_EXACT_WORKERS, SPEED_MAX_LAST output holders by room and by link. The speed search
# costs more per set than the memory search (a dynamic programme per order), hence the lower limit.
SPEED_EXACT_WORKERS = 8
SPEED_MAX_PERMUTED = 4
SPEED_MAX_LAST = 2

# Sane upper bounds of the speed figures (speed.py validates a plan's, profile.py a profile's and
# an inventory's llmfleet_profile): above these a figure is a unit mistake, not a slow machine.
MAX_MS = 60000.0  # a minute per layer, per output layer, per token, per round trip
MAX_MBIT_S = 10000000.0  # 10 Tbit/s
MAX_CPU_QUOTA = 4096.0  # CPUs
SPEED_LIMITS: Dict[str, float] = {
    "ms_per_layer": MAX_MS,
    "output_ms": MAX_MS,
    "output_cpu_ms": MAX_MS,
    "token_ms": MAX_MS,
    "cpu_ms_per_layer": MAX_MS,
    "cpu_quota": MAX_CPU_QUOTA,
    "rtt_ms": MAX_MS,
    "mbit_s": MAX_MBIT_S,
}

# A device's ms per layer when the profile has not measured it (speed.py, docs/planner.md "Speed
# per device"): a factor of its host's CPU figure (ms_per_layer), by the device's kind. Assumed,
# not measured: the plan names every device priced this way. A discrete GPU reads a layer's
# weights from VRAM at many times a CPU's memory bandwidth; an iGPU shares the CPU's RAM; a Vulkan
# driver that runs on the CPU (lavapipe/llvmpipe, SwiftShader) is far slower than the CPU backend
# (gpu-here.md: the 135M model 1.6 tokens/s all on lavapipe, ~30 on the CPU backend).
DEVICE_SPEED_DEFAULTS: Dict[str, float] = {
    "cuda": 0.1,
    "rocm": 0.15,
    "vulkan": 0.2,
    "igpu": 0.6,
    "cpu_driver": 20.0,
}
