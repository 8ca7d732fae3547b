"""The query into the decode kernel's planes and the output planes out (Triton).

Plane ``s`` of the keys meets the query dims ``P·t + s``, scaled to the plane's units; the value
accumulators are stored to the same strided output dims. Turbo keys meet the rotated query
``q Rᵀ`` and each split's output is rotated back before it is stored, so every part leaves in the
model's dims: for a power-of-two head_dim the Hadamard form ``R = H · diag(σ) / √D`` is made plane
by plane from indices (an in-plane Sylvester matrix, then butterflies across the planes), with a
16-bit query in its own dtype and fp32 operands as bf16 pieces; otherwise ``R`` (or ``√D · R``) is
read, with fp16 MMAs on fp32 hi/lo halves.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .code_operands import _field_unit


@triton.constexpr_function
def _inv_sqrt(d):
    return float(int(d)) ** -0.5


@triton.jit
def _times_rotation(x_hi, x_lo, r, D: tl.constexpr, HADAMARD: tl.constexpr):
    """``x @ r`` (fp32) from ``x``'s fp16 halves and a loaded tile of the rotation: ``√D · R``
    (±1, exact in fp16: two MMAs, then ``1/√D``) for the Hadamard form, ``R`` (fp32: three MMAs on
    its halves, about 21 bits) otherwise."""
    if HADAMARD:
        m = r.to(tl.float16)
        y = (tl.dot(x_hi, m) + tl.dot(x_lo, m)) * _inv_sqrt(D)
    else:
        r_hi, r_lo = _split_fp16(r)
        y = tl.dot(x_hi, r_hi) + tl.dot(x_hi, r_lo) + tl.dot(x_lo, r_hi)
    return y


@triton.jit
def _split_fp16(x):
    """``x`` (fp32) as fp16 ``hi + lo``: two fp16 MMAs then carry about 21 bits of it."""
    hi = x.to(tl.float16)
    return hi, (x - hi.to(tl.float32)).to(tl.float16)


@triton.jit
def _q_halves(q_row_ptr, row_ok, D: tl.constexpr, DQ: tl.constexpr):
    """The whole query row ``[M, DQ]`` as fp16 hi/lo halves, which turbo's rotation reads."""
    d = tl.arange(0, DQ)
    return _split_fp16(tl.load(q_row_ptr + d[None, :], mask=row_ok[:, None] & (d[None, :] < D), other=0.0
                               ).to(tl.float32))


@triton.jit
def _planes_of(x, P: tl.constexpr, PW: tl.constexpr):
    """``x [R, P·PW]`` (column ``P·t + s`` holding dim ``P·t + s``) as its ``P`` planes ``[R, PW]``, plane ``s``
    the columns ``P·t + s``: eight tensors, zeros past ``P``. Splits in registers, after one load."""
    R: tl.constexpr = x.shape[0]
    zero = tl.zeros([R, PW], x.dtype)
    if P == 1:
        return x, zero, zero, zero, zero, zero, zero, zero
    elif P == 2:
        e0, e1 = tl.split(tl.reshape(x, [R, PW, 2]))
        return e0, e1, zero, zero, zero, zero, zero, zero
    elif P == 4:
        a, b = tl.split(tl.reshape(x, [R, PW, 2, 2]))  # bit 0 of s, then bit 1
        a0, a1 = tl.split(a)
        b0, b1 = tl.split(b)
        return a0, b0, a1, b1, zero, zero, zero, zero
    else:
        tl.static_assert(P == 8)
        a, b = tl.split(tl.reshape(x, [R, PW, 2, 2, 2]))  # bits 0, 1, 2 of s
        a0, a1 = tl.split(a)
        b0, b1 = tl.split(b)
        a00, a01 = tl.split(a0)
        a10, a11 = tl.split(a1)
        b00, b01 = tl.split(b0)
        b10, b11 = tl.split(b1)
        return a00, b00, a10, b10, a01, b01, a11, b11


@triton.jit
def _q_row(q_row_ptr, row_ok, P: tl.constexpr, PW: tl.constexpr, D: tl.constexpr):
    """The query rows as stored, ``[M, P·PW]`` (zeros past ``D``), which :func:`_planes_of` splits into the
    planes' dims. Loaded a plane at a time (:func:`_q_dims`), each plane's conversion to an MMA operand
    (through shared memory, between barriers) came before the next plane's load, which no barrier lets
    pass: one memory round trip a plane before the loop could start (sm_90 SASS: 4 in a row for 4-bit
    keys, 8 for 2- and 3-bit, 8 more for turbo's signs). Triton puts each load's conversion right after
    it, so the rows and turbo's signs (:func:`_sign_row`) are still two round trips."""
    d = tl.arange(0, P * PW)
    return tl.load(q_row_ptr + d[None, :], mask=row_ok[:, None] & (d[None, :] < D), other=0.0)


