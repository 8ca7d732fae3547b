"""The query into the decode kernel's planes and the output planes out (Triton).

Plane ``s`` of the keys meets the query dims ``P·t + s``, scaled to the plane's units; the value
accumulators are stored to the same strided output dims. Turbo keys meet the rotated query
``q Rᵀ`` and each split's output is rotated back before it is stored, so every part leaves in the
model's dims: for a power-of-two head_dim the Hadamard form ``R = H · diag(σ) / √D`` is made plane
by plane from indices (an in-plane Sylvester matrix, then butterflies across the planes), otherwise
``R`` (or ``√D · R``) is read, with fp16 MMAs on fp32 hi/lo halves either way.
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
def _q_plane(q_row_ptr, row_ok, q_hi, q_lo, rot_ptr, S: tl.constexpr, P: tl.constexpr, PW: tl.constexpr,
             D: tl.constexpr, DQ: tl.constexpr, BITS: tl.constexpr, TURBO: tl.constexpr, HADAMARD: tl.constexpr):
    """``q[:, P·t + S]`` (fp16 ``[M, PW]``), the query dims that meet plane ``S`` of the keys, times
    ``unit(0) / unit(S)`` (a power of two) so that every plane's dots come out in units of plane 0.

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
        SCALE: tl.constexpr = 1.0 / _plane_weight(S, BITS, TURBO)  # a power of two: exact
        q = tl.load(q_row_ptr + dim[None, :], mask=row_ok[:, None] & (dim[None, :] < D) & (S < P), other=0.0)
        return (q.to(tl.float32) * SCALE).to(tl.float16)


