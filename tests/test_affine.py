"""Affine numerics: the half-step bound, clipping, degenerate groups, non-finite inputs."""

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from conftest import BITS, HEAD_DIMS
from turboquant import KVQuantConfig, dequantize_kv, quantize_kv
from turboquant.quant.affine import affine_quantize, affine_quantize_packed, metadata_word_dtype
from turboquant.quant.packing import pack_codes

DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _steps(packed, d):
    """Per-element quantization step (the stored scale) and zero point, broadcast to [..., D]."""
    m = packed.meta.to(torch.float64)
    g = d // m.shape[-2]
    return m[..., 0].repeat_interleave(g, -1), m[..., 1].repeat_interleave(g, -1)


@given(bits=st.sampled_from(BITS), d=st.sampled_from(HEAD_DIMS), group=st.sampled_from([None, 32, 64, 128]),
       dtype=st.sampled_from(DTYPES), rows=st.integers(1, 17), magnitude=st.sampled_from([1e-3, 1.0, 30.0]),
       offset=st.sampled_from([0.0, 0.5, -2.0]), meta=st.sampled_from(["float16", "bfloat16", "float32"]),
       seed=st.integers(0, 2**31 - 1))
def test_error_at_most_half_a_step(bits, d, group, dtype, rows, magnitude, offset, meta, seed):
    if group is not None and d % group:
        group = None
    x = (torch.randn(rows, 3, d, generator=torch.Generator().manual_seed(seed)) * magnitude + offset * magnitude)
    x = x.to(dtype)
    packed = quantize_kv(x, KVQuantConfig(bits=bits, group_size=group, metadata_dtype=meta))
    xh = dequantize_kv(packed, torch.float64)
    step, zero = _steps(packed, d)
    err = (xh - x.to(torch.float64)).abs()
    # half a step, plus the float32 rounding of x / s and s * (q - z) (a few ulps of x)
    assert bool((err <= step / 2 + 4 * 2.0**-24 * x.to(torch.float64).abs()).all()), float((err / step).max())
    qmax = (1 << bits) - 1
    assert bool(((zero >= 0) & (zero <= qmax) & (zero == zero.round())).all())
    codes = packed.unpacked_codes()
    assert int(codes.max()) <= qmax
    assert dequantize_kv(packed).dtype == dtype and dequantize_kv(packed).shape == x.shape


@pytest.mark.parametrize("bits", BITS)
def test_error_shrinks_with_bits_like_the_step(bits):
    x = torch.randn(512, 128, generator=torch.Generator().manual_seed(1))
    mse = ((dequantize_kv(quantize_kv(x, KVQuantConfig(bits=bits))) - x) ** 2).mean()
    rng = (x.amax(-1) - x.amin(-1)).mean()
    step = rng / ((1 << bits) - 1)
    # uniform rounding error: step^2 / 12 (the extension of the range to 0 costs nothing here)
    assert 0.8 * step**2 / 12 < mse < 1.2 * step**2 / 12


def test_rounding_is_half_to_even():
    # group [-1, 2] at 2 bits: scale exactly 1 in float32, zero 1; 0.5 -> 0, 1.5 -> 2
    x = torch.tensor([[-1.0, 0.5, 1.5, 2.0]])
    codes, meta = affine_quantize(x, 2, 4, None, torch.float32)
    assert meta[0, 0, 0].item() == pytest.approx(1.0, rel=1e-6) and meta[0, 0, 1].item() == 1
    assert (codes[0].long() - 1).tolist() == [-1, 0, 2, 2]


