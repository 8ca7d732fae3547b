"""TurboQuant numerics: rotation, Lloyd–Max codebooks, MSE against the scalar optimum."""

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from conftest import BITS, HEAD_DIMS
from turboquant import KVQuantConfig, dequantize_kv, quantize_kv
from turboquant.quant.codebooks import codebook_mse, lloyd_max_codebook
from turboquant.quant.turbo import (_round_fp16, level_polynomial, level_unit, turbo_centroids, turbo_codebook_mse,
                                    turbo_rotate)
from turboquant.quant.rotation import rotation_matrix

# Lloyd–Max MSE of a rotated unit vector at d = 128 (the targets: within 5%)
TARGET_MSE_D128 = {2: 0.122, 3: 0.0356, 4: 0.0098}


def _unit(n, d, seed):
    x = torch.randn(n, d, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    return x / x.norm(dim=-1, keepdim=True)


@pytest.mark.parametrize("d", HEAD_DIMS)
def test_rotation_is_orthogonal_and_deterministic(d):
    r = rotation_matrix(d, seed=7)
    torch.testing.assert_close(r @ r.T, torch.eye(d, dtype=torch.float64), atol=1e-12, rtol=0)
    assert torch.equal(r, rotation_matrix(d, seed=7))
    assert not torch.equal(r, rotation_matrix(d, seed=8))


def test_hadamard_for_powers_of_two():
    r = rotation_matrix(128, seed=0) * math.sqrt(128)
    torch.testing.assert_close(r.abs(), torch.ones(128, 128, dtype=torch.float64), atol=1e-12, rtol=0)


def test_codebook_matches_the_known_lloyd_max_values():
    # d -> infinity is the Gaussian: Lloyd–Max MSE 0.3634 / 0.1175 / 0.03454 / 0.009497 at 1..4 bits
    for bits, gauss in zip((1, 2, 3, 4), (0.3634, 0.1175, 0.03454, 0.009497)):
        assert codebook_mse(4096, bits) == pytest.approx(gauss, rel=2e-3)
    assert codebook_mse(128, 2) == pytest.approx(0.1160, rel=2e-3)
    assert codebook_mse(128, 3) == pytest.approx(0.0339, rel=3e-3)
    assert codebook_mse(128, 4) == pytest.approx(0.0093, rel=3e-3)
    # Panter–Dite: at 8 bits the optimum is close to (1/12)(∫p^(1/3))^3 4^-8 ≈ 2.72·4^-8 for a normal
    assert codebook_mse(128, 8) < 2.72 * 4.0**-8


@pytest.mark.parametrize("bits", BITS)
def test_codebook_sorted_and_symmetric(bits):
    c = lloyd_max_codebook(96, bits)
    assert c.numel() == 1 << bits
    assert bool((c[1:] > c[:-1]).all())
    torch.testing.assert_close(c, -c.flip(0), atol=0, rtol=0)


@pytest.mark.parametrize("bits", (2, 3, 4))
def test_turbo_mse_within_5pct_of_lloyd_max_d128(bits):
    x = _unit(20000, 128, seed=bits)
    xh = dequantize_kv(quantize_kv(x, KVQuantConfig(method="turbo", bits=bits)))
    mse = float(((x - xh) ** 2).sum(-1).mean())
    assert mse <= TARGET_MSE_D128[bits]
    assert mse == pytest.approx(turbo_codebook_mse(128, bits), rel=0.03)  # the levels stored (a polynomial's)
    assert mse <= 1.05 * codebook_mse(128, bits)  # 2-bit: the uniform grid's 1.1% and the rescaled norm's 2%


@pytest.mark.parametrize("d", HEAD_DIMS)
@pytest.mark.parametrize("bits", BITS)
def test_turbo_mse_near_optimum_every_head_dim(d, bits):
    x = _unit(4000, d, seed=d + bits)
    xh = dequantize_kv(quantize_kv(x, KVQuantConfig(method="turbo", bits=bits, metadata_dtype="float32")))
    mse = float(((x - xh) ** 2).sum(-1).mean())
    assert mse == pytest.approx(turbo_codebook_mse(d, bits), rel=0.08)


def test_round_fp16_is_one_rounding_to_nearest_even():
    import numpy as np

    gen = torch.Generator().manual_seed(0)
    x = torch.cat([torch.randn(20000, generator=gen, dtype=torch.float64) * 10 ** e for e in (-6, -3, 0, 3)])
    ties = torch.arange(-3000, 3000, dtype=torch.float64) * 2.0 ** -12  # halfway between fp16 numbers near 1
    for v in (x, ties, torch.zeros(1, dtype=torch.float64)):
        assert torch.equal(_round_fp16(v), torch.from_numpy(v.numpy().astype(np.float16).astype(np.float64)))


@pytest.mark.parametrize("bits, degree, mse_bound", [(2, 1, 1.012), (3, 3, 1.0025), (4, 3, 1.02), (8, 7, 1.05)])
@pytest.mark.parametrize("d", HEAD_DIMS + (3, 16))
def test_computed_levels_are_the_polynomial_in_fp16_and_near_lloyd_max(d, bits, degree, mse_bound):
    """2/3/4/8-bit levels are the level polynomial's values as fp16 operations give them (numpy's fp16 here:
    an fma is exact in float64, then one rounding), odd, increasing, and their MSE within ``mse_bound`` of the
    Lloyd–Max codebook's; what the quantizer searches (its boundaries) are their midpoints times the level unit.
    The kernel's first fma makes ``u`` from the code's fp16 number exactly at every field position; then ``y =
    u·u + k0``, Horner's rule in ``y`` from ``y`` itself, times ``u`` (the depressed monic form: ``degree/2``
    numbers). 2-bit's grid (degree 1) is ``u`` itself, exactly uniform. At head_dim 3 (uniform coordinates, so
    Lloyd–Max's levels are a uniform grid) every width falls back to degree 1."""
    import numpy as np

    from turboquant.quant.turbo import POLYNOMIAL_LEVELS, _level_boundaries, level_polynomial, level_unit, row_grid

    assert POLYNOMIAL_LEVELS[bits] == degree and set(POLYNOMIAL_LEVELS) == {2, 3, 4, 8}
    if row_grid(d, bits):
        pytest.skip("a grid of each row's own: test_eight_bit_rows_up_to_head_dim_128_are_a_grid_of_their_own")
    n = 1 << bits
    ks = level_polynomial(d, bits)
    assert len(ks) == (degree // 2 if d > 3 else 0) and all(float(np.float16(k)) == k for k in ks)
    assert level_unit(d, bits) > 0
    f16 = lambda v: np.asarray(v, dtype=np.float64).astype(np.float16)  # noqa: E731
    for at in range(1, 11 - bits):  # the code's field at bit `at` of the fp16 number
        x = f16(1024 + 2.0 ** (at - 1) * (2 * np.arange(n) + 1))
        u = f16(x.astype(np.float64) * 2.0 ** (1 - at - bits) - (2.0 ** (11 - at - bits) + 1))
        assert np.array_equal(u.astype(np.float64), (2 * np.arange(n) + 1) / n - 1)
    want = u
    if ks:
        p = y = f16(u.astype(np.float64) ** 2 + ks[0])
        for k in ks[1:]:
            p = f16(p.astype(np.float64) * y + k)
        want = p * u  # float16 * float16 in numpy: one rounding
    want = torch.from_numpy(want.astype(np.float64))
    levels = turbo_centroids(d, bits)
    assert torch.equal(levels, want)
    assert torch.equal(levels, -levels.flip(0)) and bool((levels[1:] > levels[:-1]).all())
    if degree == 1:
        assert len(set(torch.diff(levels).tolist())) == 1
    z_levels = levels * (level_unit(d, bits) * d ** 0.5)  # the boundaries are in z's units
    assert torch.equal(_level_boundaries(d, bits), (z_levels[1:] + z_levels[:-1]) / 2)
    ratio = turbo_codebook_mse(d, bits) / codebook_mse(d, bits)
    assert 0.99 < ratio < mse_bound, ratio  # (at head_dim 3 the two are within 1e-5)


@pytest.mark.parametrize("d", [16, 64, 80, 128])
def test_eight_bit_rows_up_to_head_dim_128_are_a_grid_of_their_own(d):
    """8-bit codes of head_dim ≤ 128 are a uniform grid over each row's own range: the table is ``u_c = (c −
    127.5)/128`` (degree 1, exact in fp16), the row's largest coordinates take the end codes, every coordinate lies
    within half a step of its level (the plain norm carries the step), the rescaled norm keeps ``‖x‖``, and the
    MSE is ``turbo_codebook_mse``'s, below the degree-7 polynomial's there and above it at head_dim 256, where the
    polynomial stays."""
    from turboquant.quant.codebooks import code_offsets, levels_mse
    from turboquant.quant.turbo import _polynomial_levels, _row_grid_mse, _level_form, row_grid, turbo_quantize

    assert row_grid(d, 8) and not row_grid(256, 8) and not row_grid(d, 4)
    assert level_polynomial(d, 8) == () and torch.equal(turbo_centroids(d, 8), code_offsets(8))
    x = _unit(4000, d, seed=d + 1000)  # (seed d draws the rotation's own Gaussians at head_dim 80: rows along R's)
    codes, meta = turbo_quantize(x, 8, 0, torch.float32, rescale_norm=False)
    z = turbo_rotate(x.double(), 0) * d ** 0.5
    ends = z.abs().argmax(-1, keepdim=True)
    assert set(codes.gather(-1, ends).unique().tolist()) <= {0, 255}
    step = z.abs().amax(-1, keepdim=True) / 127.5
    y = (codes.double() - 127.5) * step / d ** 0.5  # the row's grid, in the unit vector's coordinates
    assert float((y / d ** -0.5 - z).abs().div(step).max()) <= 0.5 + 1e-5
    torch.testing.assert_close(turbo_centroids(d, 8)[codes.long()] * meta.double(), y, rtol=1e-6, atol=1e-12)
    kept = dequantize_kv(quantize_kv(x * 3, KVQuantConfig(method="turbo", bits=8, metadata_dtype="float32")))
    torch.testing.assert_close(kept.norm(dim=-1), (x * 3).norm(dim=-1), rtol=1e-5, atol=0)
    mse = float(((y - turbo_rotate(x.double(), 0)) ** 2).sum(-1).mean())
    assert mse == pytest.approx(turbo_codebook_mse(d, 8), rel=0.03)

    def polynomial(n):  # the degree-7 levels' MSE
        ks, unit = _level_form(n, 8)
        return levels_mse(n, _polynomial_levels(8, ks) * unit * n ** 0.5)

    assert turbo_codebook_mse(d, 8) < polynomial(d)
    assert polynomial(256) == pytest.approx(turbo_codebook_mse(256, 8))
    for n in HEAD_DIMS:  # ROW_GRID_HEAD_DIMS: the grid wherever it has the smaller error
        assert row_grid(n, 8) == (_row_grid_mse(n, 8) < polynomial(n)), n


@given(d=st.sampled_from(HEAD_DIMS), bits=st.sampled_from(BITS), rows=st.integers(1, 17),
       dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float16]),
       magnitude=st.sampled_from([1e-2, 1.0, 50.0]), seed=st.integers(0, 2**31 - 1))
