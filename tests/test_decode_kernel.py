"""The Triton decode-attention kernel against the oracle on the same codes.

On CPU it runs under TRITON_INTERPRET=1 on small shapes; the ``gpu`` tests run full sizes.
"""

import pytest
import torch
from conftest import HEAD_DIMS
from hypothesis import given
from hypothesis import strategies as st

from turboquant import KVQuantConfig, dequantize_kv, quantize_kv, reference_attention
from turboquant.quant.affine import metadata_word
from turboquant.quant.turbo import POLYNOMIAL_LEVELS, row_grid
from turboquant.testing import KERNEL_REL_TOL

pytest.importorskip("triton")
from turboquant.templates import code_operands as co  # noqa: E402
from turboquant.templates.decode_attention import MAX_TILE_ROWS, decode_attention, supports  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TOL = KERNEL_REL_TOL


def _case(method, k_bits, v_bits, B, hkv, g, L, S, D, mask, seed, dtype=torch.float32, softcap=0.0, scale=None,
          v_scale=1.0, meta_words=False, q_scale=1.0, q_as=None, **launch):
    # q_as: the query's values in ``dtype``, handed to the kernel in this dtype
    gen = torch.Generator().manual_seed(seed)
    q = (torch.randn(B, hkv * g, L, D, generator=gen) * q_scale).to(dtype).to(q_as or dtype)
    k = torch.randn(B, hkv, S, D, generator=gen) * 2
    v = torch.randn(B, hkv, S, D, generator=gen) * v_scale
    cfg = KVQuantConfig(method=method, bits=4, k_bits=k_bits, v_bits=v_bits)
    kq, vq = quantize_kv(k.to(DEVICE), cfg), quantize_kv(v.to(DEVICE), cfg, role="v")
    m = None
    if mask == "bool":
        m = torch.rand(B, 1, L, S, generator=gen) > 0.3
        m[..., 0] = True
    elif mask == "additive":
        m = torch.randn(B, hkv * g, L, S, generator=gen)
    elif mask == "padded":  # left padding: some keys of batch row 0 masked for every query
        m = torch.ones(B, 1, L, S, dtype=torch.bool)
        m[0, ..., : S // 3] = False
    m = None if m is None else m.to(DEVICE)
    q = q.to(DEVICE)
    def rows_of(meta):  # affine (scale, zero) as float pairs, or as the integer words a cache stores
        if method != "affine":
            return meta
        return metadata_word(meta[..., 0, 0], meta[..., 0, 1]).unsqueeze(-1) if meta_words else meta.flatten(-2)

    out = decode_attention(q, kq.codes, rows_of(kq.meta), vq.codes, rows_of(vq.meta), kq.spec, vq.spec, D,
                           attn_mask=m, is_causal=mask == "causal", scale=scale, softcap=softcap,
                           **({"block_n": 16 if DEVICE == "cpu" else 128} | launch))
    ref = reference_attention(q, kq, vq, attn_mask=m, is_causal=mask == "causal", scale=scale,
                              softcap=softcap or None)
    return out, ref


def _rel(out, ref):
    return float((out.double() - ref).norm() / ref.norm())


@pytest.mark.parametrize("method", ["affine", "turbo"])
@pytest.mark.parametrize("bits", [(8, 8), (4, 4), (3, 3), (2, 2), (8, 4), (4, 3)])
def test_every_bit_width(method, bits):
    out, ref = _case(method, *bits, B=2, hkv=2, g=4, L=1, S=45, D=64, mask=None, seed=sum(bits))
    assert _rel(out, ref) < TOL


@pytest.mark.parametrize("bits", [8, 4, 2])
def test_one_split_over_a_long_context(bits):
    # thousands of keys accumulated by one program: an offset carried through the value sums
    # (e.g. codes biased by 1024) cancels catastrophically here and nowhere in the short cases
    out, ref = _case("affine", bits, bits, B=1, hkv=1, g=4, L=1, S=3000, D=64, mask=None, seed=bits,
                     block_n=128, num_splits=1)
    assert _rel(out, ref) < TOL


@pytest.mark.parametrize("num_splits", [1, 3])  # one split normalises in place; more go through the merge
@pytest.mark.parametrize("mask", ["bool", "additive", "padded", "causal"])
def test_masks(mask, num_splits):
    out, ref = _case("affine", 4, 4, B=2, hkv=1, g=4, L=3, S=33, D=64, mask=mask, seed=3, num_splits=num_splits)
    assert _rel(out, ref) < TOL


@pytest.mark.parametrize("num_splits", [1, 2])
@pytest.mark.parametrize("L", [5, 8])
def test_more_query_rows_than_one_tile(L, num_splits):
    # 8 query heads x 5 or 8 positions: 40 or 64 rows, two row tiles (one tile of 64 rows made
    # Triton pick wgmma, which hit an illegal address on the H200)
    assert MAX_TILE_ROWS < 8 * L
    out, ref = _case("affine", 8, 3, B=2, hkv=2, g=8, L=L, S=37, D=64, mask="causal", seed=L, num_splits=num_splits)
    assert _rel(out, ref) < TOL


@pytest.mark.parametrize("D", [80, 96, 128])
def test_head_dims(D):
    out, ref = _case("turbo", 4, 3, B=1, hkv=2, g=2, L=2, S=20, D=D, mask=None, seed=D)
    assert _rel(out, ref) < TOL


@pytest.mark.parametrize("method", ["affine", "turbo"])
@pytest.mark.parametrize("bits", [2, 3, 4])
def test_code_rows_inside_wider_rows(method, bits):
    """Codes that are a view into a wider buffer, each row followed by one or four words of another
    tensor: the alignment the kernel is told to assume (``_code_alignment``: 1 or 4 words) must divide
    every stride, or the rows it reads are the wrong ones."""
    from turboquant.templates import decode_attention as da

    gen = torch.Generator().manual_seed(bits)
    B, hkv, g, S, D = 2, 2, 2, 21, 64
    cfg = KVQuantConfig(method=method, bits=bits)
    q = torch.randn(B, hkv * g, 1, D, generator=gen).to(DEVICE)
    kq = quantize_kv(torch.randn(B, hkv, S, D, generator=gen).to(DEVICE), cfg)
    vq = quantize_kv(torch.randn(B, hkv, S, D, generator=gen).to(DEVICE), cfg, role="v")

    def wider(codes, extra):  # the same codes, each row followed by `extra` bytes of another tensor
        word = 1 if bits == 3 else 2
        buf = torch.full((*codes.shape[:-1], codes.shape[-1] + extra * word), 0x5A, dtype=torch.uint8,
                         device=codes.device)
        buf[..., : codes.shape[-1]] = codes
        return buf[..., : codes.shape[-1]]

    rows_last = (lambda t: t.flatten(-2)) if method == "affine" else (lambda t: t)
    for extra in (1, 4):
        kc, vc = wider(kq.codes, extra), wider(vq.codes, extra)
        word = torch.uint8 if bits == 3 else torch.int16
        assert da._code_alignment(da.strides_as(kc, word), word) == extra
        out = decode_attention(q, kc, rows_last(kq.meta), vc, rows_last(vq.meta), kq.spec, vq.spec, D,
                               block_n=16 if DEVICE == "cpu" else 128)
        assert _rel(out, reference_attention(q, kq, vq)) < TOL


@pytest.mark.parametrize("method", ["affine", "turbo"])
@pytest.mark.parametrize("bits", [8, 4, 3])
@pytest.mark.parametrize("layout", ["cache", "gaps", "run-time"])
def test_the_cache_buffers_with_and_without_gaps_between_rows(method, bits, layout, metadata_dtype=torch.float16):
    """The buffers a cache holds: rows back to back, whose strides the kernel compiles in
    (``dense_row_stride``), affine (scale, zero) pairs as one integer word a row, read one load a pair
    (``metadata_pairs``); the same rows each followed by another tensor's element (run-time strides);
    and the cache's rows read as before either (``constant_rows=False``)."""
    from turboquant.cache import QuantizedCacheTensor
    from turboquant.templates import decode_attention as da

    gen = torch.Generator().manual_seed(bits + 10 * len(layout))
    B, hkv, g, S, D = 2, 2, 4, 37, 64
    cfg = KVQuantConfig(method=method, bits=bits, metadata_dtype=metadata_dtype)
    q = torch.randn(B, hkv * g, 1, D, generator=gen).to(DEVICE)
    k, v = (torch.randn(B, hkv, S, D, generator=gen).to(DEVICE) for _ in range(2))
    kc, vc = QuantizedCacheTensor.from_dense(k, cfg.spec("k")), QuantizedCacheTensor.from_dense(v, cfg.spec("v"))

    def with_gaps(t):  # the same rows, each followed by a 16-bit word's worth of another tensor's elements
        extra = max(1, 2 // t.element_size())
        buf = torch.full((*t.shape[:-1], t.shape[-1] + extra), 0x5A, dtype=t.dtype, device=t.device)
        buf[..., : t.shape[-1]] = t
        return buf[..., : t.shape[-1]]

    buffers = [with_gaps(t) if layout == "gaps" else t for t in (kc.codes, kc.meta, vc.codes, vc.meta)]
    launch = {"constant_rows": False} if layout == "run-time" else {}
    plan = da._make_plan(q, *buffers, kc.spec, vc.spec, None, False, 0.0, 0, D ** -0.5, da._tuning(**launch), False)
    consts = da.split_constants(plan)
    assert all((consts[c] > 0) == (layout == "cache") for c in ("KC_ROW", "KM_ROW", "VC_ROW", "VM_ROW"))
    assert consts["K_PAIR"] == consts["V_PAIR"] == (method == "affine" and layout != "run-time")
    out = decode_attention(q, *buffers, kc.spec, vc.spec, D, block_n=16 if DEVICE == "cpu" else 128, **launch)
    assert _rel(out, reference_attention(q, quantize_kv(k, cfg), quantize_kv(v, cfg, role="v"))) < TOL


@pytest.mark.parametrize("metadata_dtype", [torch.bfloat16, torch.float32])
def test_metadata_words_of_other_widths(metadata_dtype):
    """(scale, zero) words of bf16 halves (int32) and of fp32 halves (int64), read one load a pair."""
    test_the_cache_buffers_with_and_without_gaps_between_rows("affine", 4, "cache", metadata_dtype)


def test_code_alignment_is_what_every_stride_is_a_multiple_of():
    from turboquant.templates import decode_attention as da

    assert da._code_alignment((2 * 32768 * 16, 32768 * 16, 16), torch.int16) == 1  # the JIT's own hint holds
    assert da._code_alignment((2 * 45 * 8, 45 * 8, 8), torch.int16) == 8           # 64-dim 2-bit rows
    assert da._code_alignment((2 * 45 * 24, 45 * 24, 24), torch.uint8) == 8        # 64-dim 3-bit rows
    assert da._code_alignment((2 * 45 * 30, 45 * 30, 30), torch.uint8) == 2        # 80-dim 3-bit rows
    assert da._code_alignment((2 * 9 * 12, 9 * 12, 12), torch.int16) == 4          # 96-dim 2-bit rows
    assert da._code_alignment((0, 45 * 8, 8), torch.int16) == 8                    # a broadcast batch


@pytest.mark.parametrize("num_splits", [1, 3])  # one split normalises in place; more go through the merge
@pytest.mark.parametrize("D", [64, 80])  # the Hadamard form (H from indices) and a dense R
@pytest.mark.parametrize("v_scale", [1e-3, 1e5])
def test_turbo_values_are_rotated_back_in_the_kernel(num_splits, D, v_scale):
    """Each split rotates its turbo output back to the model's dims by fp16 MMAs: values far
    outside fp16's range either way (fp32 model) come back as accurately as unit values."""
    out, ref = _case("turbo", 4, 4, B=1, hkv=1, g=4, L=2, S=40, D=D, mask=None, seed=D, v_scale=v_scale,
                     num_splits=num_splits)
    assert _rel(out, ref) < TOL


@pytest.mark.parametrize("bits, D, g", [((4, 4), 64, 4), ((8, 2), 64, 1), ((3, 3), 32, 8), ((2, 4), 16, 4),
                                        ((8, 8), 128, 2), ((4, 8), 256, 1), ((8, 2), 256, 1)])
@pytest.mark.parametrize("num_splits", [1, 2])
def test_turbo_rotation_plane_by_plane_is_the_matrix_rotation(bits, D, g, num_splits):
    """The Hadamard rotation made plane by plane (in-plane Sylvester matrix from indices, planes
    mixed by butterflies, σ from the table's first row) gives the output of the rotation read as a
    matrix, up to the rounding of the fp16 query; D = 16 and 32 pad planes past the head's dims
    (8 planes of 2 and 4 dims in 16 columns). Mixed widths put keys and values through different
    plane counts; planes of 64 and 128 columns (8-bit rows of D = 128 and 256, 4-bit ones of 256) rotate as
    32-column parts."""
    args = dict(B=2, hkv=2, g=g, L=2, S=37, D=D, mask="padded", seed=D + bits[0], num_splits=num_splits)
    planes, ref = _case("turbo", *bits, plane_hadamard=True, **args)
    matrix, _ = _case("turbo", *bits, plane_hadamard=False, **args)
    assert _rel(planes, matrix.double()) < 1e-4
    assert _rel(planes, ref) < TOL


@pytest.mark.parametrize("bits, D, warps", [((8, 8), 128, 1), ((4, 8), 256, 1), ((8, 2), 256, 4)])
def test_wide_query_rotation_is_the_matrix_rotation(bits, D, warps):
    """The query's plane rotation on parts of up to 64 columns (one-warp programs by default) or of 32 gives the
    rotation read as a matrix: planes of 64 whole, planes of 128 (8-bit keys of D = 256) as halves of 64."""
    args = dict(B=2, hkv=2, g=2, L=1, S=41, D=D, mask="padded", seed=D + bits[1], num_splits=2, num_warps=warps)
    matrix, ref = _case("turbo", *bits, plane_hadamard=False, **args)
    for wide in (True, False):
        out, _ = _case("turbo", *bits, wide_query_rotation=wide, **args)
        assert _rel(out, matrix.double()) < 1e-4, wide
        assert _rel(out, ref) < TOL, wide


@pytest.mark.parametrize("method, bits, D, warps", [("turbo", (3, 3), 128, 2), ("affine", (3, 3), 96, 2),
                                                   ("turbo", (8, 8), 128, 4), ("affine", (8, 4), 64, 4),
                                                   ("turbo", (2, 8), 80, 4), ("affine", (4, 2), 128, 1)])
def test_early_rows_match_the_oracle(method, bits, D, warps):
    """A one-block split's key and value rows loaded before the query's prologue: the same output as loaded
    where they are read (the same codes, the same dots), masked tails included (101 keys in a block of 128)."""
    args = dict(B=2, hkv=2, g=4, L=1, S=101, D=D, mask="padded", seed=D + bits[0], num_splits=1, num_warps=warps,
                block_n=128, row_groups=1)
    late, ref = _case(method, *bits, early_rows=False, **args)
    early, _ = _case(method, *bits, early_rows=True, **args)
    assert _rel(early, late.double()) < 1e-6
    assert _rel(early, ref) < TOL


def test_early_rows_only_where_a_split_is_one_block():
    cfg = KVQuantConfig(method="turbo", bits=3)
    assert _plan_options(cfg, 1024, num_splits=8, block_n=128, early_rows=True)[1]["EARLY_ROWS"]
    assert not _plan_options(cfg, 1024, num_splits=8, block_n=128)[1]["EARLY_ROWS"]
    assert not _plan_options(cfg, 1024, num_splits=1, block_n=128, early_rows=True)[1]["EARLY_ROWS"]


def test_early_rows_default_to_short_affine_three_bit_grids_that_fit():
    # affine 3-bit keys and values, one block a split, one row group, at most 4 programs an SM (the H100 timings)
    from turboquant.templates import decode_attention as da

    a3, t3, a4 = (KVQuantConfig(method=m, bits=b).spec("k") for m, b in (("affine", 3), ("turbo", 3), ("affine", 4)))
    assert da._early_rows(a3, a3, 1, 1, 512, 132) and da._early_rows(a3, a3, 1, 1, 256, 132)
    assert not da._early_rows(a3, a3, 1, 1, 1024, 132)  # 7.8 programs an SM: a second wave at 4 an SM
    assert not da._early_rows(a3, a3, 2, 1, 512, 132) and not da._early_rows(a3, a3, 1, 2, 512, 132)
    assert not da._early_rows(t3, t3, 1, 1, 512, 132) and not da._early_rows(a4, a4, 1, 1, 512, 132)
    assert not da._early_rows(a3, t3, 1, 1, 512, 132)


def test_wide_query_rotation_defaults_to_one_warp_programs():
    cfg = KVQuantConfig(method="turbo", bits=8)
    for S, warps, wide in ((32768, 1, True), (1024, 4, False)):
        options, consts = _plan_options(cfg, S, B=8)
        assert (options["num_warps"], consts["Q_WIDE"]) == (warps, wide), S
    assert not _plan_options(cfg, 32768, B=8, wide_query_rotation=False)[1]["Q_WIDE"]


def _stored_as(x, dtype):
    """fp32 ``x`` rounded to ``dtype`` as the kernel's stores round it: to nearest on the GPU; Triton 3.6's
    interpreter cuts fp32 to bf16 (toward zero)."""
    if DEVICE == "cpu" and dtype == torch.bfloat16:
        return (x.float().view(torch.int32) & -65536).view(torch.float32).to(dtype)
    return x.to(dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("bits, D, g", [((4, 4), 64, 4), ((2, 3), 32, 8), ((8, 2), 16, 1), ((8, 8), 128, 4)])
def test_a_16_bit_query_is_rotated_in_its_own_dtype(dtype, bits, D, g):
    """A bf16 or fp16 query takes its signs and the in-plane Sylvester matrix in its own dtype (the sign bit
    flipped, one exact MMA a plane, the rows and σ in one load), where an fp32 query goes through fp16 halves:
    the same products and fp32 sums, so the two outputs agree to fp32 roundings, for unit queries and for ones
    in fp16's subnormal range (1e-6), and are the oracle's."""
    args = dict(B=2, hkv=2, g=g, L=1, S=37, D=D, mask="padded", seed=D + bits[0], num_splits=2)
    for q_scale in [1.0, 1e-6]:
        native, ref = _case("turbo", *bits, dtype=dtype, q_scale=q_scale, **args)
        wide, _ = _case("turbo", *bits, dtype=dtype, q_scale=q_scale, q_as=torch.float32, **args)
        assert native.dtype == dtype
        assert _rel(native, _stored_as(wide, dtype).double()) < 1e-4
        if DEVICE == "cuda" or dtype != torch.bfloat16:  # the interpreter's cut bf16 is not the oracle's rounding
            assert _rel(native, ref) < TOL


@pytest.mark.parametrize("method, bits", [("affine", (8, 8)), ("affine", (4, 3)), ("turbo", (4, 8))])
@pytest.mark.parametrize("warps", [1, 4])
def test_value_block_sums_match_the_oracle(method, bits, warps):
    # each block's value dots from zero, added to the accumulators in fp32 (block_sums), against the
    # oracle and against the dots accumulated inside the MMA
    args = dict(B=2, hkv=2, g=4, L=1, S=77, D=64, mask="padded", seed=bits[0], num_warps=warps, num_splits=2)
    sums, ref = _case(method, *bits, block_sums=True, **args)
    mma, _ = _case(method, *bits, block_sums=False, **args)
    assert _rel(sums, ref) < TOL
    assert _rel(sums, mma.double()) < 1e-4


@pytest.mark.parametrize("method, bits, keys_major", [("affine", (8, 8), True), ("affine", (4, 4), True),
                                                      ("affine", (4, 2), False), ("turbo", (2, 2), True)])
def test_value_zero_drain_matches_the_oracle(method, bits, keys_major):
    # the values' zero point drained from the MMA accumulators every other block (zero_drain) against the oracle
    # and against the same dots summed per block: the same products and fp32 sums in another order
    args = dict(B=2, hkv=2, g=4, L=1, S=77, D=128 if keys_major else 64, mask="padded", seed=bits[1], num_warps=1,
                num_splits=2, keys_major=keys_major, row_groups=None if keys_major else 1)
    drained, ref = _case(method, *bits, zero_drain=2, block_sums=False, **args)
    sums, _ = _case(method, *bits, block_sums=True, **args)
    assert _rel(drained, ref) < TOL
    assert _rel(drained, sums.double()) < 1e-4
    with pytest.raises(ValueError, match="zero_drain=2"):
        _case(method, *bits, zero_drain=2, block_sums=True, **args)


def test_softcap_scale_bf16_and_length_one():
    out, ref = _case("affine", 8, 4, B=1, hkv=2, g=8, L=1, S=1, D=64, mask=None, seed=9, dtype=torch.bfloat16,
                     softcap=5.0, scale=0.3)
    assert _rel(out, ref) < TOL


@given(method=st.sampled_from(["affine", "turbo"]), k_bits=st.sampled_from([2, 3, 4, 8]),
       v_bits=st.sampled_from([2, 3, 4, 8]), g=st.sampled_from([1, 4, 8]), L=st.integers(1, 8),
       S=st.integers(1, 40), seed=st.integers(0, 2**16), meta_words=st.booleans(), D=st.sampled_from(HEAD_DIMS))
def test_property(method, k_bits, v_bits, g, L, S, seed, meta_words, D):
    # every head_dim: the query rows are split into planes of P·PW columns, past D where planes pad to 16
    out, ref = _case(method, k_bits, v_bits, B=1, hkv=1, g=g, L=L, S=S, D=D, mask=None, seed=seed,
                     meta_words=meta_words)
    assert _rel(out, ref) < TOL


def _run_ptx(asm: str, inputs: list, first_input: int = 2, lanes: int = 1, outputs: int = 2) -> list:
    """The 32-bit instructions of ``asm`` (``and``/``or``/``shr``/``shl``/``lop3``/``mov``/``mul.lo``/``mad.lo``,
    ``fma.rn``/``mul.rn`` on ``f16x2``, default-mode ``prmt``, whose selector nibble's bit 3 sign-fills the byte, ``%laneid`` and
    ``shfl.sync.idx`` with a clamp of 31, which reads bits 0–4 of its lane operand) on ``inputs``
    (``$first_input``, …), in each of ``lanes`` lanes of a warp; returns ``$0`` … ``$(outputs − 1)``, a value
    each for one lane, else a list over the lanes. An input is a value for every lane or a list of one
    per lane."""
    import re

    import numpy as np

    regs = {f"${i + first_input}": v if isinstance(v, list) else [v] * lanes for i, v in enumerate(inputs)}
    regs["%laneid"] = list(range(lanes))

    def value(x):
        return regs[x] if x in regs else [int(x, 0)] * lanes

    def prmt(a, b, sel):
        pool = [(a >> (8 * i)) & 0xFF for i in range(4)] + [(b >> (8 * i)) & 0xFF for i in range(4)]
        out = 0
        for k in range(4):
            nib = (sel >> (4 * k)) & 0xF
            byte = pool[nib & 7]
            out |= ((0xFF if byte & 0x80 else 0) if nib & 8 else byte) << (8 * k)
        return out

    def halves(x):  # the two fp16 numbers of a register, as float64
        return np.array([x & 0xFFFF, x >> 16], dtype=np.uint16).view(np.float16).astype(np.float64)

    def f16x2(v):  # float64 pair rounded once to fp16 (numpy converts float64 directly), packed
        h = v.astype(np.float16).view(np.uint16)
        return int(h[0]) | int(h[1]) << 16

    def lop3(a, b, c, lut):  # bit i of the result: bit (a_i b_i c_i) of lut, a the high index bit
        out = 0
        for i in range(8):
            if lut >> i & 1:
                out |= (a if i & 4 else ~a) & (b if i & 2 else ~b) & (c if i & 1 else ~c)
        return out

    ops = {"and.b32": lambda x: x[0] & x[1], "or.b32": lambda x: x[0] | x[1], "shr.b32": lambda x: x[0] >> x[1],
           "shl.b32": lambda x: x[0] << x[1], "lop3.b32": lambda x: lop3(*x),
           "mov.b32": lambda x: x[0], "mov.u32": lambda x: x[0], "mul.lo.u32": lambda x: x[0] * x[1],
           "mad.lo.u32": lambda x: x[0] * x[1] + x[2], "prmt.b32": lambda x: prmt(*x),
           # products of fp16 numbers and their sums with a third are exact in float64
           "fma.rn.f16x2": lambda x: f16x2(halves(x[0]) * halves(x[1]) + halves(x[2])),
           "mul.rn.f16x2": lambda x: f16x2(halves(x[0]) * halves(x[1]))}
    for op, operands in re.findall(r"(and\.b32|or\.b32|shr\.b32|shl\.b32|lop3\.b32|mov\.b32|mov\.u32|mul\.lo\.u32|"
                                   r"mad\.lo\.u32|prmt\.b32|shfl\.sync\.idx\.b32|fma\.rn\.f16x2|mul\.rn\.f16x2)\s+([^;]+);",
                                   asm):
        d, *src = [x.strip() for x in operands.split(",")]
        x = [value(v) for v in src]
        if op.startswith("shfl"):
            assert x[2][0] == 0x1F and x[3][0] == 0xFFFFFFFF, "a whole warp, no segments"
            regs[d] = [x[0][x[1][lane] & 0x1F] for lane in range(lanes)]
        else:
            regs[d] = [ops[op](args) & 0xFFFFFFFF for args in zip(*x)]
    out = [regs.get(f"${i}") for i in range(outputs)]
    return [None if o is None else o[0] if lanes == 1 else o for o in out]


def _turbo_lut(kind: str, bits: int, D: int):
    """The decode kernel's ``LUT`` constexpr of a turbo spec for lookups of ``kind`` (``prmt``/``shfl``),
    and the fp16 bits of its centroids."""
    spec = KVQuantConfig(method="turbo", bits=bits).spec("k")
    table = [b & 0xFFFF for b in co._centroids_fp16(D, bits).view(torch.int16).tolist()]
    return f"{kind}:{co._register_lut_words(spec, D)}", table


@pytest.mark.parametrize("bits", [2, 3, 4])
@pytest.mark.parametrize("D", [64, 80, 128])
def test_register_lut_permutes_give_the_fp16_centroids(bits, D):
    """The PTX of ``register_lut`` (GPU only) against the table: each of two lanes becomes the fp16
    bits of its code's centroid; 2/4-bit codes are cut from plane ``s`` of the row words here, 3-bit
    ones come in place in the lanes of ``_field3_lanes``."""

    words, table = _turbo_lut("prmt", bits, D)
    gen = torch.Generator().manual_seed(bits * D)
    for s in range(co._planes(bits, D * bits // 8)):
        asm = co._register_lut_asm.fn(bits, words, s)
        for _ in range(100):
            w = torch.randint(0, 1 << 16, (2,), generator=gen).tolist()
            if bits == 3:  # lanes of _field3_lanes: the code in place, nothing else
                w = [(x & 7) << co._field3_shift.fn(s) for x in w]
                codes = [x >> co._field3_shift.fn(s) for x in w]
            else:
                codes = [(x >> (bits * s)) & ((1 << bits) - 1) for x in w]
            out = _run_ptx(asm, [w[0] | w[1] << 16], first_input=1)[0]
            assert [out & 0xFFFF, out >> 16] == [table[c] for c in codes], (s, codes)


@pytest.mark.parametrize("bits", [2, 3, 4])
@pytest.mark.parametrize("D", [64, 80, 128])
def test_shuffle_lookups_give_the_fp16_centroids(bits, D):
    """The PTX of ``shuffle_lut`` (GPU only) in a warp of 32 lanes against the table: every lane's
    codes of plane ``s`` become their centroids' fp16 bits, whatever the bits beside the field (the
    shuffle reads five bits of its lane operand and the table repeats every 2^bits lanes). 2/4-bit:
    two int16 row words per lane; 3-bit: four bytes of each of the three byte planes."""

    lut, table = _turbo_lut("shfl", bits, D)
    gen = torch.Generator().manual_seed(bits * D)
    for s in range(co._planes(bits, D * bits // 8)):
        asm = co._shuffle_lut_asm.fn(bits, lut, s)
        for _ in range(20):
            if bits == 3:  # byte planes: lane l's word k is b0[l][k] | b1[l][k] << 8 | b2[l][k] << 16
                planes = torch.randint(0, 256, (3, 32, 4), generator=gen).tolist()
                regs = [[sum(b << (8 * k) for k, b in enumerate(lane)) for lane in plane] for plane in planes]
                shift, lo = (3 * s) % 8, (3 * s) // 8
                out = _run_ptx(asm, regs[lo:lo + 2] if shift > 5 else regs[lo:lo + 1], lanes=32)
                got = [[o >> (16 * h) & 0xFFFF for o in (out[0][lane], out[1][lane]) for h in range(2)]
                       for lane in range(32)]
                codes = [[((planes[0][lane][k] | planes[1][lane][k] << 8 | planes[2][lane][k] << 16) >> (3 * s)) & 7
                          for k in range(4)] for lane in range(32)]
            else:
                w = torch.randint(0, 1 << 16, (32, 2), generator=gen).tolist()
                out = _run_ptx(asm, [[a | b << 16 for a, b in w]], first_input=1, lanes=32)[0]
                got = [[o & 0xFFFF, o >> 16] for o in out]
                codes = [[(x >> (bits * s)) & ((1 << bits) - 1) for x in pair] for pair in w]
            assert got == [[table[c] for c in lane] for lane in codes], s


@pytest.mark.parametrize("bits, D", [(b, D) for b in (3, 4, 8) for D in (64, 80, 128, 256) if not row_grid(D, b)])
def test_polynomial_levels_ptx_gives_the_fp16_levels(bits, D):
    """The PTX of the level polynomial (GPU only) against the table: every code of every plane becomes the
    fp16 bits of its level, whatever the bits beside its field. 4/8-bit: two int16 row words; 3-bit: the lanes
    ``_field3_spread`` makes from four bytes of each of the three byte planes."""
    from turboquant.templates import decode_attention as da

    spec = KVQuantConfig(method="turbo", bits=bits).spec("k")
    lut = da._lut_constexpr(spec, D, True, None, None, None)
    assert lut == f"poly:{co._polynomial_words(spec, D)}"
    assert len(lut.split(",")) == POLYNOMIAL_LEVELS[bits] // 2  # k0, k1, …
    table = [b & 0xFFFF for b in co._centroids_fp16(D, bits).view(torch.int16).tolist()]
    gen = torch.Generator().manual_seed(bits * D)
    n = 1 << bits
    for s in range(co._planes(bits, D * bits // 8)):
        asm = co._polynomial_asm.fn(bits, lut, s)
        if bits == 3:  # every code in each of the four bytes, random bits around it
            codes = torch.stack([torch.arange(8).roll(k) for k in range(4)], 1)  # [8 codes, 4 bytes]
            words = torch.randint(0, 1 << 24, (8, 4), generator=gen)
            words = (words & ~(7 << 3 * s)) | codes << 3 * s  # the 24-bit word of dims 8t … 8t + 7
            planes = [[sum(((w >> 8 * p) & 0xFF) << 8 * k for k, w in enumerate(row)) for row in words.tolist()]
                      for p in range(3)]
            for r in range(8):
                out = [_run_ptx(asm, [lanes], first_input=1)[0] for lanes in _spread3([p[r] for p in planes], s)]
                got = [o >> (16 * h) & 0xFFFF for o in out for h in range(2)]
                assert got == [table[c] for c in codes[r].tolist()], (s, codes[r])
        else:
            for k in range(0, n, 2):
                other = torch.randint(0, 1 << 16, (2,), generator=gen).tolist()
                field = (n - 1) << bits * s
                w = [(other[0] & ~field) | k << bits * s, (other[1] & ~field) | (k + 1) << bits * s]
                out = _run_ptx(asm, [w[0] | w[1] << 16], first_input=1)[0]
                assert [out & 0xFFFF, out >> 16] == [table[k], table[k + 1]], (s, k)


def test_lookup_defaults_where_they_were_faster():
    # by default: 3-, 4- and 8-bit turbo levels computed from the code (their level polynomial) at every length,
    # 2-bit codes as fields in place, no lookup, in four-warp programs (short caches) and keys-major one-warp tiles
    # (their levels are a uniform grid). With polynomial_levels=False, 3- and
    # 4-bit codes take warp shuffles, and without those 3-bit codes take the permutes in four-warp programs and
    # 4-bit ones the gather; 8-bit ones the gather (256 entries). Affine reads no table. 8-bit rows of head_dim
    # 128 are a grid of their own (row_grid): fields in place in every tile, and affine 8-bit's warps; head_dim 256
    # keeps the polynomial.
    for bits in (2, 3, 4, 8):
        cfg = KVQuantConfig(method="turbo", bits=bits)
        grid = bits == 2 or row_grid(128, bits)  # a uniform grid: fields in place
        poly = f"poly:{co._polynomial_words(cfg.spec('k'), 128)}" if not grid else ""
        words = co._register_lut_words(cfg.spec("k"), 128) if bits <= 4 else ""
        if bits == 8:
            assert _plan_options(cfg, 1024, D=256)[1]["K_LUT"] == f"poly:{co._polynomial_words(cfg.spec('k'), 256)}"
        for S in (1024, 4096):
            options, default = _plan_options(cfg, S)
            one_warp = options["num_warps"] == 1
            assert one_warp == (S == 4096 or (bits == 8 and not grid))
            if grid:  # fields in place in keys-major one-warp tiles and in four-warp programs
                assert default["K_LUT"] == default["V_LUT"] == f"lin:{co._linear_level_words(cfg.spec('k'), 128)}"
            else:
                assert default["K_LUT"] == default["V_LUT"] == (poly or f"prmt:{words}"), (bits, S)
            looked_up = dict(linear_levels=False, polynomial_levels=False)
            shfl = _plan_options(cfg, S, **looked_up)[1]["K_LUT"]
            assert shfl == {2: f"prmt:{words}", 3: f"shfl:{words}", 4: f"shfl:{words}", 8: ""}[bits], (bits, S)
            no_shfl = _plan_options(cfg, S, shuffle_lut=False, **looked_up)[1]["K_LUT"]
            assert (no_shfl != "") == (bits == 2 or (bits == 3 and not one_warp)), (bits, S)
            for flag, kind in ((True, "shfl"), (False, "prmt")):
                on = _plan_options(cfg, S, shuffle_lut=flag, register_lut=True, **looked_up)[1]
                assert on["K_LUT"] == on["V_LUT"] == (f"{kind}:{words}" if bits <= 4 else "")
                computed = _plan_options(cfg, S, shuffle_lut=flag, register_lut=True, linear_levels=False)[1]
                assert computed["K_LUT"] == (poly or (f"{kind}:{words}" if bits <= 4 else ""))
            off = _plan_options(cfg, S, shuffle_lut=False, register_lut=False, linear_levels=False)[1]
            assert off["K_LUT"] == off["V_LUT"] == poly
            gather = _plan_options(cfg, S, shuffle_lut=False, register_lut=False, **looked_up)[1]
            assert gather["K_LUT"] == gather["V_LUT"] == ""
            # linear_levels=True reads uniform grids' codes as fields in place in any program, and nothing else
            forced = _plan_options(cfg, S, linear_levels=True)[1]
            assert forced["K_LUT"].startswith("lin:") == grid, (bits, S)
    mixed = _plan_options(KVQuantConfig(method="turbo", bits=4, k_bits=8, v_bits=2), 4096, D=256)[1]
    assert mixed["K_LUT"].startswith("poly:") and mixed["V_LUT"].startswith("prmt:")  # 8-bit keys: row-major
    mixed = _plan_options(KVQuantConfig(method="turbo", bits=4, k_bits=3, v_bits=4), 4096)[1]
    assert mixed["K_LUT"].startswith("poly:") and mixed["V_LUT"].startswith("poly:")
    # 2-bit codes as fields in keys-major tiles only: not row-major ones (head_dim 64, or set)
    two = KVQuantConfig(method="turbo", bits=2)
    assert _plan_options(two, 4096, keys_major=True)[1]["K_LUT"].startswith("lin:")
    assert _plan_options(two, 4096, keys_major=False)[1]["K_LUT"].startswith("prmt:")
    assert _plan_options(two, 4096, D=64)[1]["K_LUT"].startswith("prmt:")
    assert _plan_options(KVQuantConfig(method="affine", bits=4), 4096, register_lut=True, shuffle_lut=True)[1][
        "K_LUT"] == ""


@pytest.mark.parametrize("D", HEAD_DIMS)
def test_two_bit_turbo_levels_are_linear_in_the_code_bits(D):
    # α·(c + γ·l − z) gives the fp16 table's four levels (to float64's rounding) for every head_dim; a table
    # whose steps differ (not symmetric) is looked up
    spec = KVQuantConfig(method="turbo", bits=2).spec("k")
    table = co._centroids_fp16(D, 2).double()
    alpha, gamma, zero = (float(x) for x in co._linear_level_words(spec, D).split(","))
    c = torch.arange(4, dtype=torch.float64)
    torch.testing.assert_close(alpha * (c + gamma * (c % 2) - zero), table, rtol=1e-14, atol=0)
    assert co._lin_coef.fn(f"lin:{alpha!r},{gamma!r},{zero!r}", 1) == gamma
    # a uniform grid (2-bit levels are a degree-1 polynomial's): no low bits to read
    assert gamma == 0.0 and zero == 1.5 and not co._lin_low_bits.fn(f"lin:{alpha!r},{gamma!r},{zero!r}")
    assert co._lin_low_bits.fn(f"lin:{alpha!r},0.25,{zero!r}")
    for other in (KVQuantConfig(method="turbo", bits=3), KVQuantConfig(method="affine", bits=2)):
        assert co._linear_level_words(other.spec("k"), D) is None


def test_an_asymmetric_two_bit_table_is_looked_up(monkeypatch):
    spec = KVQuantConfig(method="turbo", bits=2).spec("k")
    monkeypatch.setattr(co, "_centroids_fp16", lambda d, bits, device=None: torch.tensor(
        [-0.25, -0.0625, 0.0625, 0.125], dtype=torch.float16))
    assert co._linear_level_words(spec, 128) is None
    assert _plan_options(KVQuantConfig(method="turbo", bits=2), 4096)[1]["K_LUT"].startswith("prmt:")


@pytest.mark.parametrize("D", HEAD_DIMS)
@pytest.mark.parametrize("k_bits,v_bits,mask,num_splits,warps,keys_major", [
    (2, 2, None, 1, 4, None), (2, 4, "causal", 2, 1, None), (4, 2, "bool", 3, 1, False),
    (2, 2, "additive", 2, 1, None)])
def test_linear_two_bit_levels_match_the_table_and_the_oracle(D, k_bits, v_bits, mask, num_splits, warps,
                                                              keys_major):
    # fields in place (the default of keys-major tiles, forced in others) against the table's
    # byte permutes: both within the kernel bound of the oracle, and close to each other
    if keys_major and D == 64:
        keys_major = None
    args = ("turbo", k_bits, v_bits, 2, 2, 4, 1, 37, D, mask, 0)
    launch = dict(num_splits=num_splits, num_warps=warps, keys_major=keys_major)
    lin, ref = _case(*args, linear_levels=True, **launch)
    table, _ = _case(*args, linear_levels=False, **launch)
    assert _rel(lin, ref) < TOL and _rel(table, ref) < TOL
    assert _rel(lin, table.double()) < TOL


def test_linear_two_bit_levels_on_long_splits_take_block_sums():
    # their values cancel a zero point as affine ones do: a long split without row groups sums block by block
    consts = _plan_options(KVQuantConfig(method="turbo", bits=2), 4096, num_splits=1, num_warps=1)[1]
    assert consts["V_LUT"].startswith("lin:") and consts["BLOCK_SUMS"]
    assert not _plan_options(KVQuantConfig(method="turbo", bits=2), 4096, num_splits=1, num_warps=1,
                             linear_levels=False)[1]["BLOCK_SUMS"]
    out, ref = _case("turbo", 2, 2, 1, 2, 4, 1, 1100, 128, None, 3, num_splits=1, num_warps=1, block_n=64)
    assert _rel(out, ref) < TOL


def test_plane_hadamard_defaults_where_it_was_faster():
    # by default turbo codes of every width at every split length (8-bit ones on long splits since their
    # 64-column planes rotate as halves: faster than the matrix, H100); never affine; keys and values chosen
    # apart, and the override still reads the matrix
    from turboquant.templates import decode_attention as da

    for bits in (2, 3, 4, 8):
        spec = KVQuantConfig(method="turbo", bits=bits).spec("k")
        for split_keys in (64, 256, da.LONG_SPLIT_KEYS // 2, da.LONG_SPLIT_KEYS, 4096):
            assert da._plane_hadamard(spec, split_keys)
    for S, splits in ((1024, None), (32768, 1)):
        consts = _plan_options(KVQuantConfig(method="turbo", bits=4, k_bits=8, v_bits=2), S, num_splits=splits)[1]
        assert (consts["K_PLANE_H"], consts["V_PLANE_H"]) == (True, True), S
    for flag in (True, False):
        consts = _plan_options(KVQuantConfig(method="turbo", bits=2), 1024, plane_hadamard=flag)[1]
        assert consts["K_PLANE_H"] == consts["V_PLANE_H"] == flag
    assert not _plan_options(KVQuantConfig(method="affine", bits=4), 1024, plane_hadamard=True)[1]["K_PLANE_H"]


def test_block_sums_default_to_long_affine_splits_without_row_groups():
    # the MMA's truncating fp32 accumulation grew affine 8-bit's error with the blocks one row sums
    # (H200: 8.45e-3 at 64K); row groups split those sums four ways, so only tiles without them add
    # block by block; turbo values cancel no zero point
    from turboquant.templates import decode_attention as da

    affine8, affine4, turbo8 = (KVQuantConfig(method=m, bits=b).spec("v") for m, b in
                                (("affine", 8), ("affine", 4), ("turbo", 8)))
    long_split, short_split = da.LONG_SPLIT_KEYS, da.LONG_SPLIT_KEYS // 2
    assert da._block_sums(affine8, 1, long_split) and da._block_sums(affine4, 1, long_split)
    assert not da._block_sums(affine8, 1, short_split)
    assert not da._block_sums(affine4, 4, long_split)
    assert not da._block_sums(turbo8, 1, long_split)
    one_split = _plan_options(KVQuantConfig(method="affine", bits=8), 4096, num_splits=1)[1]
    assert one_split["BLOCK_SUMS"]
    assert not _plan_options(KVQuantConfig(method="affine", bits=8), 1024)[1]["BLOCK_SUMS"]
    assert not _plan_options(KVQuantConfig(method="affine", bits=4), 4096, num_splits=1, num_warps=1,
                             keys_major=False)[1]["BLOCK_SUMS"]
    # keys-major tiles have no row groups: every row sums every block of a long split
    assert _plan_options(KVQuantConfig(method="affine", bits=4), 4096, num_splits=1, num_warps=1)[1]["BLOCK_SUMS"]


def _spread3(regs: list, s: int) -> list:
    """The two registers of 16-bit lanes that ``_field3_spread``'s PTX makes for 3-bit plane ``s`` from the three
    byte planes' registers (four bytes each): planes 0-2 from byte planes 0 and 1, 3-5 from 1 and 2, 6-7 from 2."""
    lo = (3 * s) // 8
    return _run_ptx(co._spread3_asm.fn(), [regs[lo], regs[min(lo + 1, 2)]])


def test_3bit_lane_permutes_put_each_code_in_place():
    """The PTX of the 3-bit planes (GPU only) against the layout: lane k of plane s holds
    ``code · 2^(3s mod 8)``, the code of dim ``8t + s`` of word k (bytes ``b0 | b1 << 8 | b2 << 16``), from the
    lanes the planes share (``_field3_spread``) masked to the field."""

    gen = torch.Generator().manual_seed(0)
    for _ in range(200):
        planes = torch.randint(0, 256, (3, 4), generator=gen).tolist()  # 4 words: bytes of 3 planes
        regs = [sum(b << (8 * k) for k, b in enumerate(plane)) for plane in planes]
        for s in range(8):
            shift = (3 * s) % 8
            asm = co._lane_mask_asm.fn(7 << shift)
            out = [_run_ptx(asm, [r], first_input=1)[0] for r in _spread3(regs, s)]
            lanes = [out[k // 2] >> (16 * (k % 2)) & 0xFFFF for k in range(4)]
            words = [planes[0][k] | planes[1][k] << 8 | planes[2][k] << 16 for k in range(4)]
            assert lanes == [((w >> (3 * s)) & 7) << shift for w in words], s
            assert co._field_unit.fn(3, False, s) == 2.0 ** (shift - 24)


@pytest.mark.parametrize("method, seed, k_bits, mask, num_splits, S", [
    ("affine", 0, 3, "padded", 2, 77), ("affine", 1, 4, "bool", 3, 150), ("affine", 2, 8, None, 1, 40),
    ("turbo", 3, 3, "padded", 2, 77), ("turbo", 4, 4, "causal", 1, 50)])
def test_three_bit_value_words_are_the_byte_planes(method, seed, k_bits, mask, num_splits, S):
    """3-bit values read as word tiles, slot by slot (``value_words``), against the oracle and against the same
    values read as byte planes: the same products (each slot's column one output dim) summed in the same order, so
    the same numbers."""
    args = dict(B=2, hkv=2, g=4, L=1, S=S, D=128, mask=mask, seed=seed, num_warps=1, num_splits=num_splits,
                block_n=64, row_groups=4)
    words, ref = _case(method, k_bits, 3, value_words=True, **args)
    planes, _ = _case(method, k_bits, 3, value_words=False, **args)
    assert _rel(words, ref) < TOL
    assert _rel(words, planes.double()) < 1e-6


def test_three_bit_value_words_only_where_the_tile_fits():
    from turboquant.templates.decode_attention import _value_word_tiles

    spec = KVQuantConfig(method="affine", bits=3).spec("v")
    turbo = KVQuantConfig(method="turbo", bits=3).spec("v")
    fits = dict(v_spec=spec, v_lut="", d=128, v_nbytes=48, v_place=(4096, 48 * 64, 48, 48), sub_n=16, num_warps=1,
                keys_major=False, early_rows=False)
    assert not _value_word_tiles(**fits)  # affine: byte planes unless asked (words were slower, H100)
    assert _value_word_tiles(**fits, override=True)
    assert _value_word_tiles(**(fits | dict(v_spec=turbo, v_lut="poly:0x1")))
    assert not _value_word_tiles(**(fits | dict(v_spec=turbo, v_lut="poly:0x1")), override=False)
    poly = fits | dict(v_spec=turbo, v_lut="poly:0x1")
    for change in (dict(v_lut="shfl:0x1"), dict(d=64, v_nbytes=24), dict(sub_n=32), dict(num_warps=4),
                   dict(keys_major=True), dict(early_rows=True), dict(v_place=(4097, 48, 48, 48)),
                   dict(v_place=(4096, 48, 48, 49))):
        assert not _value_word_tiles(**(poly | change)), change
        with pytest.raises(ValueError, match="value_words=True"):
            _value_word_tiles(**(poly | change), override=True)


def test_three_bit_value_word_fragments_hold_both_column_halves():
    """The lanes of ``_word3_lanes`` (GPU: one asm of pack 8, a thread's whole fragment of a 16 × 16 tile) take the
    operand's column n from the fragment's first two registers and n + 8 from the last two. That is the register
    order of Triton's MMA B operand of 16-bit values at k-width 2 (register bases: key + 1, key + 8, column + 8),
    checked here; and the PTX makes, from the words of Y and X in those registers, each plane's fields where the
    layout says (the interpreter's path, which the kernel tests compare with the oracle, reads them so)."""
    gluon_ir = pytest.importorskip("triton._C.libtriton.gluon_ir")
    from triton._C.libtriton import ir
    from triton.experimental.gluon.language._layouts import DotOperandLayout, NVMMADistributedLayout

    ctx = ir.context()
    ir.load_dialects(ctx)
    builder = gluon_ir.GluonOpBuilder(ctx)
    mma = NVMMADistributedLayout(version=[2, 0], warps_per_cta=[1, 1], instr_shape=[16, 8])
    layout = builder.to_linear_layout(DotOperandLayout(1, mma, 2)._to_ir(builder), [16, co.WORD3_COLUMNS.value])
    assert layout.reg_bases == [[1, 0], [8, 0], [0, 8]]

    gen = torch.Generator().manual_seed(1)
    for _ in range(50):
        rows = torch.randint(0, 256, (4, 48), generator=gen)  # keys k, k+1, k+8, k+9: byte planes 0, 1, 2
        words = (rows[:, 0::2] | rows[:, 1::2] << 8).tolist()  # the rows as little-endian 16-bit words
        codes = [[(rows[k, t] | rows[k, 16 + t] << 8 | rows[k, 32 + t] << 16) >> 3 * s & 7 for t in range(16)
                  for s in range(8)] for k in range(4)]  # code of dim 8t + s
        for n in range(8):  # a thread's operand columns n (registers 0, 1) and n + 8 (2, 3)
            pair = lambda w, h: words[2 * h][w] | words[2 * h + 1][w] << 16  # noqa: E731  keys (k, k+1) or (k+8, k+9)
            y = [pair(n, 0), pair(n, 1), pair(8 + n, 0), pair(8 + n, 1)]
            x = [pair(16 + n, 0), pair(16 + n, 1), 0, 0]
            for a, planes in ((0, (0, 1, 2)), (1, (3, 4, 5)), (2, (6, 7))):
                lanes = _run_ptx(co._word3_lanes_asm.fn(a), y + x, first_input=4, outputs=4)
                for s in planes:
                    fields = [_run_ptx(co._lane_mask_asm.fn(7 << (3 * s) % 8), [r], first_input=1)[0] for r in lanes]
                    for r, field in enumerate(fields):
                        t = 2 * n + r // 2  # registers 2, 3: the operand's column n + 8, the odd dim column
                        keys = (0, 1) if r % 2 == 0 else (2, 3)
                        got = [field >> 16 * i & 0xFFFF for i in range(2)]
                        want = [codes[k][8 * t + s] << (3 * s) % 8 for k in keys]
                        assert got == want, (n, s, r)


def test_supports_names_what_it_leaves_to_the_fallback():
    q = torch.zeros(1, 4, 9, 64)
    spec = KVQuantConfig().spec("k")
    assert "prefill" in supports(q, spec, spec, 64, 64, 2)
    assert "group_size" in supports(q[:, :, :1], KVQuantConfig(group_size=32).spec("k"), spec, 64, 64, 2)
    assert supports(q[:, :, :1], spec, spec, 64, 64, 2) is None
    # 8-bit rows of 36 bytes are read as int16 words; 9 bytes are not
    eight = KVQuantConfig(bits=8).spec("k")
    assert supports(torch.zeros(1, 4, 1, 9), eight, eight, 9, 9, 2) == "8-bit rows of head_dim 9 are not whole 16-bit words"
    assert supports(torch.zeros(1, 4, 1, 36), eight, eight, 36, 36, 2) is None


@pytest.mark.parametrize("method", ["affine", "turbo"])
def test_a_second_call_of_the_same_shape_reuses_its_launch_plan(method):
    # the plan keeps the launches' grids and arguments (on a GPU, the compiled kernels, launched
    # directly): a call with other values of the same shape must still compute its own result
    from turboquant.templates import decode_attention as da

    da._PLANS.clear()
    kw = dict(B=2, hkv=2, g=4, L=2, S=70, D=64, mask="bool", block_n=16, num_splits=3)
    first, ref = _case(method, 4, 3, seed=5, **kw)
    (plan,) = da._PLANS.values()
    assert plan.split.grid[1] == 3 and plan.merge is not None
    other, other_ref = _case(method, 4, 3, seed=6, **kw)
    assert len(da._PLANS) == 1
    assert _rel(first, ref) < TOL and _rel(other, other_ref) < TOL
    again, _ = _case(method, 4, 3, seed=5, **kw)
    assert torch.equal(first, again)
    if DEVICE == "cuda":
        assert plan.split.compiled is not None and plan.merge.compiled is not None
        # the later calls (other, again) went through torch's C++ launcher
        assert plan.split.static is not None and plan.merge.static is not None
    # later launches skip Triton's launch hooks while none is set, and a profiler's hook still sees them
    import triton

    chain = triton.knobs.runtime.launch_enter_hook
    assert da._hook(None) is None and (da._hook(chain) is None) == (not chain.calls)
    seen = []
    chain.add(seen.append)
    try:
        assert da._hook(chain) is chain
        hooked, _ = _case(method, 4, 3, seed=5, **kw)
    finally:
        chain.remove(seen.append)
    assert torch.equal(hooked, first)
    if DEVICE == "cuda":
        assert [m.get()["name"] for m in seen] == [plan.split.compiled.name, plan.merge.compiled.name]


_STATIC_LAUNCH_CHECK = """
import json
import torch
import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler.compiler import ASTSource
from turboquant import compat

@triton.jit
def body(x_ptr, y_ptr, n, scale, big, one, BLOCK: tl.constexpr):
    i = tl.arange(0, BLOCK)
    tl.store(y_ptr + i, tl.load(x_ptr + i) * scale + n + big + one)

sig = {"x_ptr": "*fp32", "y_ptr": "*bf16", "n": "i32", "scale": "fp32", "big": "i64", "one": "constexpr",
       "BLOCK": "constexpr"}
ck = triton.compile(ASTSource(body, sig, {"one": 1, "BLOCK": 32}, {}), target=GPUTarget("cuda", 90, 32))
print(json.dumps({
    "scratch": sum(hasattr(ck.metadata, n) for n in ("global_scratch_size", "profile_scratch_size")),
    "two": compat.static_launch_signature(ck, 2),
    "three": compat.static_launch_signature(ck, 3),
    # asked of a CPU build only: a CUDA build has the launcher, and loading the kernel for it needs a GPU
    "launcher": None if torch.version.cuda else compat.static_cuda_launch(ck, 2),
}))
"""


def test_the_static_launch_passes_the_run_time_arguments_of_the_compiled_kernel(tmp_path):
    """torch's C++ launcher takes a compiled kernel's run-time arguments only: the pointers, then the
    scalars Triton did not compile in (constexprs and specialised values out), and null scratch
    pointers; its type string says how to pass each. Checked on a kernel compiled for sm_90 on the
    CPU (the launch itself is the GPU tests': a plan's later calls go through it), in a process of its
    own: Triton 3.6's interpreter leaves ``triton.language`` patched after a kernel that calls a jitted
    helper, and a real compile in that process then fails."""
    import json
    import os
    import subprocess
    import sys

    script = tmp_path / "static_launch_check.py"
    script.write_text(_STATIC_LAUNCH_CHECK)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # a real compile
    env["PYTHONPATH"] = os.pathsep.join([os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                         env.get("PYTHONPATH", "")])
    got = json.loads(subprocess.run([sys.executable, str(script)], env=env, check=True, capture_output=True,
                                    text=True).stdout.strip().splitlines()[-1])
    # the tail after the two pointers is (n, scale, big, one, BLOCK): its first three are run-time
    assert got["two"] == [[0, 1, 2], "OOifl" + "O" * got["scratch"]]
    assert got["three"] is None  # n is no pointer
    assert got["launcher"] is None  # no C++ launcher in a CPU build (a CUDA build: not asked)


@pytest.mark.gpu
def test_a_host_bound_call_is_one_launch_and_a_captured_call_splits():
    """Outside a CUDA graph a small call (batch 1 decode) runs one split, normalised in the kernel
    (no merge launch, no partials): its step is bound by the host's launches. Captured into a CUDA
    graph, the same call splits the sequence over the GPU as usual; both give the oracle's result."""
    from turboquant.templates import decode_attention as da

    gen = torch.Generator().manual_seed(11)
    q = torch.randn(1, 32, 1, 128, generator=gen).to(DEVICE, torch.bfloat16)
    cfg = KVQuantConfig(bits=4)
    kq = quantize_kv(torch.randn(1, 8, 1024, 128, generator=gen).to(DEVICE), cfg)
    vq = quantize_kv(torch.randn(1, 8, 1024, 128, generator=gen).to(DEVICE), cfg, role="v")
    m = torch.ones(1, 1, 1, 1024, dtype=torch.bool, device=DEVICE)
    m[..., :100] = False
    ref = reference_attention(q, kq, vq, attn_mask=m)

    def call(**kw):
        return decode_attention(q, kq.codes, kq.meta.flatten(-2), vq.codes, vq.meta.flatten(-2), kq.spec, vq.spec,
                                128, attn_mask=m, **kw)

    da._PLANS.clear()
    out = call()
    (eager_plan,) = da._PLANS.values()
    assert eager_plan.split.grid[1] == 1 and eager_plan.merge is None
    # the plan's later calls launch through torch's C++ launcher, with the first call's result
    assert eager_plan.split.static is not None and torch.equal(call(), out)
    call(num_splits=8)  # compiles what the captured call launches (8 splits of 128 keys): no compiling in a capture
    graph = torch.cuda.CUDAGraph()
    torch.cuda.synchronize()
    with torch.cuda.graph(graph):
        captured = call()
    graph.replay()
    torch.cuda.synchronize()
    (captured_plan,) = [p for key, p in da._PLANS.items() if key[0]]  # the key's first entry: captured
    assert captured_plan.split.grid[1] > 1 and captured_plan.merge is not None
    assert _rel(out, ref) < TOL and _rel(captured, ref) < TOL


@pytest.mark.gpu
@pytest.mark.parametrize("method", ["affine", "turbo"])
@pytest.mark.parametrize("S", [1, 17, 4097])
def test_full_size_on_gpu(method, S):
    # affine metadata as the integer words a cache stores (one load a pair; rows back to back)
    out, ref = _case(method, 4, 3, B=17, hkv=8, g=4, L=1, S=S, D=128, mask="padded", seed=S, dtype=torch.bfloat16,
                     meta_words=True)
    assert _rel(out.to(torch.bfloat16), ref) < TOL


@pytest.mark.gpu
@pytest.mark.parametrize("method", ["affine", "turbo"])
@pytest.mark.parametrize("S, launch", [(4097, dict(num_warps=1, row_groups=4, block_n=64)), (16384, {}),
                                       (32768, {})])
def test_three_bit_value_words_at_full_size_on_gpu(method, S, launch):
    # 3-bit caches of long splits, their values read as word tiles (turbo's default there) and as byte planes
    from turboquant.templates import decode_attention as da

    args = dict(B=8, hkv=8, g=4, L=1, S=S, D=128, mask="padded", seed=S, dtype=torch.bfloat16, meta_words=True,
                block_n=None) | launch
    words, ref = _case(method, 3, 3, **args, **({"value_words": True} if method == "affine" else {}))
    assert da.split_constants(next(reversed(da._PLANS.values())))["V_WORDS3"]
    planes, _ = _case(method, 3, 3, value_words=False, **args)
    assert _rel(words.to(torch.bfloat16), ref) < TOL
    assert _rel(words, planes.double()) < 1e-3  # bf16 outputs: the same sums, at most a rounding apart


@pytest.mark.gpu
def test_op_dispatches_to_the_kernel_on_cuda():
    from turboquant.cache import QuantizedCacheTensor

    cfg = KVQuantConfig(method="turbo", bits=3)
    k = torch.randn(2, 8, 300, 128, device="cuda", dtype=torch.bfloat16)
    kc = QuantizedCacheTensor.from_dense(k, cfg.spec("k"))
    vc = QuantizedCacheTensor.from_dense(k, cfg.spec("v"))
    q = torch.randn(2, 32, 1, 128, device="cuda", dtype=torch.bfloat16)
    out = torch.nn.functional.scaled_dot_product_attention(q, kc, vc, enable_gqa=True)
    ref = reference_attention(q, quantize_kv(k, cfg), quantize_kv(k, cfg, role="v"))
    assert _rel(out, ref) < TOL


@pytest.mark.parametrize("method, mask, num_splits, groups", [
    ("affine", None, 1, 1), ("turbo", "bool", 3, 1), ("affine", "causal", 2, 1), ("turbo", "additive", 1, 1),
    ("affine", "bool", 1, 2),  # 8 query rows in two row groups (one-warp tiles)
])
def test_residual_window_ring_is_merged_as_one_more_part(method, mask, num_splits, groups):
    """Positions a ring holds are read from it dense, the rest from the codes: the kernel against
    the float64 decode-overlay-attend of the same buffers."""
    from turboquant.ops import overlay_ring

    B, hkv, g, L, S, D, W = 2, 2, 4, 2, 29, 64, 5
    gen = torch.Generator().manual_seed(11)
    q = torch.randn(B, hkv * g, L, D, generator=gen).to(DEVICE)
    cfg = KVQuantConfig(method=method, bits=2)  # coarse codes: the ring's rows must visibly matter
    kq = quantize_kv(torch.randn(B, hkv, S, D, generator=gen).to(DEVICE), cfg)
    vq = quantize_kv(torch.randn(B, hkv, S, D, generator=gen).to(DEVICE), cfg, role="v")
    k_ring = torch.randn(B, hkv, W, D, generator=gen).to(DEVICE)
    v_ring = torch.randn(B, hkv, W, D, generator=gen).to(DEVICE)
    ring_pos = torch.tensor([0, 26, 27, -1, 4], device=DEVICE)  # slot = pos mod 5; slot 3 empty; 0 and 4 early
    m = None
    if mask == "bool":
        m = (torch.rand(B, 1, L, S, generator=gen) > 0.3).to(DEVICE)
        m[..., 0] = True
    elif mask == "additive":
        m = torch.randn(B, hkv * g, L, S, generator=gen).to(DEVICE)
    flat = (lambda t: t.flatten(-2)) if method == "affine" else (lambda t: t)
    out = decode_attention(q, kq.codes, flat(kq.meta), vq.codes, flat(vq.meta), kq.spec, vq.spec, D, attn_mask=m,
                           is_causal=mask == "causal", num_splits=num_splits, k_ring=k_ring, v_ring=v_ring,
                           ring_pos=ring_pos, **({"block_n": 16 if DEVICE == "cpu" else 128} if groups == 1 else
                                                 {"block_n": 32, "num_warps": 1, "row_groups": groups}))
    k = overlay_ring(dequantize_kv(kq).double(), k_ring.double(), ring_pos)
    v = overlay_ring(dequantize_kv(vq).double(), v_ring.double(), ring_pos)
    ref = torch.nn.functional.scaled_dot_product_attention(q.double(), k, v, attn_mask=m if m is None or m.dtype == torch.bool else m.double(),
                                                           is_causal=mask == "causal", enable_gqa=True)
    no_ring = reference_attention(q, kq, vq, attn_mask=m, is_causal=mask == "causal")
    assert _rel(out, ref) < TOL
    assert _rel(no_ring, ref) > 10 * TOL  # the ring changed the answer: the test sees it


def _plan_options(k_cfg, S, L=1, B=2, capturing=False, D=128, **tuning):
    """The split launch's options and tile of the plan a call of this shape would get."""
    from turboquant.templates import decode_attention as da

    plan = _plan(k_cfg, S, L, B, capturing, D, **tuning)
    consts = da.split_constants(plan)
    return plan.split.options, consts


def _plan(k_cfg, S, L=1, B=2, capturing=False, D=128, **tuning):
    """The plan a call of this shape would get (CPU tensors: the GPU's launch geometry with 4 SMs)."""
    from turboquant.templates import decode_attention as da

    hkv = 8
    q = torch.zeros(B, hkv * 4, L, D)
    kq = quantize_kv(torch.zeros(B, hkv, 1, D), k_cfg)
    vq = quantize_kv(torch.zeros(B, hkv, 1, D), k_cfg, role="v")

    def rows_last(t):  # affine metadata as one word per row, as the op passes it
        return t.flatten(-2) if t.dim() == 5 else t

    shapes = [rows_last(t) for t in (kq.codes, kq.meta, vq.codes, vq.meta)]
    k_codes, k_meta, v_codes, v_meta = (torch.empty(*t.shape[:2], S, t.shape[-1], dtype=t.dtype) for t in shapes)
    return da._make_plan(q, k_codes, k_meta, v_codes, v_meta, kq.spec, vq.spec, None, False, 0.0, 0, D ** -0.5,
                         da._tuning(**({"use_asm": False} | tuning)), capturing)


@pytest.mark.parametrize("method, bits, S, L, warps, block_n, D", [
    ("affine", 4, 2048, 1, 1, 64, 128), ("affine", 3, 32768, 1, 1, 64, 128), ("affine", 2, 8192, 2, 1, 64, 128),
    ("affine", 8, 4096, 1, 1, 32, 128), ("turbo", 3, 2048, 1, 1, 64, 128), ("turbo", 2, 9000, 1, 1, 64, 128),
    ("affine", 4, 2047, 1, 4, 128, 128),   # short caches: a split is mostly the program's fixed work
    ("turbo", 4, 32768, 1, 1, 64, 128),    # its centroids gathered by shuffles: 247.6 µs against 264.6 (H200)
    ("turbo", 8, 32768, 1, 1, 32, 256),    # levels computed (_polynomial_asm): one warp, 200.3 µs against 222.6
    ("turbo", 8, 1024, 1, 1, 32, 256),     # ... at every length: 18.29 against 21.42 at 1K (H200)
    ("turbo", 8, 32768, 1, 1, 32, 128),    # a row's grid (row_grid) read as fields: affine 8-bit's rules
    ("turbo", 8, 1024, 1, 4, 128, 128),
    ("affine", 4, 32768, 8, 4, 128, 128),  # 32 query rows: accumulators too large for one warp
])
def test_long_caches_run_one_warp_programs(method, bits, S, L, warps, block_n, D):
    options, consts = _plan_options(KVQuantConfig(method=method, bits=bits), S, L=L, D=D)
    assert options["num_warps"] == warps and consts["BLOCK_N"] == block_n
    if bits == 8 and method == "turbo" and D > 128:  # the polynomial's levels gathered from the 256-entry table:
        # four warps (one: 1450 µs against 410)
        gather = _plan_options(KVQuantConfig(method=method, bits=bits), S, L=L, D=D, polynomial_levels=False)[0]
        assert gather["num_warps"] == 4
        mixed = KVQuantConfig(method=method, bits=4, k_bits=8, v_bits=4)  # 4-bit's rule at 1K: four warps
        assert _plan_options(mixed, S, L=L, D=D)[0]["num_warps"] == (1 if S >= 2048 else 4)
    if bits == 8 and method == "turbo" and D <= 128:
        assert consts["K_LUT"].startswith("lin:") and consts["V_LUT"].startswith("lin:")
    # 3-bit one-warp programs take 2 stages: turbo at every length, affine on splits under 2048 keys
    assert options["num_stages"] == (2 if (method, bits) == ("turbo", 3) else 3)
    if warps == 1:  # no padding rows beyond the MMA's own: affine 2/4/8-bit and turbo 2/4-bit tiles are
        # keys-major, their rows the MMAs' N side; affine 3-bit fills the 16 rows of M with row groups, turbo
        # 8-bit tiles of 4 rows take two groups and 3-bit ones four
        keys_major = bits != 3 and (method == "affine" or bits != 8 or D <= 128)  # 8-bit ≤ 128: a row's grid
        turbo_groups = {8: 2 if D > 128 else 1, 3: 4}.get(bits, 1) if S >= 2048 and L == 1 else 1
        groups = (16 // (4 * L) if bits == 3 else 1) if method == "affine" else turbo_groups
        assert consts["NG"] == groups and consts["M"] == max(4, 4 * L) * groups
        assert consts["KEYS_MAJOR"] == keys_major
    else:  # four warps: GQA 4 × L rows, no padding rows (affine 4-bit at 1K: 16 rows 9.52 µs, 4 rows 7.88, H200);
        # 4-row tiles in two row groups (_four_warp_row_groups)
        groups = 2 if L == 1 and (method, bits) != ("turbo", 8) else 1
        assert consts["NG"] == groups and consts["M"] == 4 * L * groups
    assert consts["SKIP_RESCALE"] == (warps == 1)


@pytest.mark.parametrize("method", ["affine", "turbo"])
def test_short_3bit_caches_run_two_warp_programs(method, monkeypatch):
    # a 1K split of 3-bit rows is one 128-key block: with enough programs, two warps repeat less of its fixed
    # work than four (H100, B=8, 1K: turbo 13.41 → 11.30 µs, affine 9.85 → 8.71); with half as many (512 keys)
    # four were faster (turbo 9.35 against 9.67)
    from turboquant.templates import decode_attention as da

    monkeypatch.setattr(da, "CPU_PLAN_MULTIPROCESSORS", 132)  # an H100's grid, as timed
    cfg = KVQuantConfig(method=method, bits=3)
    options, consts = _plan_options(cfg, 1024, B=8)
    assert options["num_warps"] == 2 and consts["BLOCK_N"] == 128 and consts["M"] == 4 and consts["NG"] == 1
    assert _plan_options(cfg, 512, B=16)[0]["num_warps"] == 2  # as many programs as 1K at batch 8
    for S, B, L in ((512, 8, 1), (1024, 1, 1), (1024, 4, 1),  # fewer programs
                    (1025, 8, 1),  # 64-key blocks past SHORT_3BIT_KEYS
                    (1024, 8, 8)):  # 32 rows a tile
        assert _plan_options(cfg, S, B=B, L=L)[0]["num_warps"] == 4, (S, B, L)
    assert _plan_options(cfg, 1024, B=8, num_warps=4)[0]["num_warps"] == 4  # a caller's choice stands
    for other in (KVQuantConfig(method=method, bits=4), KVQuantConfig(method=method, bits=4, k_bits=3, v_bits=4)):
        assert _plan_options(other, 1024, B=8)[0]["num_warps"] == 4


@pytest.mark.parametrize("method", ["affine", "turbo"])
@pytest.mark.parametrize("S, D, g, mask", [(601, 64, 4, "padded"), (77, 96, 8, "causal"),
                                           pytest.param(1024, 128, 4, "bool", marks=pytest.mark.gpu)])
def test_two_warp_programs_match_the_oracle(method, S, D, g, mask):
    # the short 3-bit tile in two-warp programs (one 128-key block a split) at awkward sizes, against the oracle
    out, ref = _case(method, 3, 3, B=3, hkv=2, g=g, L=1, S=S, D=D, mask=mask, seed=S + D, block_n=None,
                     num_splits=2, num_warps=2)
    assert _rel(out, ref) < TOL


@pytest.mark.parametrize("bits, S, num_splits, groups", [
    (4, 32768, None, 4), (2, 8192, None, 4), (3, 4096, 4, 4),  # 1024 keys per split and more
    (4, 4096, 16, 1),   # 256 keys per split: the merge of the groups would cost more than they save
    (8, 32768, None, 1), ((4, 8), 32768, None, 1),  # 8-bit rows are near the memory's pace without them
])
def test_row_groups_go_to_long_affine_splits(bits, S, num_splits, groups):
    # the row-major tile's rule (2/4/8-bit tiles are keys-major by default: _keys_major)
    k_bits, v_bits = bits if isinstance(bits, tuple) else (bits, bits)
    options, consts = _plan_options(KVQuantConfig(method="affine", bits=4, k_bits=k_bits, v_bits=v_bits), S,
                                    num_splits=num_splits, keys_major=False)
    assert options["num_warps"] == 1 and consts["NG"] == groups and consts["M"] == 4 * groups


@pytest.mark.parametrize("bits, S, L, groups", [
    (4, 32768, 1, 2), (8, 32768, 1, 1), (3, 32768, 1, 4), ((8, 4), 32768, 1, 1), ((4, 3), 4096, 1, 4),
    (2, 32768, 1, 1), ((4, 2), 32768, 1, 1),  # 2-bit turbo: its register-table lookups took more with groups
    (4, 32768, 2, 1), (3, 32768, 2, 1),        # 8-row tiles
    (4, 1024, 1, 2), (3, 1024, 1, 1),          # short caches' four-warp programs: _four_warp_row_groups
])
def test_row_groups_go_to_long_turbo_splits(bits, S, L, groups):
    # row-major tiles (turbo 2/4-bit ones are keys-major by default, without row groups)
    k_bits, v_bits = bits if isinstance(bits, tuple) else (bits, bits)
    cfg = KVQuantConfig(method="turbo", bits=4, k_bits=k_bits, v_bits=v_bits)
    options, consts = _plan_options(cfg, S, L=L, B=8, keys_major=False)
    assert consts["NG"] == groups and consts["M"] == max(4, 4 * L) * groups
    assert options["num_warps"] == 1 or S < 2048


@pytest.mark.parametrize("method, bits, groups", [
    ("affine", 8, 2), ("affine", 4, 2), ("affine", 2, 2), ("turbo", 4, 2), ("affine", (4, 2), 2),
    ("turbo", 2, 1), ("turbo", (4, 2), 1),  # turbo 2-bit ran slower with them (H100, 1K: 10.84 → 11.21 µs)
    ("affine", 3, 1), ("affine", (4, 3), 1),  # 3-bit: not timed (two-warp programs at 1K, B=8)
])
def test_short_caches_four_warp_programs_take_two_row_groups(method, bits, groups):
    # H100, B=8, 1K: affine 4-bit 7.700 → 7.591 µs, turbo 4-bit 10.73 → 10.35; 512 keys likewise
    k_bits, v_bits = bits if isinstance(bits, tuple) else (bits, bits)
    cfg = KVQuantConfig(method=method, bits=4, k_bits=k_bits, v_bits=v_bits)
    for S, B in ((1024, 8), (512, 8), (2047, 1)):
        options, consts = _plan_options(cfg, S, B=B)
        assert consts["NG"] == groups and consts["M"] == 4 * groups, (S, B)
        assert options["num_warps"] == 4 or groups == 1  # 3-bit: two warps where the grid is full
    assert _plan_options(cfg, 1024, L=2)[1]["NG"] == 1  # 8-row tiles: not timed
    assert _plan_options(cfg, 1024, row_groups=1)[1]["NG"] == 1  # a caller's choice stands
    assert _plan_options(cfg, 1024, block_n=16)[1]["NG"] == 1  # a group would be narrower than an MMA step
    assert _plan_options(cfg, 1024, num_warps=2)[1]["NG"] == 1


@pytest.mark.parametrize("method, bits, D, per_sm", [
    ("affine", 2, 64, 16), ("affine", 4, 64, 8), ("affine", 3, 64, 8), ("affine", 2, 128, 8),
    ("turbo", 2, 64, 8), ("affine", (2, 4), 64, 8),
])
def test_head_dim_64_two_bit_affine_fills_sixteen_programs_per_sm(monkeypatch, method, bits, D, per_sm):
    # 128 registers at head_dim 64 (sm_90): 16 programs fit an SM; 50.81 µs against 61.54 at 8 (H100, 32K)
    from turboquant.templates import decode_attention as da

    monkeypatch.setattr(da, "CPU_PLAN_MULTIPROCESSORS", 132)
    k_bits, v_bits = bits if isinstance(bits, tuple) else (bits, bits)
    cfg = KVQuantConfig(method=method, bits=4, k_bits=k_bits, v_bits=v_bits)

    def even_splits(wave, S=32768, block_n=64):  # a wave's splits, made even in whole blocks
        return da._cdiv(S, da._cdiv(da._cdiv(S, wave), block_n) * block_n)

    assert _plan(cfg, 32768, B=8, D=D).split.grid[1] == even_splits(per_sm * 132 // (8 * 8))
    assert _plan(cfg, 32768, B=8, D=D, programs_per_sm=4).split.grid[1] == even_splits(4 * 132 // (8 * 8))


@pytest.mark.parametrize("bits, groups", [(3, 1), ((4, 3), 1), (4, 2), (2, 2)])
def test_tiles_of_eight_rows_take_row_groups_but_for_3_bits(bits, groups):
    # two query positions of GQA 4 (or GQA 5-8): 8-row tiles; with two groups 3-bit planes spilled
    # (216 bytes, sm_90 SASS) and take one group, the value block sums with it
    k_bits, v_bits = bits if isinstance(bits, tuple) else (bits, bits)
    options, consts = _plan_options(KVQuantConfig(method="affine", bits=4, k_bits=k_bits, v_bits=v_bits), 32768, L=2,
                                    keys_major=False)
    assert options["num_warps"] == 1 and consts["NG"] == groups and consts["M"] == 8 * groups
    assert consts["BLOCK_SUMS"] == (groups == 1)


@pytest.mark.parametrize("method, S, block_n, stages", [
    ("affine", 1024, 128, 2), ("turbo", 1024, 128, 3),  # short 3-bit caches: 128-key blocks (turbo 16.32 µs against 17.41)
    ("affine", 1025, 64, 3), ("turbo", 1536, 64, 3),    # longer four-warp ones keep 64 (registers)
    ("turbo", 2048, 64, 2),                              # one-warp programs (turbo 3-bit: 2 stages)
])
def test_short_3bit_caches_take_128_key_blocks(method, S, block_n, stages):
    options, consts = _plan_options(KVQuantConfig(method=method, bits=3), S)
    assert consts["BLOCK_N"] == block_n and options["num_stages"] == stages


@pytest.mark.parametrize("method, S, stages", [("affine", 4096, 2), ("affine", 16384, 2), ("affine", 32768, 3),
                                               ("turbo", 4096, 2), ("turbo", 32768, 2)])
def test_three_bit_one_warp_programs_take_two_stages_but_on_long_affine_splits(monkeypatch, method, S, stages):
    # B=8, Hkv=8 on 132 SMs: 16 splits, of 2048 keys at 32K (H100: turbo 3-bit 2-3.5% faster with 2 stages at
    # 4K-32K, affine 4.5% at 4K, 1% at 16K, 1.6% slower at 32K)
    from turboquant.templates import decode_attention as da

    monkeypatch.setattr(da, "CPU_PLAN_MULTIPROCESSORS", 132)
    options, _ = _plan_options(KVQuantConfig(method=method, bits=3), S, B=8)
    assert options["num_warps"] == 1 and options["num_stages"] == stages


@pytest.mark.parametrize("method, bits, splits", [("turbo", 8, 8), ("turbo", 4, 4), ("turbo", 3, 8), ("affine", 8, 8),
                                                  ("affine", 3, 8)])
def test_short_caches_split_no_finer_than_their_fixed_work_pays(monkeypatch, method, bits, splits):
    # 1K keys, B=8, Hkv=8 on the H200's 132 SMs (a wave of 16 splits): turbo 8-bit splits of 128 keys
    # (16.69 µs against 18.35 at 64 keys and 21.79 at 256), turbo 4-bit of 256, turbo 3-bit of 128 (14.86 µs
    # against 15.28 at 256, H100), affine of a block (128 keys in four-warp programs) or, for 3 bits, 128 keys
    from turboquant.templates import decode_attention as da

    monkeypatch.setattr(da, "CPU_PLAN_MULTIPROCESSORS", 132)
    assert _plan(KVQuantConfig(method=method, bits=bits), 1024, B=8).split.grid[1] == splits


@pytest.mark.parametrize("B", [2, 3])  # 16 KV heads fill the wave twice; 24 once, with 8 programs to spare
@pytest.mark.parametrize("S", [32768, 32800, 16400, 4100])
def test_one_warp_splits_fill_one_wave_at_any_length(S, B):
    # one-warp programs take the loop's bound as an argument: a cache just past a power of two still
    # splits into one wave's worth (a power-of-two split had made 32800 keys 17 splits on the H200,
    # a second wave; 132 µs against 85); four-warp programs keep power-of-two splits
    hkv, wave = 8, 8 * 4  # the plan's programs_per_sm × the CPU's stand-in of 4 SMs
    gather = {"polynomial_levels": False, "D": 256}  # turbo 8-bit gathering its polynomial's levels: four warps
    for cfg, warps, kw in ((KVQuantConfig(method="affine", bits=4), 1, {}),
                           (KVQuantConfig(method="turbo", bits=8), 4, gather)):
        options, consts = _plan_options(cfg, S, B=B, **kw)
        splits = _plan(cfg, S, B=B, **kw).split.grid[1]
        blocks = consts["FIXED_BLOCKS"]  # under the interpreter, the split's blocks as a constant
        assert options["num_warps"] == warps
        assert (splits - 1) * blocks * consts["BLOCK_N"] < S <= splits * blocks * consts["BLOCK_N"]
        if warps == 1:  # as many even splits as one wave holds
            assert splits == wave // (B * hkv)
            keys_per_split = -(-S // splits)
            assert blocks == -(-keys_per_split // consts["BLOCK_N"])
        else:
            assert blocks & (blocks - 1) == 0


def test_row_groups_name_what_fits():
    with pytest.raises(ValueError, match=r"row_groups=8 does not fit 4 query rows per tile and block_n=64; allowed"):
        _plan_options(KVQuantConfig(method="affine", bits=4), 32768, row_groups=8)


@pytest.mark.parametrize("method, bits, g, L, mask, num_splits, groups, extra", [
    ("affine", (4, 4), 4, 1, None, 1, 4, {}), ("affine", (4, 4), 4, 1, "padded", 3, 4, {}),
    ("affine", (2, 2), 4, 2, "causal", 1, 2, {}), ("affine", (3, 3), 1, 3, "bool", 3, 4, {}),
    ("affine", (4, 3), 2, 1, "additive", 1, 4, {}), ("affine", (2, 4), 8, 1, None, 3, 2, {}),
    # not defaults, but valid launches: 8-bit rows, turbo codes, a soft-cap
    ("affine", (8, 8), 4, 1, "bool", 1, 4, {}), ("turbo", (3, 2), 4, 1, "padded", 3, 4, {}),
    # turbo's defaults on long splits: 2 groups, 4 with 3-bit operands
    ("turbo", (4, 4), 4, 1, "padded", 3, 2, {}), ("turbo", (8, 4), 3, 1, "bool", 1, 2, {}),
    ("turbo", (3, 3), 4, 1, None, 3, 4, {}), ("turbo", (8, 8), 4, 1, "causal", 3, 2, {}),
    ("affine", (4, 4), 4, 1, None, 3, 4, {"softcap": 5.0}),
])
def test_row_groups_match_the_oracle(method, bits, g, L, mask, num_splits, groups, extra):
    # one-warp tiles of 4 or 8 query rows repeat down the MMA's 16 rows, each group reading its own
    # part of every block; the groups merge after the loop. 201 keys: the last block's groups are
    # partly and wholly past the end
    out, ref = _case(method, *bits, B=2, hkv=2, g=g, L=L, S=201, D=64, mask=mask, seed=g + L, num_warps=1,
                     block_n=64, num_splits=num_splits, row_groups=groups, **extra)
    assert _rel(out, ref) < TOL


@pytest.mark.parametrize("method, bits, mask, groups", [
    ("turbo", (4, 4), "padded", 4), ("turbo", (4, 4), None, 2), ("turbo", (2, 2), "bool", 4),
    ("affine", (4, 4), "bool", 4), ("affine", (8, 8), "additive", 4), ("affine", (2, 2), "padded", 2),
    ("affine", (8, 8), "bool", 2), ("affine", (4, 2), None, 2), ("turbo", (4, 4), "additive", 2),  # the defaults
])
def test_four_warp_row_groups_match_the_oracle(method, bits, mask, groups):
    # row groups in a short cache's four-warp programs (a launch override): the groups' rescales are not
    # skipped there, and the last block's groups run partly and wholly past 201 keys
    out, ref = _case(method, *bits, B=2, hkv=2, g=4, L=1, S=201, D=64, mask=mask, seed=groups + bits[0], num_warps=4,
                     block_n=64 if DEVICE == "cpu" else 128, num_splits=2, row_groups=groups)
    assert _rel(out, ref) < TOL


@pytest.mark.parametrize("method, bits, L, mask, num_splits, groups", [
    ("affine", (4, 4), 1, "padded", 3, 4), ("affine", (8, 8), 1, "bool", 4, 1), ("affine", (3, 2), 2, "causal", 2, 1),
    ("turbo", (3, 2), 1, None, 3, 1), ("affine", (2, 4), 1, "additive", 1, 2),
])
def test_rotated_walks_match_the_oracle(method, bits, L, mask, num_splits, groups):
    # each one-warp program starts its split at its own block and wraps around (rotate_blocks); 201
    # keys leave the last split's blocks partly and wholly past the end, wherever the walk meets them
    out, ref = _case(method, *bits, B=2, hkv=2, g=4, L=L, S=201, D=64, mask=mask, seed=7, num_warps=1,
                     block_n=16 * groups, num_splits=num_splits, row_groups=groups, rotate_blocks=True)
    assert _rel(out, ref) < TOL


@pytest.mark.parametrize("method, bits, warps", [("affine", 8, 1), ("affine", 4, 1), ("turbo", 2, 1), ("turbo", 4, 1),
                                                ("turbo", 8, 1)])
def test_one_warp_programs_rotate_their_walk(method, bits, warps):
    options, consts = _plan_options(KVQuantConfig(method=method, bits=bits), 32768)
    assert options["num_warps"] == warps and consts["ROTATE"] == (warps == 1)
    assert not _plan_options(KVQuantConfig(method=method, bits=bits), 32768, rotate_blocks=False)[1]["ROTATE"]


@pytest.mark.parametrize("groups, tile", [(1, True), (4, False), (4, True), (2, True)])
def test_query_sums_as_a_score_tile_or_a_vector(groups, tile):
    # affine keys' zero points meet Σq as an MMA-made score tile (default with row groups) or a vector
    assert _plan_options(KVQuantConfig(method="affine", bits=4), 32768, keys_major=False)[1]["Q_SUM_TILE"]
    assert _plan_options(KVQuantConfig(method="affine", bits=4), 1024)[1]["Q_SUM_TILE"]  # four-warp row groups
    assert not _plan_options(KVQuantConfig(method="affine", bits=4), 1024, row_groups=1)[1]["Q_SUM_TILE"]
    assert not _plan_options(KVQuantConfig(method="turbo", bits=4), 32768)[1]["Q_SUM_TILE"]
    out, ref = _case("affine", 4, 2, B=2, hkv=2, g=4, L=1, S=201, D=64, mask="padded", seed=groups, num_warps=1,
                     block_n=64, num_splits=2, row_groups=groups, query_sum_tile=tile)
    assert _rel(out, ref) < TOL


@pytest.mark.parametrize("g, L, S, mask, groups", [(4, 1, 1, None, 4), (4, 1, 10, None, 4), (1, 5, 77, "causal", 2)])
def test_row_groups_where_groups_see_no_key(g, L, S, mask, groups):
    # caches shorter than a block leave whole groups without keys (running max -inf: they must
    # weigh nothing in the merge); 5 query rows leave padding rows in each group of 8
    out, ref = _case("affine", 4, 4, B=2, hkv=2, g=g, L=L, S=S, D=64, mask=mask, seed=S, num_warps=1, block_n=64,
                     num_splits=2, row_groups=groups)
    assert _rel(out, ref) < TOL


@pytest.mark.parametrize("trend", ["rising", "falling", "flat"])
@pytest.mark.parametrize("bits, block_n, groups", [(8, 16, 1), (4, 16, 1), (3, 16, 1), (4, 64, 4), (2, 32, 2)])
def test_one_warp_rescales_where_the_running_max_rises(trend, bits, block_n, groups):
    # one program over many blocks: rising scores move the running max in every block (each block
    # rescales), falling ones only in the first (later blocks skip the rescale), flat ones now and then
    B, hkv, g, S, D = 1, 2, 4, 160, 64
    gen = torch.Generator().manual_seed(bits)
    ramp = {"rising": torch.linspace(-1, 1, S), "falling": torch.linspace(1, -1, S), "flat": torch.zeros(S)}[trend]
    q = (torch.randn(B, hkv * g, 1, D, generator=gen) + 1).to(DEVICE)
    k = torch.randn(B, hkv, S, D, generator=gen) * 0.5 + ramp[:, None]  # q · k trends with the ramp
    v = torch.randn(B, hkv, S, D, generator=gen)
    cfg = KVQuantConfig(method="affine", bits=bits)
    kq, vq = quantize_kv(k.to(DEVICE), cfg), quantize_kv(v.to(DEVICE), cfg, role="v")
    out = decode_attention(q, kq.codes, kq.meta.flatten(-2), vq.codes, vq.meta.flatten(-2), kq.spec, vq.spec, D,
                           num_warps=1, num_splits=1, block_n=block_n, row_groups=groups)
    assert _rel(out, reference_attention(q, kq, vq)) < TOL


@pytest.mark.parametrize("bits", [(4, 4), (8, 8), (3, 4)])
def test_turbo_long_cache_defaults_match_the_oracle(bits):
    # the plans a long turbo cache gets by default (one-warp programs of three stages from 2048 keys,
    # 8-bit codes at every length), here (the interpreter) gathering the levels as one flat vector
    options, _ = _plan_options(KVQuantConfig(method="turbo", bits=4, k_bits=bits[0], v_bits=bits[1]), 2100)
    assert options["num_warps"] == 1 and options["num_stages"] == 3
    out, ref = _case("turbo", *bits, B=1, hkv=2, g=4, L=1, S=2100, D=64, mask="padded", seed=sum(bits))
    assert _rel(out, ref) < TOL


@pytest.mark.gpu
@pytest.mark.parametrize("method, bits", [("affine", (4, 4)), ("affine", (3, 3)), ("affine", (2, 2)),
                                          ("affine", (8, 8)), ("affine", (8, 4)), ("turbo", (3, 3)), ("turbo", (2, 3)),
                                          ("turbo", (4, 4))])
@pytest.mark.parametrize("L", [1, 2])
def test_one_warp_programs_on_a_long_cache(method, bits, L):
    # the defaults a long cache gets (one warp per program), odd length, padding mask, GQA 4
    out, ref = _case(method, *bits, B=3, hkv=8, g=4, L=L, S=8193, D=128, mask="padded", seed=L, dtype=torch.bfloat16,
                     block_n=None)
    assert _rel(out.to(torch.bfloat16), ref) < TOL


@pytest.mark.gpu
@pytest.mark.parametrize("method, bits", [("turbo", (4, 4)), ("turbo", (8, 2)), ("affine", (4, 8))])
@pytest.mark.parametrize("L", [1, 2])
def test_keys_major_tiles_on_a_long_cache(method, bits, L):
    # keys-major one-warp tiles at full size, by default (turbo 4-bit and 8-bit's row grid, affine)
    out, ref = _case(method, *bits, B=3, hkv=8, g=4, L=L, S=8193, D=128, mask="padded", seed=L, dtype=torch.bfloat16,
                     block_n=None, keys_major=True)
    assert _rel(out.to(torch.bfloat16), ref) < TOL


@pytest.mark.parametrize("bits", [(3, 3), (3, 8), (2, 2), (4, 4)])
@pytest.mark.parametrize("D", [80, 128])
def test_turbo_kernel_roundings_fit_the_bound(bits, D, monkeypatch):
    """The decode kernel's roundings on turbo codes, emulated in float64 on the CPU: the rotated query
    in fp16 and the centroids as its fp16 table (the MMAs' operands), the output in bf16; the inputs
    of ``test_register_lut_on_gpu``'s one-warp case. While the codes meant the float64 Lloyd–Max
    levels, the H200 gave turbo 3-bit keys at head_dim 80 2.06e-3 / 2.01e-3 (values 3 / 8-bit) and
    this emulation 2.056e-3 / 2.007e-3; the levels are fp16 numbers now (``turbo_centroids``)."""
    from turboquant.quant import turbo
    from turboquant.quant.rotation import rotation_matrix
    from turboquant.quant.turbo import turbo_centroids

    S = 8193
    gen = torch.Generator().manual_seed(S + D)
    q = torch.randn(3, 32, 1, D, generator=gen).to(torch.bfloat16)
    k = torch.randn(3, 8, S, D, generator=gen) * 2
    v = torch.randn(3, 8, S, D, generator=gen)
    cfg = KVQuantConfig(method="turbo", bits=4, k_bits=bits[0], v_bits=bits[1])
    kq, vq = quantize_kv(k, cfg), quantize_kv(v, cfg, role="v")
    for x in (kq, vq):  # what the kernel's table holds is what the codes mean
        assert torch.equal(co._centroids_fp16(D, x.spec.bits).double(), turbo_centroids(D, x.spec.bits))
    m = torch.ones(3, 1, 1, S, dtype=torch.bool)
    m[0, ..., : S // 3] = False
    ref = reference_attention(q, kq, vq, attn_mask=m)
    r = rotation_matrix(D, kq.spec.seed, dtype=torch.float64)
    q_seen = (q.double() @ r.T).to(torch.float16).double() @ r  # the kernel rotates q, then rounds to fp16
    tables = {b: co._centroids_fp16(D, b) for b in set(bits)}  # the codes decoded through the kernel's tables
    monkeypatch.setattr(turbo, "turbo_centroids", lambda d, b, device=None, dtype=torch.float64: tables[b].to(dtype))
    out = reference_attention(q_seen, kq, vq, attn_mask=m).to(torch.bfloat16)
    assert _rel(out, ref) < TOL


@pytest.mark.gpu
@pytest.mark.parametrize("method", ["affine", "turbo"])
@pytest.mark.parametrize("bits", [(2, 2), (3, 3), (8, 2), (4, 4)])
@pytest.mark.parametrize("S", [17, 8193])  # four-warp and one-warp programs
@pytest.mark.parametrize("D", [64, 96])
def test_narrow_heads_on_gpu(method, bits, S, D):
    # rows of fewer than 16 words: 2-bit codes a byte per plane column (_byte_cols), strides the JIT
    # marks with no alignment (_code_alignment: 8-word 2-bit rows, 24-byte 3-bit rows, 96-dim rows)
    out, ref = _case(method, *bits, B=3, hkv=8, g=4, L=1, S=S, D=D, mask="padded", seed=S + D,
                     dtype=torch.bfloat16, block_n=None)
    assert _rel(out.to(torch.bfloat16), ref) < TOL


@pytest.mark.gpu
@pytest.mark.parametrize("bits", [(3, 3), (4, 4)])
@pytest.mark.parametrize("S", [17, 8193])  # four-warp and one-warp programs
@pytest.mark.parametrize("D", [64, 96, 256])
def test_shuffle_lookups_at_other_head_dims_on_gpu(bits, S, D):
    # the shuffle lookups of 3/4-bit turbo codes (polynomial_levels=False) at the head dims
    # test_register_lut_on_gpu leaves out: row words of 8 to 64 columns per plane, 96 not a power of two (R read
    # as a matrix)
    args = dict(B=3, hkv=8, g=4, L=1, S=S, D=D, mask="padded", seed=S + D, dtype=torch.bfloat16, block_n=None,
                polynomial_levels=False)
    shfl, ref = _case("turbo", *bits, shuffle_lut=True, **args)
    gather, _ = _case("turbo", *bits, register_lut=False, shuffle_lut=False, **args)
    assert _rel(shfl, gather.double()) < 1e-3, (_rel(shfl, ref), _rel(gather, ref))
    assert _rel(shfl, ref) < TOL


@pytest.mark.gpu
@pytest.mark.parametrize("bits", [(8, 8), (8, 4), (3, 8), (4, 4), (3, 3)])
@pytest.mark.parametrize("S", [17, 8193])
@pytest.mark.parametrize("D", [64, 80, 128, 256])
def test_polynomial_levels_on_gpu(bits, S, D):
    # 3/4/8-bit levels computed by the PTX polynomial, keys and values: the table's fp16 numbers into the
    # same MMAs as the lookups' (3/4-bit: shuffles or permutes; 8-bit: the gather); and against the oracle
    args = dict(B=3, hkv=8, g=4, L=1, S=S, D=D, mask="padded", seed=S + D, dtype=torch.bfloat16, block_n=None)
    poly, ref = _case("turbo", *bits, **args)
    gather, _ = _case("turbo", *bits, polynomial_levels=False, **args)
    assert _rel(poly, gather.double()) < 1e-3, (_rel(poly, ref), _rel(gather, ref))
    assert _rel(poly, ref) < TOL


@pytest.mark.gpu
@pytest.mark.parametrize("bits", [(2, 2), (3, 3), (4, 4), (4, 2), (3, 8)])
@pytest.mark.parametrize("S", [17, 8193])  # four-warp and one-warp programs
@pytest.mark.parametrize("D", [128, 80])
@pytest.mark.parametrize("lookup", ["register_lut", "shuffle_lut"])
def test_register_lut_on_gpu(bits, S, D, lookup):
    # the byte-permute (register_lut) or warp-shuffle (shuffle_lut) lookups in the compiled kernel,
    # keys and values: the same fp16 centroids into the same MMAs as the gather, so the same output
    # but for accumulation order; and the gather's output against the oracle
    args = dict(B=3, hkv=8, g=4, L=1, S=S, D=D, mask="padded", seed=S + D, dtype=torch.bfloat16, block_n=None,
                linear_levels=False, polynomial_levels=False)  # codes looked up: not fields in place, not computed
    lut, ref = _case("turbo", *bits, **({"shuffle_lut": True} if lookup == "shuffle_lut"
                                        else {"register_lut": True, "shuffle_lut": False}), **args)
    gather, _ = _case("turbo", *bits, register_lut=False, shuffle_lut=False, **args)
    assert _rel(lut, gather.double()) < 1e-3, (_rel(lut, ref), _rel(gather, ref))
    assert _rel(gather, ref) < TOL


@pytest.mark.gpu
@pytest.mark.parametrize("bits", [(2, 2), (2, 4), (3, 2)])
@pytest.mark.parametrize("S", [17, 8193, 40000])  # four-warp programs, one-warp ones, long splits (block sums)
@pytest.mark.parametrize("D", [64, 80, 128, 256])
def test_linear_two_bit_levels_on_gpu(bits, S, D):
    # 2-bit turbo codes as fields in place and their low bits (PTX ANDs) against the byte-permute table in
    # the compiled kernel, and against the oracle
    args = dict(B=3, hkv=8, g=4, L=1, S=S, D=D, mask="padded", seed=S + D, dtype=torch.bfloat16, block_n=None)
    if S > 32768:  # long splits at a small batch (the oracle's float copies of a large one filled the card)
        args |= dict(B=1, hkv=2, num_splits=8)
    lin, ref = _case("turbo", *bits, linear_levels=True, **args)
    table, _ = _case("turbo", *bits, linear_levels=False, **args)
    assert _rel(lin, table.double()) < 2e-3, (_rel(lin, ref), _rel(table, ref))
    assert _rel(lin, ref) < TOL


@pytest.mark.parametrize("method, bits, g, L, mask, num_splits, D", [
    ("affine", (4, 4), 4, 1, None, 2, 64), ("affine", (4, 4), 4, 1, "padded", 1, 64),  # one split: normalised
    ("affine", (8, 8), 8, 1, "bool", 2, 64), ("affine", (2, 2), 4, 2, "causal", 2, 128),
    ("affine", (8, 4), 1, 3, "additive", 3, 64), ("affine", (4, 2), 4, 4, "padded", 2, 128),  # 16 query rows
    ("affine", (2, 8), 8, 2, "bool", 1, 96),
    ("turbo", (4, 4), 4, 1, None, 2, 64), ("turbo", (8, 2), 8, 1, "bool", 1, 128),  # rotated back after the loop
    ("turbo", (2, 4), 4, 2, "causal", 3, 128), ("turbo", (4, 2), 4, 1, "padded", 2, 80),  # dense rotation back
])
def test_keys_major_tiles_match_the_oracle(method, bits, g, L, mask, num_splits, D):
    # scores [keys, rows] = K·Qᵀ, accumulators [dims, rows] = Vᵀ·Pᵀ (_keys_major): against the oracle and
    # against the row-major tile on the same codes and operands (2-bit turbo codes looked up in both, where
    # keys-major tiles would read them as fields by default)
    args = dict(B=2, hkv=2, g=g, L=L, S=201, D=D, mask=mask, seed=sum(bits) + g + L, num_warps=1, block_n=32,
                num_splits=num_splits, linear_levels=False)
    keys, ref = _case(method, *bits, keys_major=True, **args)
    rows, _ = _case(method, *bits, keys_major=False, **args)
    assert _rel(keys, ref) < TOL
    assert _rel(keys, rows.double()) < 1e-4


@pytest.mark.parametrize("bits, D, warps", [((8, 8), 128, 1), ((8, 4), 128, 1), ((2, 8), 128, 1), ((8, 8), 64, 1),
                                             ((8, 3), 96, 4)])
def test_eight_bit_row_grid_codes_read_as_fields_match_the_oracle(bits, D, warps):
    # turbo 8-bit rows of head_dim ≤ 128 (row_grid): fields in place by default, keys-major from head_dim 96 and
    # row-major below, against the oracle and against the same codes gathered from their table
    args = dict(B=2, hkv=2, g=4, L=1, S=97, D=D, mask="padded", seed=sum(bits) + D, num_warps=warps, num_splits=2)
    fields, ref = _case("turbo", *bits, **args)
    gathered, _ = _case("turbo", *bits, linear_levels=False, **args)
    assert _rel(fields, ref) < TOL
    assert _rel(fields, gathered.double()) < 1e-4


@pytest.mark.parametrize("block_sums", [False, True])
def test_keys_major_softcap_block_sums_and_a_ring(block_sums):
    from turboquant.ops import overlay_ring

    B, hkv, g, L, S, D, W = 2, 2, 4, 1, 45, 64, 5
    gen = torch.Generator().manual_seed(5)
    q = torch.randn(B, hkv * g, L, D, generator=gen).to(DEVICE)
    cfg = KVQuantConfig(method="affine", bits=4)
    kq = quantize_kv(torch.randn(B, hkv, S, D, generator=gen).to(DEVICE), cfg)
    vq = quantize_kv(torch.randn(B, hkv, S, D, generator=gen).to(DEVICE), cfg, role="v")
    k_ring = torch.randn(B, hkv, W, D, generator=gen).to(DEVICE)
    v_ring = torch.randn(B, hkv, W, D, generator=gen).to(DEVICE)
    ring_pos = torch.tensor([40, 41, 42, 43, 44], device=DEVICE)
    out = decode_attention(q, kq.codes, kq.meta.flatten(-2), vq.codes, vq.meta.flatten(-2), kq.spec, vq.spec, D,
                           softcap=4.0, num_splits=2, k_ring=k_ring, v_ring=v_ring, ring_pos=ring_pos, num_warps=1,
                           block_n=16, keys_major=True, block_sums=block_sums)
    k = overlay_ring(dequantize_kv(kq).double(), k_ring.double(), ring_pos)
    v = overlay_ring(dequantize_kv(vq).double(), v_ring.double(), ring_pos)
    assert _rel(out, reference_attention(q, k, v, softcap=4.0)) < TOL


@pytest.mark.parametrize("method, bits, D, S, keys", [
    ("affine", 4, 128, 32768, True), ("affine", 2, 128, 8192, True), ("affine", 8, 128, 4096, True),
    ("affine", (8, 4), 128, 32768, True), ("affine", 4, 256, 32768, True), ("affine", 8, 96, 32768, True),
    ("affine", 4, 64, 32768, False),  # head_dim 64: more loop instructions than with row groups; not timed
    ("affine", 2, 64, 32768, False),  # head_dim 64 2-bit: byte columns
    ("affine", 3, 128, 32768, False), ("affine", (4, 3), 128, 32768, False),  # 3-bit byte planes
    ("turbo", 4, 128, 32768, True), ("turbo", (2, 4), 128, 8192, True),  # turbo 2/4-bit: 5–12% faster (H100)
    ("turbo", 8, 256, 32768, False), ("turbo", (8, 2), 256, 32768, False),  # turbo 8-bit's polynomial: 1% slower
    ("turbo", 8, 128, 32768, True), ("turbo", (8, 2), 128, 32768, True),  # a row's grid: fields, as affine 8-bit
    ("turbo", 4, 64, 32768, False),  # head_dim 64: not timed
    ("affine", 4, 128, 1024, False), ("turbo", 2, 128, 1024, False),  # short caches: four-warp programs
])
def test_keys_major_tiles_go_to_one_warp_words(method, bits, D, S, keys):
    k_bits, v_bits = bits if isinstance(bits, tuple) else (bits, bits)
    cfg = KVQuantConfig(method=method, bits=4, k_bits=k_bits, v_bits=v_bits)
    consts = _plan_options(cfg, S, D=D)[1]
    assert consts["KEYS_MAJOR"] == keys
    if keys:  # no row groups: the tile is GQA 4's rows on the MMAs' N side
        assert consts["NG"] == 1 and consts["M"] == 4 and not consts["Q_SUM_TILE"]
    # a caller's row groups keep the row-major tile
    assert not _plan_options(cfg, S, D=D, row_groups=1)[1]["KEYS_MAJOR"]


@pytest.mark.parametrize("bits, S, L, wide", [
    (2, 32768, 1, True), (2, 65536, 1, True),   # splits of 2048 / 4096 keys: 128-key blocks, 2 stages
    (2, 4096, 1, False),                         # 256 keys a split: not timed
    (2, 32768, 2, False),                        # tiles of 8 rows: not timed
    (4, 32768, 1, False), (8, 32768, 1, False),  # 4-bit 103.4 → 105.5 µs, 8-bit 189.3 → 201.3 (H100)
    ((2, 4), 32768, 1, False),
])
def test_long_two_bit_keys_major_splits_read_128_key_blocks(monkeypatch, bits, S, L, wide):
    # H100, 32K, same process: affine 2-bit 62.75 → 60.25 µs (and 63.31 → 60.34 the session before)
    from turboquant.templates import decode_attention as da

    monkeypatch.setattr(da, "CPU_PLAN_MULTIPROCESSORS", 132)
    k_bits, v_bits = bits if isinstance(bits, tuple) else (bits, bits)
    cfg = KVQuantConfig(method="affine", bits=4, k_bits=k_bits, v_bits=v_bits)
    plan = _plan(cfg, S, L=L, B=8)
    consts = da.split_constants(plan)
    assert consts["KEYS_MAJOR"] and plan.split.options["num_warps"] == 1
    narrow = 32 if 8 in (k_bits, v_bits) else 64  # one-warp programs' block otherwise
    assert (consts["BLOCK_N"], plan.split.options["num_stages"]) == ((128, 2) if wide else (narrow, 3))
    splits, split_blocks = plan.split.grid[1], plan.split.tail[2]
    assert splits * split_blocks * consts["BLOCK_N"] >= S > (splits - 1) * split_blocks * consts["BLOCK_N"]
    if wide:  # the wave's splits as with 64-key blocks: 8 programs an SM
        assert splits == 8 * 132 // 64
    # the query planes' load a plane at a time where 128-key blocks run (one load of the rows took ptxas to 168
    # registers from 242 there, and 59.07 → 64.65 µs); one load of the rows everywhere else
    assert consts["Q_ROW_LOAD"] == (not wide)
    # a caller's block or stages keep the rest of the defaults
    assert _plan_options(cfg, S, L=L, B=8, block_n=64)[0]["num_stages"] == 3
    assert _plan_options(cfg, S, L=L, B=8, num_stages=3)[1]["BLOCK_N"] == narrow


@pytest.mark.parametrize("bits, D", [(2, 128), (3, 128), (4, 80), (8, 64), (2, 64), ((4, 8), 96)])
def test_query_planes_from_one_row_load_or_a_load_a_plane(bits, D):
    # the query rows loaded once and split into planes in registers (default) or plane by plane: the same
    # numbers (2/3-bit rows: 8 planes, 4-bit: 4, 8-bit: 2; 64-dim 2-bit: 16-column planes past D / P)
    from turboquant.templates import decode_attention as da

    k_bits, v_bits = bits if isinstance(bits, tuple) else (bits, bits)
    assert _plan_options(KVQuantConfig(method="affine", bits=k_bits), 1024)[1]["Q_ROW_LOAD"]
    outs = [_case("affine", k_bits, v_bits, B=2, hkv=2, g=4, L=2, S=37, D=D, mask="causal", seed=k_bits,
                  num_splits=2, query_row_load=row)[0] for row in (True, False)]
    assert torch.equal(outs[0], outs[1])
    assert [da.split_constants(p)["Q_ROW_LOAD"] for p in list(da._PLANS.values())[-2:]] == [True, False]


def test_occupancy_cap_pads_the_split_programs_shared_memory():
    # a tuning experiment (does the CTA scheduler spread a wave evenly?): the split kernel launched with shared
    # memory padded so that at most occupancy_cap programs fit an SM; the call's literal tuning tuple carries it
    from turboquant.templates import decode_attention as da

    cfg = KVQuantConfig(method="affine", bits=4)
    assert _plan(cfg, 4096).split.min_shared == 0
    for cap in (5, 8, 12, 32):
        pad = _plan(cfg, 4096, occupancy_cap=cap).split.min_shared
        per = pad + da.PROGRAM_RESERVED_SHARED
        assert cap * per <= da.SM_SHARED_BYTES < (cap + 1) * per and pad <= da.MAX_PADDED_SHARED
    assert _plan(cfg, 4096, occupancy_cap=8).merge.min_shared == 0
    for bad in (4, 33, 8.0):
        with pytest.raises(ValueError, match=rf"occupancy_cap={bad!r}: allowed None or an integer from 5 to 32"):
            _plan(cfg, 4096, occupancy_cap=bad)
    out, ref = _case("affine", 4, 4, B=1, hkv=2, g=4, L=1, S=77, D=64, mask=None, seed=2, occupancy_cap=8)
    assert _rel(out, ref) < TOL
    assert next(reversed(da._PLANS.values())).split.min_shared == 28160


@pytest.mark.gpu
def test_an_occupancy_cap_changes_nothing_but_the_launch():
    # the same kernel and arguments, launched by torch's C++ launcher with padded shared memory
    from turboquant.templates import decode_attention as da

    args = dict(B=8, hkv=8, g=4, L=1, S=4099, D=128, mask="padded", seed=4, dtype=torch.bfloat16, block_n=None)
    capped, ref = _case("affine", 4, 4, occupancy_cap=8, **args)
    plan = next(reversed(da._PLANS.values()))
    assert plan.split.min_shared == 28160 and plan.split.static is not None
    capped, _ = _case("affine", 4, 4, occupancy_cap=8, **args)  # a later call: the static launch
    plain, _ = _case("affine", 4, 4, **args)
    assert torch.equal(capped, plain) and _rel(capped.to(torch.bfloat16), ref) < TOL


@pytest.mark.gpu
def test_long_two_bit_splits_on_the_gpu(monkeypatch):
    # the default plan of a long affine 2-bit cache at full size: 128-key blocks at 2 stages (_wide_key_blocks),
    # an odd length (the last split short), padding mask
    from turboquant.templates import decode_attention as da

    monkeypatch.setattr(da, "CPU_PLAN_MULTIPROCESSORS", torch.cuda.get_device_properties(0).multi_processor_count)
    S = 32768 + 17
    plan = _plan(KVQuantConfig(method="affine", bits=2), S, B=8)
    consts = da.split_constants(plan)
    assert (consts["BLOCK_N"], plan.split.options["num_stages"]) == (128, 2)
    out, ref = _case("affine", 2, 2, B=8, hkv=8, g=4, L=1, S=S, D=128, mask="padded", seed=3, dtype=torch.bfloat16,
                     block_n=None)
    assert _rel(out.to(torch.bfloat16), ref) < TOL


@pytest.mark.parametrize("num_splits", [1, 2])
def test_keys_major_two_bit_blocks_of_128_keys_at_two_stages(num_splits):
    # the tile _wide_key_blocks gives long 2-bit splits, on a short odd cache: against the oracle and the
    # 64-key tile on the same codes
    args = dict(B=2, hkv=2, g=4, L=1, S=301, D=128, mask="padded", seed=11, num_warps=1, num_splits=num_splits,
                keys_major=True)
    wide, ref = _case("affine", 2, 2, block_n=128, num_stages=2, **args)
    narrow, _ = _case("affine", 2, 2, block_n=64, num_stages=3, **args)
    assert _rel(wide, ref) < TOL
    assert _rel(wide, narrow.double()) < 1e-4


def test_keys_major_names_what_it_takes():
    with pytest.raises(ValueError, match=r"keys_major=True takes keys and values of 2, 4 or 8 bits.*"
                                         r"got turbo 3-bit keys and turbo 3-bit values of head_dim 128"):
        _plan_options(KVQuantConfig(method="turbo", bits=3), 32768, keys_major=True)
    with pytest.raises(ValueError, match=r"affine 2-bit values of head_dim 64"):  # 16-byte rows: byte columns
        _plan_options(KVQuantConfig(method="affine", bits=2), 32768, D=64, keys_major=True)
