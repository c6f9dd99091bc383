"""Test-only helpers (HTTP mirror, GGUF generators, llama.cpp split emulation)."""