def test_turbo_is_scale_invariant_and_keeps_shape(d, bits, rows, dtype, magnitude, seed):
    x = torch.randn(rows, d, generator=torch.Generator().manual_seed(seed)).to(dtype)
    cfg = KVQuantConfig(method="turbo", bits=bits, metadata_dtype="float32")
    a = quantize_kv(x, cfg)
    b = quantize_kv((x.double() * 4.0).to(dtype), cfg)  # a power of two: exact in every dtype
    assert torch.equal(a.codes, b.codes)
    xh = dequantize_kv(a)
    assert xh.shape == x.shape and xh.dtype == dtype
    rel = ((xh.double() - x.double()).norm(dim=-1) / x.double().norm(dim=-1)).pow(2).mean()
    assert rel < 3 * codebook_mse(d, bits) + 1e-2 * (dtype != torch.float32)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_elements_do_not_poison_the_vector(bad):
    x = torch.randn(3, 128, generator=torch.Generator().manual_seed(4))
    poisoned = x.clone()
    poisoned[1, 17] = bad
    clean = x.clone()
    clean[1, 17] = 0.0
    cfg = KVQuantConfig(method="turbo", bits=4)
    a, b = quantize_kv(poisoned, cfg), quantize_kv(clean, cfg)
    assert torch.equal(a.codes, b.codes) and torch.equal(a.meta, b.meta)
    assert int(a.nonfinite) == 1
    xh = dequantize_kv(a)
    assert bool(torch.isfinite(xh).all())
    torch.testing.assert_close(xh[1].norm(), clean[1].norm(), rtol=2e-3, atol=0)  # the norm of the clean vector
    # documented: it decodes to about 0, within the vector's own quantization error
    assert abs(float(xh[1, 17])) < 4 * float(clean[1].norm()) * math.sqrt(codebook_mse(128, 4) / 128)