@triton.constexpr_function
def _below(d, p):
    """Columns of a plane that hold dims below ``d`` (``d / p``, the plane's width unpadded)."""
    return -(-int(d) // int(p))


@triton.jit
def _sylvester(PW: tl.constexpr, zero):
    """The Sylvester Hadamard matrix of order ``PW`` (fp16 ±1, ``[PW, PW]``): ``(−1)^popcount(i & j)``.
    ``zero``: a run-time 0 the compiler cannot fold, so that the copy made after the loop is made
    there and not kept alive through it (16 registers per thread at ``PW`` = 32 in one warp)."""
    tl.static_assert(PW <= 256)
    i = tl.arange(0, PW) + zero
    p = i[:, None] & tl.arange(0, PW)[None, :]
    p = p ^ (p >> 4)  # the parity of 8 bits folded into bit 0
    p = p ^ (p >> 2)
    p = p ^ (p >> 1)
    return (1 - 2 * (p & 1)).to(tl.float16)


@triton.jit
def _times_sylvester(x, h):
    """``x @ h`` (fp32) for fp32 ``x`` and a ±1 :func:`_sylvester` ``h``: two fp16 MMAs on ``x``'s
    halves, exact products, so fp32-accurate as the dense rotation's."""
    x_hi, x_lo = _split_fp16(x)
    return tl.dot(x_lo, h, tl.dot(x_hi, h))


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
def _signed_q_plane(q_row_ptr, row_ok, sign_ptr, h, S: tl.constexpr, P: tl.constexpr, PW: tl.constexpr,
                    D: tl.constexpr):
    """``(q ∘ σ)`` at dims ``P·t + S`` times the in-plane Hadamard matrix ``h``: plane ``S``'s share of
    the rotation before the planes mix (:func:`_hadamard_q_planes`)."""
    t = tl.arange(0, PW)
    dim = t * P + S
    ok = (dim < D) & (S < P)
    x = tl.load(q_row_ptr + dim[None, :], mask=row_ok[:, None] & ok[None, :], other=0.0).to(tl.float32)
    sign = tl.load(sign_ptr + dim, mask=ok, other=0.0).to(tl.float32)
    return _times_sylvester(x * sign[None, :], h)


@triton.jit
def _hadamard_q_planes(q_row_ptr, row_ok, rot_ptr, P: tl.constexpr, PW: tl.constexpr, D: tl.constexpr):
    """The rotated query ``q Rᵀ`` as the ``P`` planes of :func:`_q_plane` (fp16 ``[M, PW]``), for the
    Hadamard form ``R = H · diag(σ) / √D`` with no matrix read.

    Dim ``P·t + s`` splits into plane ``s`` and column ``t``, and Sylvester's ``H`` of order ``D`` into
    ``H_P[s, s'] · H_PW[t, t']``: each plane of ``q ∘ σ`` meets ``H_PW`` (two MMAs of ``PW`` columns,
    the matrix made from indices), then the planes mix by ``H_P`` in ``log2 P`` element-wise
    butterflies. ``σ`` is row 0 of ``√D · R`` (``H``'s first row is all ones)."""
    h = _sylvester(PW, 0)
    z0 = _signed_q_plane(q_row_ptr, row_ok, rot_ptr, h, 0, P, PW, D)
    z1 = z0
    z2 = z0
    z3 = z0
    z4 = z0
    z5 = z0
    z6 = z0
    z7 = z0
    if P > 1:
        z1 = _signed_q_plane(q_row_ptr, row_ok, rot_ptr, h, 1, P, PW, D)
    if P > 2:
        z2 = _signed_q_plane(q_row_ptr, row_ok, rot_ptr, h, 2, P, PW, D)
        z3 = _signed_q_plane(q_row_ptr, row_ok, rot_ptr, h, 3, P, PW, D)
    if P > 4:
        z4 = _signed_q_plane(q_row_ptr, row_ok, rot_ptr, h, 4, P, PW, D)
        z5 = _signed_q_plane(q_row_ptr, row_ok, rot_ptr, h, 5, P, PW, D)
        z6 = _signed_q_plane(q_row_ptr, row_ok, rot_ptr, h, 6, P, PW, D)
        z7 = _signed_q_plane(q_row_ptr, row_ok, rot_ptr, h, 7, P, PW, D)
    z0, z1, z2, z3, z4, z5, z6, z7 = _planes_hadamard(z0, z1, z2, z3, z4, z5, z6, z7, P)
    # a plane padded to 16 columns (D / P < 16) holds no dims past D / P: zeros there, as _q_plane's
    k = tl.where(tl.arange(0, PW) < _below(D, P), _inv_sqrt(D), 0.0)[None, :]
    return ((z0 * k).to(tl.float16), (z1 * k).to(tl.float16), (z2 * k).to(tl.float16), (z3 * k).to(tl.float16),
            (z4 * k).to(tl.float16), (z5 * k).to(tl.float16), (z6 * k).to(tl.float16), (z7 * k).to(tl.float16))


@triton.jit
def _store_hadamard_back(row_ptr, a0, a1, a2, a3, a4, a5, a6, a7, c, k, zero, rot_ptr, row_ok, P: tl.constexpr,
                         PW: tl.constexpr, D: tl.constexpr):
    """Store ``(y R) · k`` for the rotated-domain planes ``a_s = c · y_s`` (rows scaled into fp16's range
    by ``c``), ``R = H · diag(σ) / √D``: the planes meet ``H_PW``, mix by ``H_P``, and take ``σ``, as
    :func:`_hadamard_q_planes` in reverse (``H`` is symmetric)."""
    h = _sylvester(PW, zero)
    t = tl.arange(0, PW)
    live = (t < _below(D, P))[None, :]  # padding columns hold the lookups of zero codes
    w0 = _times_sylvester(tl.where(live, a0 / c, 0.0), h)
    w1 = w0
    w2 = w0
    w3 = w0
    w4 = w0
    w5 = w0
    w6 = w0
    w7 = w0
    if P > 1:
        w1 = _times_sylvester(tl.where(live, a1 / c, 0.0), h)
    if P > 2:
        w2 = _times_sylvester(tl.where(live, a2 / c, 0.0), h)
        w3 = _times_sylvester(tl.where(live, a3 / c, 0.0), h)
    if P > 4:
        w4 = _times_sylvester(tl.where(live, a4 / c, 0.0), h)
        w5 = _times_sylvester(tl.where(live, a5 / c, 0.0), h)
        w6 = _times_sylvester(tl.where(live, a6 / c, 0.0), h)
        w7 = _times_sylvester(tl.where(live, a7 / c, 0.0), h)
    w0, w1, w2, w3, w4, w5, w6, w7 = _planes_hadamard(w0, w1, w2, w3, w4, w5, w6, w7, P)
    k = k * _inv_sqrt(D)
    _store_signed_plane(row_ptr, w0 * k, rot_ptr, 0, P, PW, row_ok, D)
    if P > 1:
        _store_signed_plane(row_ptr, w1 * k, rot_ptr, 1, P, PW, row_ok, D)
    if P > 2:
        _store_signed_plane(row_ptr, w2 * k, rot_ptr, 2, P, PW, row_ok, D)
        _store_signed_plane(row_ptr, w3 * k, rot_ptr, 3, P, PW, row_ok, D)
    if P > 4:
        _store_signed_plane(row_ptr, w4 * k, rot_ptr, 4, P, PW, row_ok, D)
        _store_signed_plane(row_ptr, w5 * k, rot_ptr, 5, P, PW, row_ok, D)
        _store_signed_plane(row_ptr, w6 * k, rot_ptr, 6, P, PW, row_ok, D)
        _store_signed_plane(row_ptr, w7 * k, rot_ptr, 7, P, PW, row_ok, D)


@triton.jit
def _store_dense_back(row_ptr, a0, a1, a2, a3, a4, a5, a6, a7, c, k, rot_ptr, row_ok, P: tl.constexpr,
                      PW: tl.constexpr, D: tl.constexpr, DQ: tl.constexpr, HADAMARD: tl.constexpr):
    """Store ``(y R) · k`` for the rotated-domain planes ``a_s = c · y_s``, reading the rotation (``R`` in
    fp32, or ``√D · R`` in fp16) plane by plane: :func:`_rotated_back`."""
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
def _store_signed_plane(row_ptr, y, sign_ptr, S: tl.constexpr, P: tl.constexpr, PW: tl.constexpr, row_ok,
                        D: tl.constexpr):
    """Store plane ``S`` of ``y ∘ σ`` (dims ``P·t + S`` below ``D``)."""
    dim = tl.arange(0, PW) * P + S
    sign = tl.load(sign_ptr + dim, mask=dim < D, other=0.0).to(tl.float32)
    _store_plane(row_ptr, y * sign[None, :], S, P, PW, row_ok, D)


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
    else:
        s = tl.sum(_q_unscaled(q0, 0, BITS, TURBO) + _q_unscaled(q1, 1, BITS, TURBO)
                   + _q_unscaled(q2, 2, BITS, TURBO) + _q_unscaled(q3, 3, BITS, TURBO)
                   + _q_unscaled(q4, 4, BITS, TURBO) + _q_unscaled(q5, 5, BITS, TURBO)
                   + _q_unscaled(q6, 6, BITS, TURBO) + _q_unscaled(q7, 7, BITS, TURBO), axis=1)
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
