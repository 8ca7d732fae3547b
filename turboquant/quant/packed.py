"""The packed form of a quantized K or V tensor, and the public round trip."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from ..config import KVQuantConfig, TensorQuantSpec
from .affine import affine_dequantize, affine_quantize
from .packing import pack_codes, unpack_codes
from .turbo import turbo_dequantize, turbo_quantize

__all__ = ["QuantizedKV", "quantize_kv", "dequantize_kv", "encode", "decode", "metadata_shape"]

_FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


@dataclass(frozen=True)
class QuantizedKV:
    """A K or V tensor ``[..., D]`` held as packed codes plus metadata.

    Attributes:
        codes: ``uint8 [..., packed_size(D, bits)]``, packed along head_dim
            (layouts in :mod:`turboquant.quant.packing`).
        meta: affine — ``[..., D / group_size, 2]`` holding (scale, zero point) per group;
            turbo — ``[..., 1]`` holding the vector's norm. In ``spec.metadata_dtype``.
        spec: how it was quantized (method, bits, group size, …).
        head_dim: ``D``.
        dtype: the dtype :func:`dequantize_kv` returns (the input's).
        nonfinite: 0-d int64 tensor, how many NaN/±Inf input elements were quantized as 0
            (a tensor, so counting never syncs the device).
    """

    codes: torch.Tensor
    meta: torch.Tensor
    spec: TensorQuantSpec
    head_dim: int
    dtype: torch.dtype
    nonfinite: torch.Tensor

    @property
    def shape(self) -> torch.Size:
        """Shape of the tensor this decodes to."""
        return torch.Size((*self.codes.shape[:-1], self.head_dim))

    @property
    def nbytes(self) -> int:
        """Bytes held: codes plus metadata."""
        return self.codes.numel() * self.codes.element_size() + self.meta.numel() * self.meta.element_size()

    def unpacked_codes(self) -> torch.Tensor:
        """``uint8 [..., D]``, one code per element."""
        return unpack_codes(self.codes, self.spec.bits, self.head_dim)


def metadata_shape(spec: TensorQuantSpec, head_dim: int) -> tuple:
    """Trailing shape of the metadata of one head vector."""
    if spec.method == "turbo":
        return (1,)
    return (head_dim // spec.resolved_group_size(head_dim), 2)


def encode(x: torch.Tensor, spec: TensorQuantSpec):
    """Quantize ``x [..., D]`` per ``spec``; returns unpacked ``codes [..., D]`` and ``meta``."""
    if spec.method == "affine":
        return affine_quantize(x, spec.bits, spec.resolved_group_size(x.shape[-1]), spec.clip_percentile,
                               spec.metadata_dtype)
    return turbo_quantize(x, spec.bits, spec.seed, spec.metadata_dtype, spec.rescale_norm)


def decode(codes: torch.Tensor, meta: torch.Tensor, spec: TensorQuantSpec, dtype: torch.dtype) -> torch.Tensor:
    """Inverse of :func:`encode` for unpacked codes."""
    if spec.method == "affine":
        return affine_dequantize(codes, meta, dtype)
    return turbo_dequantize(codes, meta, spec.bits, spec.seed, dtype)


def quantize_kv(x: torch.Tensor, config: Optional[KVQuantConfig] = None, *, role: str = "k") -> QuantizedKV:
    """Quantize a K (``role="k"``) or V (``role="v"``) tensor ``[..., D]`` — e.g. a cache ``[B, H, S, D]``.

    Args:
        x: float16, bfloat16, float32 or float64 tensor on any device; head_dim last.
        config: a :class:`~turboquant.KVQuantConfig` (default: ``KVQuantConfig()``).
        role: which of ``config``'s bit widths applies (``k_bits`` or ``v_bits``).

    Returns:
        A :class:`QuantizedKV`; ``dequantize_kv`` of it has ``x``'s shape and dtype.

    Raises:
        ValueError: if ``x``'s dtype, head_dim or group size cannot be quantized.
    """
    config = KVQuantConfig() if config is None else config
    spec = config.spec(role)
    if x.dtype not in _FLOAT_DTYPES:
        raise ValueError(f"x.dtype={x.dtype} is not supported; allowed: "
                         f"{', '.join(map(str, _FLOAT_DTYPES))}")
    if x.dim() < 1 or x.shape[-1] == 0:
        raise ValueError(f"x.shape={tuple(x.shape)} has no head_dim to quantize along")
    d = x.shape[-1]
    spec.check_head_dim(d)
    codes, meta = encode(x, spec)
    nonfinite = (~torch.isfinite(x)).sum()
    return QuantizedKV(codes=pack_codes(codes, spec.bits), meta=meta, spec=spec, head_dim=d,
                       dtype=x.dtype, nonfinite=nonfinite)


def dequantize_kv(packed: QuantizedKV, dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """Decode a :class:`QuantizedKV` to a dense tensor (``packed.dtype`` unless ``dtype`` is given)."""
    return decode(packed.unpacked_codes(), packed.meta, packed.spec, packed.dtype if dtype is None else dtype)
