"""Cached numeric tables (rotations, codebooks) as tensors on the caller's device."""

from __future__ import annotations

import torch

from ..compat import real_tolist, tracing_with_fake_tensors

__all__ = ["as_constant"]


def as_constant(table: torch.Tensor, device=None, dtype=None) -> torch.Tensor:
    """``table`` (a cached CPU tensor) on ``device``/``dtype``.

    While a graph is traced with fake tensors a real tensor cannot be moved, so the table is
    rebuilt from Python numbers and becomes a constant of the compiled graph.
    """
    if tracing_with_fake_tensors():
        return torch.tensor(real_tolist(table), device=device, dtype=dtype or table.dtype)
    if device is None or torch.device(device).type == "cpu":
        return table.to(dtype=dtype)
    # one copy per device and dtype: a host-to-device copy per call would sync, and is not
    # allowed at all while a CUDA graph is being captured
    key = (id(table), str(torch.device(device)), dtype)
    hit = _ON_DEVICE.get(key)
    if hit is None or hit[0] is not table:
        hit = _ON_DEVICE[key] = (table, table.to(device=device, dtype=dtype))
    return hit[1]


_ON_DEVICE: dict = {}
