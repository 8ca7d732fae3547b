"""Asymmetric per-group affine quantization with an integer zero point.

For a group ``x`` of ``G`` elements (along head_dim) and ``qmax = 2**bits - 1``:

* Range: ``lo = min(min(x), 0)``, ``hi = max(max(x), 0)``. The range always contains 0, so
  the integer zero point lies in ``[0, qmax]`` and 0 is exactly representable. KV groups
  straddle 0 in practice, so this costs nothing there.
* Clipping (``clip_percentile=p``): ``t`` = the ``p``-th percentile of ``|x|`` within the
  group (linear interpolation between order statistics); ``lo = max(lo, -t)``,
  ``hi = min(hi, t)``. Elements outside saturate.
* Scale: ``s = (hi - lo) · (1 / qmax)`` (the reciprocal in float32), stored in the metadata
  dtype *rounded up* (to the next representable value when the cast rounded down), so the
  stored grid still spans ``[lo, hi]``; an all-zero group gets ``s = 1``. A scale beyond the
  metadata dtype's range saturates at its largest finite value (then elements beyond
  ``±max·qmax/2`` saturate too). The reciprocal, not a division: CUDA eager and Inductor on GPUs
  compute ``/ qmax`` as this multiply, the CPU divides; one definition encodes alike everywhere.
* Zero point: ``z = round(-lo / s)``, an integer in ``[0, qmax]``.
* Codes: ``q = clamp(round(x / s) + z, 0, qmax)``; decode ``x ≈ s * (q - z)``.
* Rounding: round half to even (``torch.round``; Inductor and Triton's ``nearbyint``
  agree). Every finite, unclipped element decodes within ``s / 2`` of its value.
* Non-finite elements (NaN, ±Inf) are quantized as if they were 0: they take no part in
  the range, so the rest of the group keeps its accuracy, and they decode to exactly 0.
"""

from __future__ import annotations

import functools

import torch

from .packing import byte_sources, pack_sources

__all__ = ["affine_quantize", "affine_quantize_packed", "affine_dequantize", "to_metadata", "metadata_word_dtype",
           "metadata_word", "metadata_pair"]


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


def _finite(x: torch.Tensor) -> torch.Tensor:
    xw = x.to(_work_dtype(x))
    return torch.where(torch.isfinite(xw), xw, torch.zeros((), dtype=xw.dtype, device=xw.device))


def _scale_zero(lo: torch.Tensor, hi: torch.Tensor, qmax: int, metadata_dtype, work_dtype):
    """(stored scale, scale as computed with, integer zero point) of the range ``[lo, hi]``."""
    # times the reciprocal, not over qmax: CUDA eager and Inductor on GPUs turn a division by a
    # constant into this multiply, the CPU divides; one definition keeps every path's codes equal
    scale = (hi - lo) * (1.0 / qmax)
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    scale_m = to_metadata(scale, metadata_dtype, round_up=True)
    s = scale_m.to(work_dtype)
    return scale_m, s, torch.round(-lo / s).clamp(0, qmax)