def test_zero_vector_decodes_to_zero():
    xh = dequantize_kv(quantize_kv(torch.zeros(2, 64), KVQuantConfig(method="turbo", bits=2)))
    assert torch.equal(xh, torch.zeros(2, 64))


@pytest.mark.parametrize("bits", [2, 3, 4])
def test_rescaled_norm_keeps_the_norm_and_the_paper_norm_shrinks_it(bits):
    x = torch.randn(64, 128, generator=torch.Generator().manual_seed(bits)) * 3
    kept = dequantize_kv(quantize_kv(x, KVQuantConfig(method="turbo", bits=bits, metadata_dtype="float32")))
    torch.testing.assert_close(kept.norm(dim=-1), x.norm(dim=-1), rtol=1e-5, atol=0)
    plain = quantize_kv(x, KVQuantConfig(method="turbo", bits=bits, metadata_dtype="float32", rescale_norm=False))
    unit = level_unit(128, bits)  # what a table level is worth: the stored norm carries it
    torch.testing.assert_close(plain.meta[..., 0], x.norm(dim=-1) * unit, rtol=1e-6, atol=0)
    # Lloyd–Max reconstruction shrinks: ‖ŷ‖² ≈ 1 − D
    shrink = (dequantize_kv(plain).norm(dim=-1) / x.norm(dim=-1)).pow(2).mean()
    assert float(shrink) == pytest.approx(1 - codebook_mse(128, bits), abs=0.02)