@triton.jit
def _q_dims(q_row_ptr, row_ok, S: tl.constexpr, P: tl.constexpr, PW: tl.constexpr, D: tl.constexpr):
    """Plane ``S``'s query dims alone, ``q[:, P·t + S]`` (``[M, PW]``; zeros past ``D`` and for ``S ≥ P``)."""
    dim = tl.arange(0, PW) * P + S
    return tl.load(q_row_ptr + dim[None, :], mask=row_ok[:, None] & (dim[None, :] < D) & (S < P), other=0.0)


@triton.jit
def _query_dims(q_row_ptr, row_ok, P: tl.constexpr, PW: tl.constexpr, D: tl.constexpr, ROW_LOAD: tl.constexpr):
    """The eight planes' query dims (:func:`_q_dims`): with ``ROW_LOAD`` from one load of the rows, split in
    registers (:func:`_q_row`), else a load a plane (``query_row_load`` of ``decode_attention``)."""
    if ROW_LOAD:
        return _planes_of(_q_row(q_row_ptr, row_ok, P, PW, D), P, PW)
    else:
        return (_q_dims(q_row_ptr, row_ok, 0, P, PW, D), _q_dims(q_row_ptr, row_ok, 1, P, PW, D),
                _q_dims(q_row_ptr, row_ok, 2, P, PW, D), _q_dims(q_row_ptr, row_ok, 3, P, PW, D),
                _q_dims(q_row_ptr, row_ok, 4, P, PW, D), _q_dims(q_row_ptr, row_ok, 5, P, PW, D),
                _q_dims(q_row_ptr, row_ok, 6, P, PW, D), _q_dims(q_row_ptr, row_ok, 7, P, PW, D))


@triton.jit
def _q_plane(q_dims, q_hi, q_lo, rot_ptr, S: tl.constexpr, P: tl.constexpr, PW: tl.constexpr,
             D: tl.constexpr, DQ: tl.constexpr, BITS: tl.constexpr, TURBO: tl.constexpr, HADAMARD: tl.constexpr):
    """``q[:, P·t + S]`` (fp16 ``[M, PW]``), the query dims that meet plane ``S`` of the keys (``q_dims``, a
    plane of :func:`_q_row`), times ``unit(0) / unit(S)`` (a power of two) so that every plane's dots come out in
    units of plane 0.

    Turbo keys: the dims of the rotated query ``q Rᵀ``, computed here from the halves of
    :func:`_q_halves` (fp32-accurate before the final fp16) instead of by a matmul launch before
    the kernel. ``rot_ptr``: ``R [D, D]`` fp32 (three fp16 MMAs with ``R``'s halves) or, for the
    Hadamard form, ``√D · R`` fp16 (entries ±1, exact: two MMAs, half the bytes), row-major both."""
    t = tl.arange(0, PW)
    dim = t * P + S
    if TURBO:
        d = tl.arange(0, DQ)
        # Rᵀ restricted to this plane's output dims: [DQ, PW], element (d, t) = R[P·t + S, d]
        ok = (d[:, None] < D) & (dim[None, :] < D) & (S < P)
        r = tl.load(rot_ptr + dim[None, :] * D + d[:, None], mask=ok, other=0.0)  # contiguous along d
        return _times_rotation(q_hi, q_lo, r, D, HADAMARD).to(tl.float16)
    else:
        return _in_field_units(q_dims, S, BITS)


