"""The public round trip: quantize_kv / dequantize_kv / QuantizedKV.nbytes."""

import pytest
import torch

from conftest import BITS, METHODS
from turboquant import KVQuantConfig, QuantizedKV, dequantize_kv, quantize_kv


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("bits", BITS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_shape_dtype_and_bytes(method, bits, dtype):
    b, h, s, d = 17, 3, 9, 128  # batch 17, odd sequence length
    x = torch.randn(b, h, s, d).to(dtype)
    packed = quantize_kv(x, KVQuantConfig(method=method, bits=bits))
    assert isinstance(packed, QuantizedKV)
    assert packed.shape == x.shape and packed.codes.dtype == torch.uint8
    y = dequantize_kv(packed)
    assert y.shape == x.shape and y.dtype == dtype
    meta_per_vector = 2 * 2 if method == "affine" else 2  # fp16 (scale, zero) per group / fp16 norm
    assert packed.nbytes == b * h * s * (d * bits // 8 + meta_per_vector)
    assert packed.nbytes < x.numel() * 2 * (bits + 0.5) / 16  # less than bf16 by the ratio the bits promise


def test_group_size_adds_metadata():
    x = torch.randn(1, 2, 5, 128)
    cfg = KVQuantConfig(bits=4, group_size=32, metadata_dtype="float32")
    p = quantize_kv(x, cfg)
    assert p.meta.shape == (1, 2, 5, 4, 2) and p.meta.dtype == torch.float32
    assert p.nbytes == 10 * (64 + 4 * 2 * 4)


def test_roles_pick_their_bits():
    x = torch.randn(2, 64)
    cfg = KVQuantConfig(bits=3, k_bits=8)
    assert quantize_kv(x, cfg, role="k").spec.bits == 8
    assert quantize_kv(x, cfg, role="v").spec.bits == 3
    assert quantize_kv(x, cfg, role="v").codes.shape[-1] == 24


def test_default_config_and_device_of_outputs():
    x = torch.randn(4, 64)
    p = quantize_kv(x)
    assert p.spec.method == "affine" and p.spec.bits == 4
    assert p.codes.device == x.device and p.nonfinite.dim() == 0
