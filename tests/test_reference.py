"""The attention oracle: dense semantics = SDPA; folded form = dequantized form."""

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st

from conftest import BITS, HEAD_DIMS, METHODS
from turboquant import KVQuantConfig, folded_attention, quantize_kv, reference_attention


def _qkv(b, hq, hkv, L, S, d, seed, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, hq, L, d, generator=g).to(dtype)
    k = torch.randn(b, hkv, S, d, generator=g).to(dtype)
    v = torch.randn(b, hkv, S, d, generator=g).to(dtype)
    return q, k, v


def _masks(b, hq, L, S, seed):
    g = torch.Generator().manual_seed(seed)
    keep = torch.rand(b, 1, L, S, generator=g) > 0.3
    keep[..., 0] = True
    additive = torch.randn(b, hq, L, S, generator=g, dtype=torch.float64)
    return {"none": None, "bool": keep, "additive": additive}


@pytest.mark.parametrize("gqa", [1, 4, 8])
@pytest.mark.parametrize("mask", ["none", "bool", "additive", "causal"])
def test_dense_reference_is_sdpa(gqa, mask):
    b, hkv, L, S, d = 2, 2, 5, 19, 64
    q, k, v = (t.double() for t in _qkv(b, hkv * gqa, hkv, L, S, d, seed=gqa))
    m = None if mask == "causal" else _masks(b, hkv * gqa, L, S, 0)[mask]
    causal = mask == "causal"
    expect = F.scaled_dot_product_attention(q, k, v, attn_mask=m, is_causal=causal, scale=0.3, enable_gqa=True)
    got = reference_attention(q, k, v, attn_mask=m, is_causal=causal, scale=0.3)
    torch.testing.assert_close(got, expect, atol=1e-12, rtol=1e-12)


def test_fully_masked_rows_give_zeros():
    q, k, v = (t.double() for t in _qkv(1, 2, 2, 3, 7, 64, seed=1))
    keep = torch.ones(1, 1, 3, 7, dtype=torch.bool)
    keep[..., 1, :] = False
    out = reference_attention(q, k, v, attn_mask=keep)
    assert torch.equal(out[:, :, 1], torch.zeros_like(out[:, :, 1]))
    assert bool(torch.isfinite(out).all())


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("bits", BITS)
@pytest.mark.parametrize("mask", ["none", "bool", "additive", "causal"])
def test_folded_equals_dequantized(method, bits, mask):
    b, hq, hkv, L, S, d = 2, 8, 2, 3, 21, 128
    q, k, v = _qkv(b, hq, hkv, L, S, d, seed=bits)
    cfg = KVQuantConfig(method=method, bits=bits, group_size=32 if method == "affine" and bits == 3 else None)
    kq, vq = quantize_kv(k, cfg, role="k"), quantize_kv(v, cfg, role="v")
    m = None if mask == "causal" else _masks(b, hq, L, S, 1)[mask]
    ref = reference_attention(q, kq, vq, attn_mask=m, is_causal=mask == "causal")
    fold = folded_attention(q, kq, vq, attn_mask=m, is_causal=mask == "causal")
    torch.testing.assert_close(fold, ref, atol=1e-10, rtol=0)


@given(method=st.sampled_from(METHODS), k_bits=st.sampled_from(BITS), v_bits=st.sampled_from(BITS),
       d=st.sampled_from(HEAD_DIMS), b=st.sampled_from([1, 2, 17]), gqa=st.sampled_from([1, 4, 8]),
       L=st.integers(1, 4), S=st.integers(1, 33), scale=st.sampled_from([None, 0.05]),
       dtype=st.sampled_from([torch.float32, torch.bfloat16]), seed=st.integers(0, 2**31 - 1))
def test_folded_equals_dequantized_property(method, k_bits, v_bits, d, b, gqa, L, S, scale, dtype, seed):
    hkv = 1 if b == 17 else 2
    q, k, v = _qkv(b, hkv * gqa, hkv, L, S, d, seed, dtype)
    cfg = KVQuantConfig(method=method, bits=4, k_bits=k_bits, v_bits=v_bits)
    kq, vq = quantize_kv(k, cfg, role="k"), quantize_kv(v, cfg, role="v")
    ref = reference_attention(q, kq, vq, scale=scale)
    torch.testing.assert_close(folded_attention(q, kq, vq, scale=scale), ref, atol=1e-10, rtol=0)


@pytest.mark.parametrize("method", METHODS)
def test_attention_error_is_what_the_bits_allow(method):
    """Relative error of quantized attention vs unquantized falls ~2x per extra bit (4x per 2 bits)."""
    q, k, v = _qkv(2, 8, 2, 4, 256, 128, seed=5)
    exact = reference_attention(q, k, v)
    errs = {}
    for bits in BITS:
        cfg = KVQuantConfig(method=method, bits=bits)
        out = folded_attention(q, quantize_kv(k, cfg), quantize_kv(v, cfg, role="v"))
        errs[bits] = float((out - exact).norm() / exact.norm())
    assert errs[8] < 1e-2
    assert errs[2] > errs[3] > errs[4] > errs[8]
    assert errs[4] < errs[2] / 3


def test_shape_errors():
    q, k, v = _qkv(1, 3, 2, 1, 4, 64, seed=0)
    with pytest.raises(ValueError, match="multiple of the KV heads"):
        reference_attention(q, k, v)
    q, k, v = _qkv(1, 2, 2, 1, 4, 64, seed=0)
    with pytest.raises(ValueError, match="not both"):
        reference_attention(q, k, v, attn_mask=torch.ones(1, 4, dtype=torch.bool), is_causal=True)