def test_clip_percentile_saturates_outliers_and_tightens_the_rest():
    g = torch.Generator().manual_seed(2)
    x = torch.randn(256, 128, generator=g)
    x[:, 5] = 40.0  # one outlier per group
    plain = quantize_kv(x, KVQuantConfig(bits=4))
    clipped = quantize_kv(x, KVQuantConfig(bits=4, clip_percentile=99.0))
    inlier = torch.ones_like(x, dtype=torch.bool)
    inlier[:, 5] = False
    err = lambda p: (dequantize_kv(p) - x)[inlier].pow(2).mean()  # noqa: E731
    assert err(clipped) < err(plain) / 20
    t = torch.quantile(x.abs(), 0.99, dim=-1, keepdim=True)
    step, _ = _steps(clipped, 128)
    xh = dequantize_kv(clipped, torch.float64)
    inside = x.abs() <= t
    assert bool(((xh - x.double()).abs()[inside] <= step[inside] / 2 * (1 + 1e-6)).all())
    assert bool((xh[:, 5] <= t[:, 0].double() + step[:, 5]).all())  # outliers saturate at the clip


def test_degenerate_groups_are_exact():
    x = torch.zeros(2, 3, 64)
    x[1, 0] = 3.25  # constant positive group
    x[1, 1] = -7.5  # constant negative group
    for bits in BITS:
        xh = dequantize_kv(quantize_kv(x, KVQuantConfig(bits=bits, metadata_dtype=torch.float32)))
        torch.testing.assert_close(xh, x, rtol=1e-6, atol=0)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
@pytest.mark.parametrize("bits", BITS)
def test_non_finite_elements_do_not_poison_their_group(bad, bits):
    g = torch.Generator().manual_seed(3)
    x = torch.randn(4, 2, 96, generator=g)
    poisoned = x.clone()
    poisoned[0, 1, 7] = bad
    poisoned[3, 0, 0] = bad
    poisoned[3, 0, 95] = bad
    cfg = KVQuantConfig(bits=bits, group_size=32)
    clean = x.clone()
    clean[torch.isnan(poisoned) | torch.isinf(poisoned)] = 0.0
    a, b = quantize_kv(poisoned, cfg), quantize_kv(clean, cfg)
    assert torch.equal(a.codes, b.codes) and torch.equal(a.meta, b.meta)
    assert int(a.nonfinite) == 3 and int(b.nonfinite) == 0
    xh = dequantize_kv(a)
    assert bool(torch.isfinite(a.meta).all()) and bool(torch.isfinite(xh).all())
    assert xh[0, 1, 7] == 0 and xh[3, 0, 0] == 0 and xh[3, 0, 95] == 0  # documented: decodes to exactly 0


def test_huge_values_saturate_the_fp16_scale_instead_of_overflowing():
    x = torch.tensor([[-3e38, 3e38] + [0.0] * 62])
    p = quantize_kv(x, KVQuantConfig(bits=8))
    assert bool(torch.isfinite(p.meta).all())
    assert bool(torch.isfinite(dequantize_kv(p)).all())


@given(bits=st.sampled_from(BITS), d=st.sampled_from(HEAD_DIMS), dtype=st.sampled_from(DTYPES + (torch.float64,)),
       rows=st.integers(1, 17), magnitude=st.sampled_from([1e-3, 1.0, 3e4, 1e6]),
       meta=st.sampled_from(["float16", "bfloat16", "float32"]), poison=st.sampled_from([None, "nan", "inf", "zero"]),
       seed=st.integers(0, 2**31 - 1))
def test_packed_form_is_the_oracle_bit_for_bit(bits, d, dtype, rows, magnitude, meta, poison, seed):
    """The form the cache write compiles to one kernel from: the oracle's codes, packed, and its
    (scale, zero) pair as one integer word per row — on NaN/Inf, zero and saturating rows too."""
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(rows, 3, d, generator=g, dtype=torch.float64) * magnitude).to(dtype)
    if poison == "zero":
        x[0] = 0
    elif poison is not None:
        x[0, 0, 1] = float(poison)
        x[-1, -1, -1] = -float(poison)
    md = getattr(torch, meta)
    codes, pair = affine_quantize(x, bits, d, None, md)
    packed, word = affine_quantize_packed(x, bits, md)
    assert word.dtype == metadata_word_dtype(md) and word.shape == (rows, 3, 1)
    assert torch.equal(packed, pack_codes(codes, bits))
    assert torch.equal(word.view(md), pair.reshape(rows, 3, 2))