def affine_quantize(x: torch.Tensor, bits: int, group_size: int, clip_percentile, metadata_dtype):
    """Quantize ``x [..., D]``; returns ``codes uint8 [..., D]`` and ``meta [..., D/G, 2]``.

    ``meta[..., 0]`` is the scale and ``meta[..., 1]`` the zero point, in ``metadata_dtype``.
    """
    qmax = (1 << bits) - 1
    d = x.shape[-1]
    xw = _finite(x)
    xg = xw.reshape(*x.shape[:-1], d // group_size, group_size)
    lo = xg.amin(-1).clamp(max=0)
    hi = xg.amax(-1).clamp(min=0)
    if clip_percentile is not None and clip_percentile < 100:
        t = _percentile(xg.abs(), clip_percentile)
        lo = torch.maximum(lo, -t)
        hi = torch.minimum(hi, t)
    scale_m, s, zero = _scale_zero(lo, hi, qmax, metadata_dtype, xw.dtype)
    q = torch.round(xg / s.unsqueeze(-1)) + zero.unsqueeze(-1)
    codes = q.clamp(0, qmax).to(torch.uint8).reshape(x.shape)
    meta = torch.stack([scale_m, zero.to(metadata_dtype)], dim=-1)
    return codes, meta


def metadata_word_dtype(metadata_dtype: torch.dtype) -> torch.dtype:
    """The integer type one (scale, zero point) pair fills: int32 for 16-bit metadata, int64 for fp32."""
    return {16: torch.int32, 32: torch.int64}[torch.finfo(metadata_dtype).bits]


def _same_width_int(metadata_dtype: torch.dtype) -> torch.dtype:
    return {16: torch.int16, 32: torch.int32}[torch.finfo(metadata_dtype).bits]


def metadata_word(scale: torch.Tensor, zero: torch.Tensor) -> torch.Tensor:
    """``(scale, zero)`` (metadata dtype) as one integer holding their bytes, scale first (the bytes
    of the pair ``[scale, zero]``, little-endian). Same-width bitcasts and integer ops only: a
    compiler lowers them inline, where a view to a wider dtype is a library call."""
    width = torch.finfo(scale.dtype).bits
    word, as_int = metadata_word_dtype(scale.dtype), _same_width_int(scale.dtype)
    return (scale.view(as_int).to(word) & ((1 << width) - 1)) | (zero.view(as_int).to(word) << width)


def metadata_pair(word: torch.Tensor, metadata_dtype: torch.dtype):
    """Inverse of :func:`metadata_word`: ``(scale, zero)`` in ``metadata_dtype``."""
    width = torch.finfo(metadata_dtype).bits
    as_int = _same_width_int(metadata_dtype)
    return (word.to(as_int).view(metadata_dtype),  # the low half (the cast wraps)
            (word >> width).to(as_int).view(metadata_dtype))


def affine_quantize_packed(x: torch.Tensor, bits: int, metadata_dtype):
    """``affine_quantize(x, bits, D, None, metadata_dtype)`` with its codes packed, bit for bit, in
    the form a compiler fuses into the one kernel that stores a cache row.

    Returns ``codes uint8 [..., packed_size(D, bits)]`` and ``meta [..., 1]``: the (scale, zero)
    pair as one integer (:func:`metadata_word`).

    Everything happens in the packed row's iteration space (:func:`~.packing.byte_sources`): the
    range is a min/max over the slots, each packed byte is computed where it is stored, and
    the metadata is one value per row, the reduction's own space. Inductor's Triton backend
    then makes one kernel of it (min/max, scale, rounding, packing and both stores) where
    :func:`affine_quantize` + :func:`~.packing.pack_codes` take three (per-element codes,
    per-byte packing and per-(row, field) metadata are three iteration spaces).
    """
    qmax = (1 << bits) - 1
    xw = _finite(x)
    slots = byte_sources(xw, bits)
    lo = functools.reduce(torch.minimum, slots).amin((-2, -1)).clamp(max=0)
    hi = functools.reduce(torch.maximum, slots).amax((-2, -1)).clamp(min=0)
    scale_m, s, zero = _scale_zero(lo, hi, qmax, metadata_dtype, xw.dtype)
    s, z = s[..., None, None], zero[..., None, None]
    codes = pack_sources([(torch.round(v / s) + z).clamp(0, qmax).to(torch.uint8).to(torch.int32) for v in slots],
                         bits)
    return codes, metadata_word(scale_m, zero.to(metadata_dtype)).unsqueeze(-1)


def affine_dequantize(codes: torch.Tensor, meta: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Decode ``codes [..., D]`` with ``meta [..., D/G, 2]`` to ``dtype``."""
    n_groups = meta.shape[-2]
    work = torch.float64 if dtype == torch.float64 else torch.float32
    cg = codes.to(work).reshape(*codes.shape[:-1], n_groups, -1)
    m = meta.to(work)
    x = m[..., 0:1] * (cg - m[..., 1:2])
    return x.reshape(codes.shape).to(dtype)
