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
def _sign_row(sign_ptr, P: tl.constexpr, PW: tl.constexpr, D: tl.constexpr):
    """``σ`` as ``[1, P·PW]`` (fp16 ±1, zeros past ``D``): row 0 of ``√D · R``, for :func:`_planes_of`."""
    d = tl.arange(0, P * PW)[None, :]
    return tl.load(sign_ptr + d, mask=d < D, other=0.0)


@triton.jit
def _hadamard_q_planes(q_rows, rot_ptr, P: tl.constexpr, PW: tl.constexpr, D: tl.constexpr):
    """The rotated query ``q Rᵀ`` as the ``P`` planes of :func:`_q_plane` (fp16 ``[M, PW]``), for the
    Hadamard form ``R = H · diag(σ) / √D`` with no matrix read, from the loaded query rows (:func:`_q_row`).

    Dim ``P·t + s`` splits into plane ``s`` and column ``t``, and Sylvester's ``H`` of order ``D`` into
    ``H_P[s, s'] · H_PW[t, t']``: each plane of ``q ∘ σ`` meets ``H_PW`` (two MMAs of ``PW`` columns,
    the matrix made from indices), then the planes mix by ``H_P`` in ``log2 P`` element-wise
    butterflies. ``σ`` is row 0 of ``√D · R`` (``H``'s first row is all ones)."""
    # q ∘ σ on the whole rows, then split: the planes' conversions follow the two loads
    q_signed = q_rows.to(tl.float32) * _sign_row(rot_ptr, P, PW, D).to(tl.float32)
    x0, x1, x2, x3, x4, x5, x6, x7 = _planes_of(q_signed, P, PW)
    h = _sylvester(PW, 0)
    z0 = _times_sylvester(x0, h)
    z1 = z0
    z2 = z0
    z3 = z0
    z4 = z0
    z5 = z0
    z6 = z0
    z7 = z0
    if P > 1:
        z1 = _times_sylvester(x1, h)
    if P > 2:
        z2 = _times_sylvester(x2, h)
        z3 = _times_sylvester(x3, h)
    if P > 4:
        z4 = _times_sylvester(x4, h)
        z5 = _times_sylvester(x5, h)
        z6 = _times_sylvester(x6, h)
        z7 = _times_sylvester(x7, h)
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
    # the signs first: loaded before a conversion's barriers, not one round trip per plane between stores
    g0, g1, g2, g3, g4, g5, g6, g7 = _planes_of(_sign_row(rot_ptr, P, PW, D), P, PW)
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
    _store_plane(row_ptr, w0 * k * g0.to(tl.float32), 0, P, PW, row_ok, D)
    if P > 1:
        _store_plane(row_ptr, w1 * k * g1.to(tl.float32), 1, P, PW, row_ok, D)
    if P > 2:
        _store_plane(row_ptr, w2 * k * g2.to(tl.float32), 2, P, PW, row_ok, D)
        _store_plane(row_ptr, w3 * k * g3.to(tl.float32), 3, P, PW, row_ok, D)
    if P > 4:
        _store_plane(row_ptr, w4 * k * g4.to(tl.float32), 4, P, PW, row_ok, D)
        _store_plane(row_ptr, w5 * k * g5.to(tl.float32), 5, P, PW, row_ok, D)
        _store_plane(row_ptr, w6 * k * g6.to(tl.float32), 6, P, PW, row_ok, D)
        _store_plane(row_ptr, w7 * k * g7.to(tl.float32), 7, P, PW, row_ok, D)


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