def test_rescale_norm_is_turbo_only():
    with pytest.raises(ValueError, match="method=.turbo. only"):
        KVQuantConfig(method="affine", rescale_norm=False)


@given(d=st.sampled_from([32, 64, 80, 128]), bits=st.sampled_from([2, 3, 4, 8]), rows=st.integers(1, 17),
       dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float64]), rescale=st.booleans(),
       poison=st.booleans(), seed=st.integers(0, 2**16))
def test_packed_form_is_the_oracle_encoding(d, bits, rows, dtype, rescale, poison, seed):
    """``turbo_quantize_packed`` (the form a compiled cache write fuses) gives the oracle's codes,
    packed, and its norm up to the rounding of a sum taken in another order."""
    from turboquant.quant.packing import pack_codes
    from turboquant.quant.turbo import turbo_quantize, turbo_quantize_packed

    gen = torch.Generator().manual_seed(seed)
    x = (torch.randn(rows, 3, d, generator=gen) * 4).to(dtype)
    if poison:
        x[0, 1, d // 2] = float("nan")
        x[-1, 0, 0] = float("inf")
    codes, meta = turbo_quantize(x, bits, 0, torch.float16, rescale)
    packed, norm = turbo_quantize_packed(x, bits, 0, torch.float16, rescale)
    assert torch.equal(packed, pack_codes(codes, bits))
    assert norm.shape == meta.shape and norm.dtype == meta.dtype
    rel = ((norm.float() - meta.float()).abs() / meta.float().clamp_min(1e-30)).max()
    assert rel <= 2 ** -10  # one fp16 step at most


@pytest.mark.parametrize("bits", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_codebook_search_is_bucketize_at_and_between_the_boundaries(bits, dtype):
    """The packed form's binary search (table loads) against ``torch.bucketize``: every boundary, its
    neighbours one ulp away, points between, ±inf and NaN (code 0, as the oracle's bucketize)."""
    from turboquant.quant.codebooks import codebook_boundaries
    from turboquant.quant.turbo import _codebook_search

    bounds = codebook_boundaries(128, bits).to(dtype)
    up, down = torch.nextafter(bounds, bounds + 1), torch.nextafter(bounds, bounds - 1)
    mid = (bounds[1:] + bounds[:-1]) / 2
    v = torch.cat([bounds, up, down, mid, torch.tensor([float("inf"), -float("inf"), 0.0, 1e30, -1e30], dtype=dtype)])
    got = _codebook_search(v, bounds)
    assert got.dtype == torch.int32
    assert torch.equal(got.long(), torch.bucketize(v, bounds))
    assert int(_codebook_search(torch.tensor([float("nan")], dtype=dtype), bounds)) == 0
    with pytest.raises(ValueError, match="2\\^bits - 1"):
        _codebook_search(v, torch.cat([bounds, bounds[-1:] + 1]))


@pytest.mark.parametrize("bits,d", [(2, 128), (3, 128), (4, 128), (3, 64), (8, 128)])
def test_compiled_packed_form_is_its_eager_encoding(bits, d):
    """The packed form through Inductor (its C++ backend here; the GPU's Triton schedule compiles the
    same graph): the search's and the rescale's table constants read by computed index give the eager
    codes, and the norm up to a sum's order."""
    from turboquant.quant.turbo import turbo_quantize_packed

    torch._dynamo.reset()
    x = (torch.randn(9, 8, d, generator=torch.Generator().manual_seed(bits * d)) * 3).to(torch.bfloat16)
    x[2, 3, 7] = float("nan")
    x[4, 0, 1] = float("-inf")
    eager = turbo_quantize_packed(x, bits, 0, torch.float16)
    compiled = torch.compile(turbo_quantize_packed, fullgraph=True)(x, bits, 0, torch.float16)
    assert torch.equal(compiled[0], eager[0])
    assert ((compiled[1].float() - eager[1].float()).abs() / eager[1].float().clamp_min(1e-30)).max() <= 2 ** -10


@given(logd=st.integers(0, 8), rows=st.integers(1, 9), dtype=st.sampled_from([torch.float32, torch.bfloat16,
                                                                              torch.float16]),
       spread=st.floats(0, 12), seed=st.integers(0, 2**16))
def test_the_reduction_rotation_is_the_matmul_rotation(logd, rows, dtype, spread, seed):
    """The two forms of turbo's rotation (a float64 matmul by the signed Hadamard matrix in eager
    code, a reduction over its signs held as int8 in compiled graphs) give equal results in the
    input's dtype, outliers included: the float64 sums are exact or nearly, then round once."""
    from turboquant.quant.rotation import signed_hadamard

    d = 1 << logd
    gen = torch.Generator().manual_seed(seed)
    x = (torch.randn(rows, d, generator=gen) * torch.exp2(torch.rand(rows, d, generator=gen) * spread)).to(dtype)
    by_matmul = (x.double() @ signed_hadamard(d, seed % 5)).to(dtype)
    signs = signed_hadamard(d, seed % 5, dtype=torch.int8)
    assert torch.equal(signs.double(), signed_hadamard(d, seed % 5))
    by_reduction = (x.double()[..., :, None] * signs).sum(-2).to(dtype)
    assert torch.equal(by_matmul, by_reduction)