@triton.constexpr_function
def _below(d, p):
    """Columns of a plane that hold dims below ``d`` (``d / p``, the plane's width unpadded)."""
    return -(-int(d) // int(p))


@triton.jit
def _sylvester(PW: tl.constexpr, zero, DTYPE: tl.constexpr):
    """The Sylvester Hadamard matrix of order ``PW`` (±1 in ``DTYPE``, fp16 or bf16, ``[PW, PW]``):
    ``(−1)^popcount(i & j)``, the parity put into the sign bit of 1.0 (no int-to-float conversion).
    ``zero``: a run-time 0 the compiler cannot fold, so that the copy made after the loop is made
    there and not kept alive through it (16 registers per thread at ``PW`` = 32 in one warp)."""
    tl.static_assert(PW <= 256)
    ONE: tl.constexpr = 0x3C00 if DTYPE == tl.float16 else 0x3F80  # 1.0's bits
    i = tl.arange(0, PW) + zero
    p = i[:, None] & tl.arange(0, PW)[None, :]
    p = p ^ (p >> 4)  # the parity of 8 bits folded into bit 0
    p = p ^ (p >> 2)
    p = p ^ (p >> 1)
    return (((p & 1) << 15) | ONE).to(tl.int16).to(DTYPE, bitcast=True)


@triton.jit
def _times_sylvester(x, h, GPU: tl.constexpr, PIECES: tl.constexpr):
    """``x @ h`` (fp32) for a ±1 :func:`_sylvester` ``h`` (bf16 for an fp32 ``x``, else ``x``'s dtype): exact
    products, fp32 sums. A 16-bit ``x`` (the query in its own dtype) is one MMA; an fp32 ``x`` one on each of
    its first ``PIECES`` bf16 pieces (``x = hi + mid + lo``: three carry all 24 of its bits, two 16, i.e. 2^-17
    of it, far below a bf16 or fp16 output's rounding). bf16 has fp32's range: no row needs scaling into fp16's."""
    if x.dtype == tl.float16 or x.dtype == tl.bfloat16:
        y = _dot_signs(x, h, GPU)
    else:
        tl.static_assert(PIECES == 2 or PIECES == 3)
        hi = x.to(tl.bfloat16)
        rest = x - hi.to(tl.float32)
        mid = rest.to(tl.bfloat16)
        y = _dot_signs(hi, h, GPU) + _dot_signs(mid, h, GPU)
        if PIECES == 3:
            y += _dot_signs((rest - mid.to(tl.float32)).to(tl.bfloat16), h, GPU)
    return y


@triton.jit
def _dot_signs(x, h, GPU: tl.constexpr):
    """``x @ h`` (fp32) for a 16-bit ``x`` and a ±1 ``h`` of its dtype: an MMA. Off the GPU (``GPU`` false:
    Triton's interpreter, whose bf16 dot multiplies the raw bits in Triton 3.6) the same sum in fp32."""
    if x.dtype == tl.bfloat16 and not GPU:
        y = tl.dot(x.to(tl.float32), h.to(tl.float32), input_precision="ieee")
    else:
        y = tl.dot(x, h)
    return y


@triton.constexpr_function
def _rotation_width(P, PW, WIDE=False):
    """Columns of the planes the Hadamard rotation runs on. Planes wider than 32 (8-bit rows of head_dim 128 and
    256, 4-bit ones of 256) rotate as 32-column parts, two or four times as many planes (at most 8;
    :func:`_split_planes`, :func:`_joined_planes`): the in-plane matrix made from indices is then a quarter or a
    sixteenth of the size, which one warp had built and moved into the MMA's operand layout at 128 entries a lane
    for planes of 64 and 512 for planes of 128, in the prologue and again in the epilogue (sm_90, turbo 8-bit at
    1K: 32.31 → 26.06 instructions per key of a split at head_dim 128), and the MMAs do a half or a quarter of
    the work.

    ``WIDE`` (the query's rotation in one-warp programs: ``wide_query_rotation`` of ``decode_attention``): parts of
    up to 64 columns. Query planes joined from 32-column parts (:func:`_joined_planes`' interleave) reach the
    loop in a layout whose MMA operands leave shared memory by ``LDS.64`` and moves every block, where planes
    rotated whole leave by ``LDSM`` as affine query planes do: sm_90 SASS of the loop at 32K, B=8, Hq=32, Hkv=8,
    warp instructions per key, parts of 32 → 64 (``benchmarks/decode_sass.py turbo BITS --S 32768
    [--head-dim 256] --no-wide-query-rotation``): turbo 8-bit at head_dim 128 18.28 → 17.00 (registers 168 →
    162; fixed work 1.24 → 1.34 a key), at 256 77.38 → 74.69, turbo 4-bit at 256 47.39 → 45.77. Not in four-warp
    programs, whose fixed work is most of a short split's (turbo 8-bit at 1K, 1696 → 1856 instructions a warp).
    H100, B=8, D=128, CUDA graph µs, parts of 32 → 64, same process (2026-12-07,
    ``benchmarks/results/session50_gpu/decode_variants_turbo8_h100.log``): turbo 8-bit 32K 185.5 → 184.1."""
    P, PW = int(P), int(PW)
    if WIDE and PW > 32:
        return min(PW, 64)
    return 32 if PW > 32 and P * PW // 32 <= 8 else PW


@triton.jit
def _interleaved(a, b):
    """``[R, 2·W]`` whose column ``2t`` is ``a``'s column ``t`` and ``2t + 1`` is ``b``'s."""
    return tl.reshape(tl.join(a, b), [a.shape[0], 2 * a.shape[1]])


@triton.jit
def _joined_planes(z0, z1, z2, z3, z4, z5, z6, z7, P: tl.constexpr, PW: tl.constexpr, RW: tl.constexpr):
    """The ``P`` planes of ``PW`` columns (dims ``P·t + s``) from the rotation's ``F·P`` planes of ``RW = PW / F``
    (dims ``F·P·t' + r``, ``F`` 2 or 4): plane ``s``'s column ``F·t' + u`` is plane ``P·u + s``'s column ``t'``.
    Planes past ``P`` repeat plane 0, as the rotation leaves them."""
    if RW < PW:
        tl.static_assert((PW == 2 * RW and (P == 2 or P == 4)) or (PW == 4 * RW and P == 2))
        if PW == 4 * RW:  # u = 0 … 3 are planes s, 2 + s, 4 + s, 6 + s
            z0, z1 = (_interleaved(_interleaved(z0, z4), _interleaved(z2, z6)),
                      _interleaved(_interleaved(z1, z5), _interleaved(z3, z7)))
            z2, z3, z4, z5, z6, z7 = z0, z0, z0, z0, z0, z0
        elif P == 2:
            z0, z1 = _interleaved(z0, z2), _interleaved(z1, z3)
            z2, z3, z4, z5, z6, z7 = z0, z0, z0, z0, z0, z0
        else:
            z0, z1, z2, z3 = _interleaved(z0, z4), _interleaved(z1, z5), _interleaved(z2, z6), _interleaved(z3, z7)
            z4, z5, z6, z7 = z0, z0, z0, z0
    return z0, z1, z2, z3, z4, z5, z6, z7


@triton.jit
def _split_planes(a0, a1, a2, a3, a4, a5, a6, a7, P: tl.constexpr, PW: tl.constexpr, RW: tl.constexpr):
    """The inverse of :func:`_joined_planes`: ``P`` planes of ``PW`` columns as ``F·P`` planes of ``RW = PW / F``
    (plane ``s``'s columns ``u`` mod ``F`` are plane ``P·u + s``: :func:`_planes_of` of each plane)."""
    if RW < PW:
        tl.static_assert((PW == 2 * RW and (P == 2 or P == 4)) or (PW == 4 * RW and P == 2))
        F: tl.constexpr = PW // RW
        b0, b1, b2, b3, _, _, _, _ = _planes_of(a0, F, RW)
        c0, c1, c2, c3, _, _, _, _ = _planes_of(a1, F, RW)
        if P == 4:
            d0, d1, _, _, _, _, _, _ = _planes_of(a2, F, RW)
            e0, e1, _, _, _, _, _, _ = _planes_of(a3, F, RW)
            a0, a1, a2, a3, a4, a5, a6, a7 = b0, c0, d0, e0, b1, c1, d1, e1
        elif F == 4:
            a0, a1, a2, a3, a4, a5, a6, a7 = b0, c0, b1, c1, b2, c2, b3, c3
        else:
            a0, a1, a2, a3, a4, a5, a6, a7 = b0, c0, b1, c1, b0, b0, b0, b0
    return a0, a1, a2, a3, a4, a5, a6, a7


@triton.jit
def _planes_hadamard(z0, z1, z2, z3, z4, z5, z6, z7, P: tl.constexpr):
    """The Hadamard transform of order ``P`` across planes (``y_s = Σ_s' (−1)^popcount(s & s') z_s'``):
    ``log2 P`` butterfly stages of element-wise adds, no data movement."""
    if P > 1:
        z0, z1 = z0 + z1, z0 - z1
    if P > 2:
        z2, z3 = z2 + z3, z2 - z3
        z0, z2 = z0 + z2, z0 - z2
        z1, z3 = z1 + z3, z1 - z3
    if P > 4:
        z4, z5 = z4 + z5, z4 - z5
        z6, z7 = z6 + z7, z6 - z7
        z4, z6 = z4 + z6, z4 - z6
        z5, z7 = z5 + z7, z5 - z7
        z0, z4 = z0 + z4, z0 - z4
        z1, z5 = z1 + z5, z1 - z5
        z2, z6 = z2 + z6, z2 - z6
        z3, z7 = z3 + z7, z3 - z7
    return z0, z1, z2, z3, z4, z5, z6, z7


@triton.jit
def _sign_row(sign_ptr, P: tl.constexpr, PW: tl.constexpr, D: tl.constexpr):
    """``σ`` as ``[1, P·PW]`` (fp16 ±1, zeros past ``D``): row 0 of ``√D · R``, for :func:`_planes_of`."""
    d = tl.arange(0, P * PW)[None, :]
    return tl.load(sign_ptr + d, mask=d < D, other=0.0)


@triton.jit
def _hadamard_q_planes(q_row_ptr, row_ok, rot_ptr, P: tl.constexpr, PW: tl.constexpr, D: tl.constexpr,
                       GPU: tl.constexpr, WIDE: tl.constexpr = False):
    """The rotated query ``q Rᵀ`` as the ``P`` planes of :func:`_q_plane` (fp16 ``[M, PW]``), for the
    Hadamard form ``R = H · diag(σ) / √D`` with no matrix read, from the query rows at ``q_row_ptr``.

    Dim ``P·t + s`` splits into plane ``s`` and column ``t``, and Sylvester's ``H`` of order ``D`` into
    ``H_P[s, s'] · H_PW[t, t']``: each plane of ``q ∘ σ`` meets ``H_PW`` (MMAs of ``PW`` columns, the
    matrix made from indices; planes of 64 as halves unless ``WIDE``, :func:`_rotation_width`), then the planes mix by
    ``H_P`` in ``log2 P`` element-wise butterflies. ``σ`` is row 0 of ``√D · R`` (``H``'s first row is all ones)."""
    # q ∘ σ on the whole rows, then split into planes. A 16-bit query stays in its dtype: σ is ±1, so q ∘ σ is
    # its sign bit flipped, and the MMA's products with ±1 are exact (one MMA a plane, where an fp32 query takes
    # three on its bf16 pieces). Its elements and σ's come in one load ([M, D, 2]: each query element beside its
    # sign), so the two arrive in one layout after one round trip: loaded apart, each load's conversion came
    # before the next load, which no barrier lets pass (two round trips before the loop)
    NATIVE: tl.constexpr = q_row_ptr.dtype.element_ty == tl.float16 or q_row_ptr.dtype.element_ty == tl.bfloat16
    if NATIVE:
        d = tl.arange(0, P * PW)[None, :, None]
        pair = tl.arange(0, 2)[None, None, :]
        ptrs = tl.where(pair == 0, q_row_ptr[:, :, None] + d, rot_ptr.to(q_row_ptr.dtype) + d)
        both = tl.load(ptrs, mask=(d < D) & ((pair == 1) | row_ok[:, None, None]), other=0.0)
        q_bits, sign_bits = tl.split(both.to(tl.int16, bitcast=True))
        q_signed = (q_bits ^ (sign_bits & -32768)).to(q_row_ptr.dtype.element_ty, bitcast=True)
    else:
        q_rows = _q_row(q_row_ptr, row_ok, P, PW, D)
        q_signed = q_rows.to(tl.float32) * _sign_row(rot_ptr, P, PW, D).to(tl.float32)
    RW: tl.constexpr = _rotation_width(P, PW, WIDE)  # the rotation's planes: RP of RW columns
    RP: tl.constexpr = P * PW // RW
    x0, x1, x2, x3, x4, x5, x6, x7 = _planes_of(q_signed, RP, RW)
    h = _sylvester(RW, 0, x0.dtype if NATIVE else tl.bfloat16)
    z0 = _times_sylvester(x0, h, GPU, 3)
    z1 = z0
    z2 = z0
    z3 = z0
    z4 = z0
    z5 = z0
    z6 = z0
    z7 = z0
    if RP > 1:
        z1 = _times_sylvester(x1, h, GPU, 3)
    if RP > 2:
        z2 = _times_sylvester(x2, h, GPU, 3)
        z3 = _times_sylvester(x3, h, GPU, 3)
    if RP > 4:
        z4 = _times_sylvester(x4, h, GPU, 3)
        z5 = _times_sylvester(x5, h, GPU, 3)
        z6 = _times_sylvester(x6, h, GPU, 3)
        z7 = _times_sylvester(x7, h, GPU, 3)
    z0, z1, z2, z3, z4, z5, z6, z7 = _planes_hadamard(z0, z1, z2, z3, z4, z5, z6, z7, RP)
    z0, z1, z2, z3, z4, z5, z6, z7 = _joined_planes(z0, z1, z2, z3, z4, z5, z6, z7, P, PW, RW)
    # a plane padded to 16 columns (D / P < 16) holds no dims past D / P: zeros there, as _q_plane's
    k = tl.where(tl.arange(0, PW) < _below(D, P), _inv_sqrt(D), 0.0)[None, :]
    return ((z0 * k).to(tl.float16), (z1 * k).to(tl.float16), (z2 * k).to(tl.float16), (z3 * k).to(tl.float16),
            (z4 * k).to(tl.float16), (z5 * k).to(tl.float16), (z6 * k).to(tl.float16), (z7 * k).to(tl.float16))


@triton.jit
def _store_hadamard_back(row_ptr, a0, a1, a2, a3, a4, a5, a6, a7, k, zero, rot_ptr, row_ok, P: tl.constexpr,
                         PW: tl.constexpr, D: tl.constexpr, GPU: tl.constexpr):
    """Store ``(y R) · k`` for the rotated-domain planes ``a_s = y_s`` (fp32), ``R = H · diag(σ) / √D``: the planes
    meet ``H_PW`` (on their bf16 halves, whose range is fp32's: rows need no scaling into fp16's), mix by ``H_P``,
    and take ``σ``, as :func:`_hadamard_q_planes` in reverse (``H`` is symmetric)."""
    RW: tl.constexpr = _rotation_width(P, PW)  # the rotation's planes: RP of RW columns
    RP: tl.constexpr = P * PW // RW
    # the signs first: loaded before a conversion's barriers, not one round trip per plane between stores
    g0, g1, g2, g3, g4, g5, g6, g7 = _planes_of(_sign_row(rot_ptr, RP, RW, D), RP, RW)
    a0, a1, a2, a3, a4, a5, a6, a7 = _split_planes(a0, a1, a2, a3, a4, a5, a6, a7, P, PW, RW)
    h = _sylvester(RW, zero, tl.bfloat16)
    t = tl.arange(0, RW)
    live = (t < _below(D, RP))[None, :]  # padding columns hold the lookups of zero codes
    w0 = _times_sylvester(tl.where(live, a0, 0.0), h, GPU, 2)
    w1 = w0
    w2 = w0
    w3 = w0
    w4 = w0
    w5 = w0
    w6 = w0
    w7 = w0
    if RP > 1:
        w1 = _times_sylvester(tl.where(live, a1, 0.0), h, GPU, 2)
    if RP > 2:
        w2 = _times_sylvester(tl.where(live, a2, 0.0), h, GPU, 2)
        w3 = _times_sylvester(tl.where(live, a3, 0.0), h, GPU, 2)
    if RP > 4:
        w4 = _times_sylvester(tl.where(live, a4, 0.0), h, GPU, 2)
        w5 = _times_sylvester(tl.where(live, a5, 0.0), h, GPU, 2)
        w6 = _times_sylvester(tl.where(live, a6, 0.0), h, GPU, 2)
        w7 = _times_sylvester(tl.where(live, a7, 0.0), h, GPU, 2)
    w0, w1, w2, w3, w4, w5, w6, w7 = _planes_hadamard(w0, w1, w2, w3, w4, w5, w6, w7, RP)
    k = k * _inv_sqrt(D)
    _store_plane(row_ptr, w0 * k * g0.to(tl.float32), 0, RP, RW, row_ok, D)
    if RP > 1:
        _store_plane(row_ptr, w1 * k * g1.to(tl.float32), 1, RP, RW, row_ok, D)
    if RP > 2:
        _store_plane(row_ptr, w2 * k * g2.to(tl.float32), 2, RP, RW, row_ok, D)
        _store_plane(row_ptr, w3 * k * g3.to(tl.float32), 3, RP, RW, row_ok, D)
    if RP > 4:
        _store_plane(row_ptr, w4 * k * g4.to(tl.float32), 4, RP, RW, row_ok, D)
        _store_plane(row_ptr, w5 * k * g5.to(tl.float32), 5, RP, RW, row_ok, D)
        _store_plane(row_ptr, w6 * k * g6.to(tl.float32), 6, RP, RW, row_ok, D)
        _store_plane(row_ptr, w7 * k * g7.to(tl.float32), 7, RP, RW, row_ok, D)


@triton.jit
def _store_dense_back(row_ptr, a0, a1, a2, a3, a4, a5, a6, a7, k, rot_ptr, row_ok, P: tl.constexpr,
                      PW: tl.constexpr, D: tl.constexpr, DQ: tl.constexpr, HADAMARD: tl.constexpr):
    """Store ``(a R) · k`` for the rotated-domain planes ``a_s`` (fp32), reading the rotation (``R`` in fp32,
    or ``√D · R`` in fp16) plane by plane: :func:`_rotated_back`. Each row is scaled by its largest magnitude
    ``c`` first, so that the fp16 halves of the MMAs neither overflow nor lose a row of small values."""
    c = tl.max(tl.abs(a0), axis=1)
    if P > 1:
        c = tl.maximum(c, tl.max(tl.abs(a1), axis=1))
    if P > 2:
        c = tl.maximum(tl.maximum(c, tl.max(tl.abs(a2), axis=1)), tl.max(tl.abs(a3), axis=1))
    if P > 4:
        c = tl.maximum(tl.maximum(c, tl.max(tl.abs(a4), axis=1)), tl.max(tl.abs(a5), axis=1))
        c = tl.maximum(tl.maximum(c, tl.max(tl.abs(a6), axis=1)), tl.max(tl.abs(a7), axis=1))
    c = tl.where(c > 0, c, 1.0)[:, None]
    k = c * k
    y = _rotated_back(a0 / c, 0, P, PW, rot_ptr, D, DQ, HADAMARD)
    if P > 1:
        y += _rotated_back(a1 / c, 1, P, PW, rot_ptr, D, DQ, HADAMARD)
    if P > 2:
        y += _rotated_back(a2 / c, 2, P, PW, rot_ptr, D, DQ, HADAMARD)
        y += _rotated_back(a3 / c, 3, P, PW, rot_ptr, D, DQ, HADAMARD)
    if P > 4:
        y += _rotated_back(a4 / c, 4, P, PW, rot_ptr, D, DQ, HADAMARD)
        y += _rotated_back(a5 / c, 5, P, PW, rot_ptr, D, DQ, HADAMARD)
        y += _rotated_back(a6 / c, 6, P, PW, rot_ptr, D, DQ, HADAMARD)
        y += _rotated_back(a7 / c, 7, P, PW, rot_ptr, D, DQ, HADAMARD)
    j = tl.arange(0, DQ)
    y = y * k
    tl.store(row_ptr + j[None, :], y.to(row_ptr.dtype.element_ty), mask=row_ok[:, None] & (j[None, :] < D))


@triton.jit
def _field_planes(q0, q1, q2, q3, q4, q5, q6, q7, P: tl.constexpr, BITS: tl.constexpr):
    """Query planes in plain units (turbo's rotated query) times ``unit(0) / unit(s)``, as :func:`_q_plane`'s
    affine planes: for turbo codes read as fields in place (linear levels, ``"lin"``). Powers of two: exact."""
    q0 = _in_field_units(q0, 0, BITS)
    if P > 1:
        q1 = _in_field_units(q1, 1, BITS)
    if P > 2:
        q2 = _in_field_units(q2, 2, BITS)
        q3 = _in_field_units(q3, 3, BITS)
    if P > 4:
        q4 = _in_field_units(q4, 4, BITS)
        q5 = _in_field_units(q5, 5, BITS)
        q6 = _in_field_units(q6, 6, BITS)
        q7 = _in_field_units(q7, 7, BITS)
    return q0, q1, q2, q3, q4, q5, q6, q7


@triton.jit
def _in_field_units(q, S: tl.constexpr, BITS: tl.constexpr):
    """Query dims in plain units as plane ``S``'s of fields in place: times ``unit(0) / unit(S)``."""
    SCALE: tl.constexpr = 1.0 / _plane_weight(S, BITS, False)  # a power of two: exact
    return (q.to(tl.float32) * SCALE).to(tl.float16)


@triton.jit
def _q_unscaled(q_plane, S: tl.constexpr, BITS: tl.constexpr, TURBO: tl.constexpr):
    """A query plane of :func:`_q_plane` back in plain units (fp32)."""
    return q_plane.to(tl.float32) * _plane_weight(S, BITS, TURBO)


@triton.jit
def _query_sums(q0, q1, q2, q3, q4, q5, q6, q7, P: tl.constexpr, PW: tl.constexpr, N: tl.constexpr,
                BITS: tl.constexpr, TURBO: tl.constexpr, AS_TILE: tl.constexpr):
    """``Σq`` of each query row in plain units, from the planes of :func:`_q_plane` (the fp16 query the
    dots see): ``[M]``, or with ``AS_TILE`` the ``[M, N]`` tile every column of which is ``Σq``, made by
    MMAs with ones (exact products, fp32 sums) so that it lies in the layout of an ``[M, N]`` score tile:
    the loop then multiplies it by the keys' zero points where it converted the outer product
    ``Σq ⊗ z`` through shared memory every block (:func:`~.decode_attention._query_sum_tile`)."""
    if AS_TILE:
        ones = tl.full([PW, N], 1.0, tl.float16)
        s = tl.dot(q0, ones) * _plane_weight(0, BITS, TURBO)
        if P > 1:
            s += tl.dot(q1, ones) * _plane_weight(1, BITS, TURBO)
        if P > 2:
            s += tl.dot(q2, ones) * _plane_weight(2, BITS, TURBO)
            s += tl.dot(q3, ones) * _plane_weight(3, BITS, TURBO)
        if P > 4:
            s += tl.dot(q4, ones) * _plane_weight(4, BITS, TURBO)
            s += tl.dot(q5, ones) * _plane_weight(5, BITS, TURBO)
            s += tl.dot(q6, ones) * _plane_weight(6, BITS, TURBO)
            s += tl.dot(q7, ones) * _plane_weight(7, BITS, TURBO)
    else:  # the planes past P are not all zeros (turbo's rotation leaves copies there)
        x = _q_unscaled(q0, 0, BITS, TURBO)
        if P > 1:
            x += _q_unscaled(q1, 1, BITS, TURBO)
        if P > 2:
            x += _q_unscaled(q2, 2, BITS, TURBO) + _q_unscaled(q3, 3, BITS, TURBO)
        if P > 4:
            x += (_q_unscaled(q4, 4, BITS, TURBO) + _q_unscaled(q5, 5, BITS, TURBO) + _q_unscaled(q6, 6, BITS, TURBO)
                  + _q_unscaled(q7, 7, BITS, TURBO))
        s = tl.sum(x, axis=1)
    return s


@triton.constexpr_function
def _plane_weight(s, bits, turbo):
    """What a query plane's value is worth in plain units (:func:`_q_unscaled`'s factor)."""
    return _field_unit(bits, turbo, s) / _field_unit(bits, turbo, 0)


@triton.jit
def _rotated_back(a, S: tl.constexpr, P: tl.constexpr, PW: tl.constexpr, rot_ptr, D: tl.constexpr,
                  DQ: tl.constexpr, HADAMARD: tl.constexpr):
    """Plane ``S`` of a row block in the rotated domain (``a [M, PW]``, dims ``P·t + S``, rows
    scaled into fp16's range) times those rows of ``R``: its share of ``y R`` (``[M, DQ]`` fp32).
    ``rot_ptr`` as for :func:`_q_plane`: ``R`` (fp32), or ``√D · R`` (fp16 ±1) for the
    Hadamard form."""
    t = tl.arange(0, PW)
    i = t * P + S
    j = tl.arange(0, DQ)
    ok = (i[:, None] < D) & (j[None, :] < D)
    a_hi, a_lo = _split_fp16(a)
    r = tl.load(rot_ptr + i[:, None] * D + j[None, :], mask=ok, other=0.0)  # rows of R: contiguous along j
    return _times_rotation(a_hi, a_lo, r, D, HADAMARD)


@triton.jit
def _store_plane(row_ptr, acc, S: tl.constexpr, P: tl.constexpr, PW: tl.constexpr, row_ok, D_OUT: tl.constexpr):
    """Store plane ``S`` of an output row block (dims ``P·t + S``, those below ``D_OUT``)."""
    t = tl.arange(0, PW)
    dim = t * P + S
    tl.store(row_ptr + dim[None, :], acc.to(row_ptr.dtype.element_ty), mask=row_ok[:, None] & (dim[None, :] < D_OUT))
