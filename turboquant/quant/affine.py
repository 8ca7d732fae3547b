"""Asymmetric per-group affine quantization with an integer zero point.

For a group ``x`` of ``G`` elements (along head_dim) and ``qmax = 2**bits - 1``:

* Range: ``lo = min(min(x), 0)``, ``hi = max(max(x), 0)``. The range always contains 0, so
  the integer zero point lies in ``[0, qmax]`` and 0 is exactly representable. KV groups
  straddle 0 in practice, so this costs nothing there.
* Clipping (``clip_percentile=p``): ``t`` = the ``p``-th percentile of ``|x|`` within the
  group (linear interpolation between order statistics); ``lo = max(lo, -t)``,
  ``hi = min(hi, t)``. Elements outside saturate.
* Scale: ``s = (hi - lo) / qmax``, stored in the metadata dtype *rounded up* (to the next
  representable value when the cast rounded down), so the stored grid still spans
  ``[lo, hi]``; an all-zero group gets ``s = 1``. A scale beyond the metadata dtype's range
  saturates at its largest finite value (then elements beyond ``±max·qmax/2`` saturate too).
* Zero point: ``z = round(-lo / s)``, an integer in ``[0, qmax]``.
* Codes: ``q = clamp(round(x / s) + z, 0, qmax)``; decode ``x ≈ s * (q - z)``.
* Rounding: round half to even (``torch.round``; Inductor and Triton's ``nearbyint``
  agree). Every finite, unclipped element decodes within ``s / 2`` of its value.
* Non-finite elements (NaN, ±Inf) are quantized as if they were 0: they take no part in
  the range, so the rest of the group keeps its accuracy, and they decode to exactly 0.
"""

from __future__ import annotations

import torch

__all__ = ["affine_quantize", "affine_dequantize", "to_metadata"]


_BITS = {torch.float16: torch.int16, torch.bfloat16: torch.int16, torch.float32: torch.int32}  # same width


def to_metadata(x: torch.Tensor, dtype: torch.dtype, *, round_up: bool = False) -> torch.Tensor:
    """Cast a non-negative float tensor to the metadata dtype, saturating instead of overflowing.

    ``round_up`` makes the stored value >= ``x`` (up to saturation), subnormals included:
    where the cast rounded down, take the next representable value.
    """
    info = torch.finfo(dtype)
    y = x.clamp(max=info.max).to(dtype)
    if round_up and x.dtype != dtype:
        # the next value up as the bit pattern plus one (y >= 0), not torch.nextafter: Inductor
        # computes a half-precision nextafter in float32, where the step is lost in the cast back
        # (compiled scales came out one fp16 step low for half the tokens)
        up = (y.view(_BITS[dtype]) + 1).view(dtype)
        y = torch.where((y.to(x.dtype) < x) & (y < info.max), up, y)
    return y



def _percentile(a: torch.Tensor, p: float) -> torch.Tensor:
    """``p``-th percentile along the last dim, linear interpolation (as ``torch.quantile``).

    Sorting instead of ``torch.quantile`` because the latter refuses inputs over 16M elements.
    """
    n = a.shape[-1]
    s = a.sort(dim=-1).values
    pos = p / 100.0 * (n - 1)
    i = min(int(pos), n - 1)
    j = min(i + 1, n - 1)
    frac = pos - i
    return s[..., i] + (s[..., j] - s[..., i]) * frac


def _work_dtype(x: torch.Tensor) -> torch.dtype:
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def affine_quantize(x: torch.Tensor, bits: int, group_size: int, clip_percentile, metadata_dtype):
    """Quantize ``x [..., D]``; returns ``codes uint8 [..., D]`` and ``meta [..., D/G, 2]``.

    ``meta[..., 0]`` is the scale and ``meta[..., 1]`` the zero point, in ``metadata_dtype``.
    """
    qmax = (1 << bits) - 1
    d = x.shape[-1]
    xw = x.to(_work_dtype(x))
    xw = torch.where(torch.isfinite(xw), xw, torch.zeros((), dtype=xw.dtype, device=xw.device))
    xg = xw.reshape(*x.shape[:-1], d // group_size, group_size)
    lo = xg.amin(-1).clamp(max=0)
    hi = xg.amax(-1).clamp(min=0)
    if clip_percentile is not None and clip_percentile < 100:
        t = _percentile(xg.abs(), clip_percentile)
        lo = torch.maximum(lo, -t)
        hi = torch.minimum(hi, t)
    scale = (hi - lo) / qmax
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    scale_m = to_metadata(scale, metadata_dtype, round_up=True)
    s = scale_m.to(xw.dtype)
    zero = torch.round(-lo / s).clamp(0, qmax)
    q = torch.round(xg / s.unsqueeze(-1)) + zero.unsqueeze(-1)
    codes = q.clamp(0, qmax).to(torch.uint8).reshape(x.shape)
    meta = torch.stack([scale_m, zero.to(metadata_dtype)], dim=-1)
    return codes, meta


def affine_dequantize(codes: torch.Tensor, meta: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Decode ``codes [..., D]`` with ``meta [..., D/G, 2]`` to ``dtype``."""
    n_groups = meta.shape[-2]
    work = torch.float64 if dtype == torch.float64 else torch.float32
    cg = codes.to(work).reshape(*codes.shape[:-1], n_groups, -1)
    m = meta.to(work)
    x = m[..., 0:1] * (cg - m[..., 1:2])
    return x.reshape(codes.shape).to(dtype)
