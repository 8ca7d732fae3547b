"""Triton kernels: decode attention over packed codes (more to come: quantize-on-write, prefill)."""
