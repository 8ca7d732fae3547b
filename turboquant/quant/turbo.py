"""TurboQuant (arXiv 2504.19874), the MSE variant: rotate, keep the norm, scalar-quantize.

For a head vector ``x`` of ``d`` elements:

* ``n = ||x||`` is stored in the metadata dtype (saturating at its largest finite value);
* ``z = (x / n) @ R.T · √d`` (``R`` from :mod:`.rotation`), whose coordinates are close to
  standard normal whatever ``x`` was;
* each coordinate is replaced by the index of its nearest Lloyd–Max centroid
  (:mod:`.codebooks`; ties go to the lower code) — at 3, 4 and 8 bits the nearest value of an
  odd polynomial in the code fit to them (:data:`POLYNOMIAL_LEVELS`), at 2 bits of a uniform grid, and at 8 bits
  up to head_dim 128 of a uniform grid over the row's own range (:func:`row_grid`), which beats any fixed
  codebook there;
* decode: ``x̂ = n · (centroid[codes] / √d) @ R``.

Non-finite elements are quantized as if they were 0 (before the norm and the rotation,
which would otherwise spread one NaN over the whole vector). They decode to whatever the
rest of the vector puts there — close to 0, within the vector's quantization error.
The paper's optional 1-bit QJL residual is not used: it adds variance through softmax.
"""

from __future__ import annotations

import functools
import math

import torch

from ..compat import tracing_with_fake_tensors
from .affine import _finite, to_metadata
from .constants import as_constant
from .codebooks import (_cell_moments, code_offsets, codebook_boundaries, levels_mse, lloyd_max_codebook,
                        odd_polynomial_codebook)
from .packing import byte_sources, pack_sources, slot_owners
from .rotation import is_power_of_two, rotation_matrix, signed_hadamard

__all__ = ["turbo_quantize", "turbo_quantize_packed", "turbo_dequantize", "turbo_rotate", "turbo_centroids",
           "turbo_codebook_mse", "level_polynomial", "level_unit", "row_grid", "POLYNOMIAL_LEVELS",
           "ROW_GRID_HEAD_DIMS"]

# bits -> degree: widths whose levels are the fp16 values of an odd polynomial in the code (8 bits: above
# ROW_GRID_HEAD_DIMS' head dims)
# (:func:`level_polynomial`) rather than a free table. A GPU kernel computes such a level from the code in
# a few fp16x2 instructions per two codes (:func:`~turboquant.templates.code_operands._polynomial_asm`)
# where it looked the level up: a table of 256 levels was a shared-memory gather per code, which held turbo
# 8-bit decode attention at 0.45–0.65× bf16's speed on the H200 (1.20× at 32K computed; benchmarks/RESULTS.md);
# 3/4-bit tables were a warp shuffle per code, whose latency held their loops (ncu, H100, 32K: a third of the
# stall samples short-scoreboard waits on the shuffles; forty-sixth session). MSE over Lloyd–Max's at head_dim
# 64–256: 8-bit degree 7 1.041–1.047× (degree 5: 1.09–1.11×, degree 3: 1.26–1.30×); 4-bit degree 3
# 1.017–1.019× (degree 5: 1.0015–1.0017×, one more instruction per two codes; degree 1, a uniform grid:
# 1.19–1.21×); 3-bit degree 3 1.0019–1.0021× (degree 1: 1.076–1.082×); 2-bit degree 1, a uniform grid,
# 1.0105–1.0113×, whose levels the kernel reads as fields in place with no second operand for the code's low
# bit (:func:`~turboquant.templates.code_operands._linear_level_words`, γ = 0). The polynomial is kept divided by
# its top coefficient, which the stored norm carries (:func:`level_unit`), in a depressed form that takes one
# operation fewer than Horner's rule on its free coefficients (:func:`level_polynomial`; 3/4-bit 3 fp16x2
# operations per two codes, 8-bit 5; sm_90 SASS of the decode loop at 32K, warp instructions per key: 4-bit
# 29.11 → 25.08, 3-bit 34.23 → 30.48, 8-bit 43.41 → 39.31; forty-eighth session).
POLYNOMIAL_LEVELS = {2: 1, 3: 3, 4: 3, 8: 7}

# bits -> the largest head_dim whose codes are a uniform grid over each row's own range (:func:`row_grid`) instead
# of the polynomial's fixed levels. Expected squared error of a rotated unit vector at 8 bits (the plain norm;
# ``turbo_codebook_mse``), head_dim 64 / 80 / 96 / 128 / 256: Lloyd–Max 3.93 / 3.97 / 3.99 / 4.03 / 4.07e-5, the
# degree-7 polynomial 4.09 / 4.14 / 4.17 / 4.21 / 4.27e-5, the row's grid 3.48 / 3.71 / 3.88 / 4.16 / 4.81e-5: a
# range that fits the row beats any fixed codebook until the row's largest coordinate strays too far (it grows
# as √(2 ln d)), between 128 and 256. Its codes are fields in place in the decode kernel's MMAs, as affine codes
# are, where each polynomial level took six instructions per two codes.
ROW_GRID_HEAD_DIMS = {8: 128}


def turbo_rotate(x: torch.Tensor, seed: int, *, inverse: bool = False) -> torch.Tensor:
    """``x @ R.T`` (or ``x @ R`` with ``inverse=True``) along the last dim, in ``x``'s dtype."""
    r = rotation_matrix(x.shape[-1], seed, device=x.device, dtype=x.dtype)
    return x @ r if inverse else x @ r.T


def turbo_centroids(d: int, bits: int, *, device=None, dtype=torch.float64) -> torch.Tensor:
    """The levels as tables hold them and the stored norm multiplies them (units of the unit vector's
    coordinates, already divided by ``√d``, over :func:`level_unit`); one tensor per device and dtype (see
    :func:`~.constants.as_constant`).

    fp16 numbers (:func:`_fp16_levels`), so every dtype that holds them (the float64 oracle, the kernels' fp16
    and fp32 tables) holds the same numbers."""
    return as_constant(_fp16_levels, d, bits, device=device, dtype=dtype)


def turbo_codebook_mse(d: int, bits: int) -> float:
    """Expected squared error of one rotated unit vector quantized to the levels turbo uses (its
    fp16 levels; for :data:`POLYNOMIAL_LEVELS` widths, the polynomial's, times :func:`level_unit`):
    :func:`~.codebooks.codebook_mse` of the levels actually searched. A :func:`row_grid`'s levels are each row's:
    the mean over 20000 random unit vectors (fixed seed)."""
    if row_grid(d, bits):
        return _row_grid_mse(int(d), int(bits))
    return levels_mse(d, _searched_levels(d, bits))


def row_grid(d: int, bits: int) -> bool:
    """Whether ``bits``-bit codes of head_dim ``d`` are a uniform grid over each row's own range
    (:data:`ROW_GRID_HEAD_DIMS`: 8 bits up to head_dim 128) rather than fixed levels: with ``h = (2^bits − 1)/2``
    and ``step = max|z| / h`` per row, code ``c = floor(z / step) + 2^(bits−1)`` (clamped) means ``(c − h)·step``,
    the table level ``u_c = (c − h) / 2^(bits−1)`` (:func:`level_polynomial` of degree 1) times the row's
    ``2^(bits−1)·step``, which the stored norm carries (rescaled, it is the norm over the table levels' norm, as
    for every width; else the norm times it)."""
    return int(d) <= ROW_GRID_HEAD_DIMS.get(int(bits), 0)


def _row_grid_codes(z: torch.Tensor, top: torch.Tensor, bits: int):
    """``(codes int32, unit float64)`` of :func:`row_grid`'s rows: ``z`` (units of ``1/√d``) and ``top``, its row's
    largest ``|z|`` (broadcastable); ``unit`` is what one table unit is worth in ``z``'s units. In float64, where
    eager code and a compiled graph divide alike (a GPU's float32 division need not round to nearest); a zero row's
    codes are the two middle ones, which decode to 0 with its zero norm."""
    half = 1 << (bits - 1)
    top = top.double()
    step = torch.where(top > 0, top / (half - 0.5), torch.ones_like(top))
    codes = (torch.floor(z.double() / step) + half).clamp(0, 2 * half - 1).to(torch.int32)
    return codes, step * half


@functools.lru_cache(maxsize=None)
def _row_grid_mse(d: int, bits: int, rows: int = 20000) -> float:
    """What a row grid's expected squared error would be at any head_dim (the grid's table, whatever
    :func:`row_grid` says of ``d``): a fixed-seed mean over random unit vectors."""
    x = torch.randn(rows, d, generator=torch.Generator().manual_seed(d * 64 + bits), dtype=torch.float64)
    z = x / torch.linalg.vector_norm(x, dim=-1, keepdim=True) * d ** 0.5
    codes, unit = _row_grid_codes(z, z.abs().amax(-1, keepdim=True), bits)
    return float(((code_offsets(bits)[codes.long()] * unit - z) ** 2).sum(-1).mean() / d)


def level_polynomial(d: int, bits: int) -> tuple:
    """The fp16 numbers ``(k0, k1, …)`` whose chain gives a :data:`POLYNOMIAL_LEVELS` width's table levels
    (:func:`turbo_centroids`): with ``u = (2k + 1)/2^bits − 1`` and ``y = u·u + k0``, ``p = y``, then
    ``p = p·y + k_i`` for ``i = 1, 2, …``, and ``level(k) = p·u``; every operation rounded to fp16 (one fused
    multiply-add each, :func:`_polynomial_levels`). Degree 1 has no numbers: ``level(k) = u``.

    That is :func:`~.codebooks.odd_polynomial_codebook`'s odd polynomial divided by its top coefficient, which
    :func:`level_unit` is (the stored norm carries it), written as a polynomial in ``w = u²`` that is monic and
    shifted by ``k0`` to lose its second-highest power (depressed), so that Horner's rule in ``y`` starts at
    ``y`` itself: degree 3 ``y·u``, 5 ``(y² + k1)·u``, 7 ``(y³ + k1·y + k2)·u``. One operation fewer than
    Horner's rule on the free coefficients in ``w`` (``w = u·u`` made apart): a kernel makes ``u`` from the
    code's bits in one fma (:func:`~turboquant.templates.code_operands._polynomial_asm`), then ``degree/2 + 1``
    more for the level."""
    if row_grid(d, bits):
        return ()
    return _level_form(int(d), int(bits))[0]


def level_unit(d: int, bits: int) -> float:
    """What one unit of :func:`turbo_centroids` is worth in the quantizer's levels (float64; units of the unit
    vector's coordinates): a :data:`POLYNOMIAL_LEVELS` width's top coefficient (:func:`level_polynomial`), else
    1. The norm stored with the codes carries it: rescaled (``rescale_norm``), it is the norm over the table
    levels' norm; else the norm times this. The table's levels are a few times the quantizer's (head_dim 128:
    ``1/level_unit`` is 5.7 / 15.8 / 10.9 / 1.9 at 2 / 3 / 4 / 8 bits; a decoded unit vector's norm in table
    units about 6.3 / 20.9 / 16.1 / 3.2), so a rescaled norm is as many times smaller than ``‖x‖``: in fp16
    metadata it meets the subnormals below ``‖x‖`` ≈ 2e-4–1.3e-3 (6e-5 when the table held the quantizer's
    levels) and saturates above 2e5–1.4e6 (65504). A :func:`row_grid`'s unit is each row's own (NaN here)."""
    if row_grid(d, bits):
        return math.nan
    return _level_form(int(d), int(bits))[1] if bits in POLYNOMIAL_LEVELS else 1.0


@functools.lru_cache(maxsize=None)
def _level_form(d: int, bits: int) -> tuple:
    """``(ks, unit)`` of :func:`level_polynomial` and :func:`level_unit`: the depressed monic form of
    :func:`~.codebooks.odd_polynomial_codebook`'s coefficients (``a_i = c_(2i+1) / c_top`` in ``w = u²``, then
    ``Q(y − k0)`` with ``k0 = a_(n−1)/n``), its numbers rounded to fp16, and the unit of least MSE for the levels
    they give (:func:`_best_unit`, from ``c_top``). Where the top coefficient is next to nothing (tiny head dims,
    whose coordinates are not near normal: at head_dim 3 they are uniform and so are the Lloyd–Max levels), the
    numbers leave fp16's range or the levels their order: the next lower degree then."""
    for degree in range(POLYNOMIAL_LEVELS[bits], 0, -2):
        coef = odd_polynomial_codebook(d, bits, degree)  # c1, c3, …: units of 1/√d
        a = [c / coef[-1] for c in coef]
        n = len(a) - 1
        ks = ()
        if n:
            k0 = a[n - 1] / n
            b = [sum(a[i] * math.comb(i, j) * (-k0) ** (i - j) for i in range(j, n + 1)) for j in range(n + 1)]
            ks = [k0] + [b[j] for j in range(n - 2, -1, -1)]  # b[n] = 1, b[n-1] = 0
            ks = tuple(_round_fp16(torch.tensor(ks, dtype=torch.float64)).tolist())
        shape = _polynomial_levels(bits, ks)
        top = torch.finfo(torch.float16).max
        if all(abs(k) <= top for k in ks) and bool(shape.abs().max() <= top) and bool((shape[1:] > shape[:-1]).all()):
            break
    return ks, _best_unit(d, shape, coef[-1]) / d ** 0.5


def _best_unit(d: int, shape: torch.Tensor, unit: float, steps: int = 40) -> float:
    """The scale ``c`` of least MSE for levels ``c·shape`` (units of ``1/√d``), from ``unit``: Lloyd's iteration
    on the one parameter (each step the least-squares scale for the cells the levels have, which no step makes
    worse)."""
    for _ in range(steps):
        mass, first = _cell_moments(d, unit * shape)
        unit = float((first * shape).sum() / (mass * shape * shape).sum())
    return unit


def _round_fp16(x: torch.Tensor) -> torch.Tensor:
    """float64 ``x`` rounded to the nearest fp16 number (ties to even), as float64: one rounding, where
    ``x.to(torch.float16)`` may round through float32 first."""
    _, e = torch.frexp(x)
    ulp = torch.ldexp(torch.ones_like(x), (e - 11).clamp(min=-24))  # fp16: 11 bits, subnormals 2^-24
    return torch.round(x / ulp) * ulp


def _polynomial_levels(bits: int, ks: tuple) -> torch.Tensor:
    """The levels of ``ks`` (:func:`level_polynomial`) as fp16 arithmetic gives them, in float64:
    the operations a kernel runs (``fma.rn.f16x2``/``mul.rn.f16x2``), each result rounded once (a
    product of two fp16 numbers and the sum with a third are exact in float64). ``u`` is exact in
    fp16 (at most ``bits + 1`` significant bits). Odd: ``level(2^bits − 1 − k) = −level(k)``, since
    rounding to nearest is."""
    u = code_offsets(bits)
    if not ks:
        return u
    p = y = _round_fp16(u * u + ks[0])
    for k in ks[1:]:
        p = _round_fp16(p * y + k)
    return _round_fp16(p * u)


def _fp16_levels(d: int, bits: int) -> torch.Tensor:
    """The table levels in fp16 numbers, as float64: :func:`_polynomial_levels` for :data:`POLYNOMIAL_LEVELS`
    widths; otherwise ``lloyd_max_codebook / √d`` rounded once to fp16. The decode kernel's MMAs take fp16
    operands; with the float64 levels as the codes' meaning, the kernel's rounded table was an error
    of its own, fixed per level and so not averaged away: turbo 3-bit keys at head_dim 80 came out
    2.06e-3 from the oracle on the H200 (bound 2e-3), and an emulation in float64 (fp16 table, fp16
    rotated query, bf16 output) gives the same 2.056e-3, 1.711e-3 without the table's rounding. A
    level moves by at most 2⁻¹¹ of itself (the codebook's MSE by far less: it is at its optimum)."""
    if bits in POLYNOMIAL_LEVELS:
        levels = _polynomial_levels(bits, level_polynomial(d, bits))
        if not bool((levels[1:] > levels[:-1]).all()):  # the codes' search and meaning need sorted levels
            raise NotImplementedError(f"the {bits}-bit level polynomial of head_dim={d} is not increasing in fp16")
        return levels
    return (lloyd_max_codebook(d, bits).to(torch.float64) / d ** 0.5).to(torch.float16).to(torch.float64)


def _searched_levels(d: int, bits: int) -> torch.Tensor:
    """The levels the codes are searched among, in ``z``'s units (``1/√d``): the table's times
    :func:`level_unit`, times ``√d``."""
    return _fp16_levels(d, bits) * (level_unit(d, bits) * d ** 0.5)


def _level_boundaries(d: int, bits: int) -> torch.Tensor:
    """Decision thresholds of the codes (units of ``1/√d``, what ``z`` is in): the Lloyd–Max
    boundaries, or the midpoints between the polynomial's levels (:data:`POLYNOMIAL_LEVELS`, times
    :func:`level_unit`)."""
    if bits in POLYNOMIAL_LEVELS:
        levels = _searched_levels(d, bits)
        return (levels[1:] + levels[:-1]) / 2
    return codebook_boundaries(d, bits)


def turbo_quantize(x: torch.Tensor, bits: int, seed: int, metadata_dtype, rescale_norm: bool = True):
    """Quantize ``x [..., D]``; returns ``codes uint8 [..., D]`` and ``meta [..., 1]``: the norm, divided
    by the decoded unit vector's norm when ``rescale_norm`` (the decoded vector keeps ``‖x‖``)."""
    d = x.shape[-1]
    xw = _finite(x)
    norm, z = _rotated(xw, seed)
    if row_grid(d, bits):
        codes, unit = _row_grid_codes(z, z.abs().amax(-1, keepdim=True), bits)
        codes, unit = codes.to(torch.uint8), unit * d ** -0.5
    else:
        bounds = as_constant(_level_boundaries, d, bits, device=x.device, dtype=xw.dtype)
        codes, unit = torch.bucketize(z, bounds).to(torch.uint8), None
    if rescale_norm:  # ‖ŷ‖ is the rotation-free norm of the centroids the codes pick
        y = turbo_centroids(d, bits, device=x.device, dtype=xw.dtype)[codes.long()]
        y_norm = torch.linalg.vector_norm(y, dim=-1, keepdim=True)
        norm = norm / torch.where(y_norm > 0, y_norm, torch.ones_like(y_norm))
    else:  # the table's levels are in units of level_unit (a row grid's: the row's own)
        norm = norm * (level_unit(d, bits) if unit is None else unit)
    return codes, to_metadata(norm, metadata_dtype)


def _rotated(xw: torch.Tensor, seed: int):
    """``(‖x‖, z)``: the norm and the rotated unit vector in units of ``1/√d``.

    A power-of-two head_dim rotates by ``M = √d·Rᵀ`` (entries ±1, :func:`~.rotation.signed_hadamard`)
    and normalises afterwards, both in float64 (:func:`_signed_rotation`, :func:`_normalised`):
    the sums are then exact or nearly so, and eager code, the packed form and a compiled graph
    round them to the same ``z`` whatever order they add in. Other head dims rotate the unit
    vector by the dense ``R``.
    """
    d = xw.shape[-1]
    if not is_power_of_two(d):
        norm = torch.linalg.vector_norm(xw, dim=-1, keepdim=True)
        return norm, turbo_rotate(xw / torch.where(norm > 0, norm, torch.ones_like(norm)), seed) * d ** 0.5
    signed = _signed_rotation(xw, seed)
    return _normalised(signed, (signed * signed).sum(-1, keepdim=True), d, xw.dtype)


def _signed_rotation(xw: torch.Tensor, seed: int) -> torch.Tensor:
    """``xw @ M`` in float64 (``M = √d·Rᵀ``, power-of-two head_dim). Compiled, it is a reduction
    over ``M``'s signs, an int8 graph constant read by pointwise loads (Inductor copies no constant
    that only loads read), which Inductor makes one kernel with the row's producer (K's RoPE): a
    matmul there is a library call per cache write (cuBLAS' fp32 GEMM took 50 µs per one-token
    write on the H200). Signs computed from indices (parity folds, sign words by selects) had put
    the producer's expression past Inductor's inlining threshold: K's product ``[rows, d, d]`` was
    realized by a kernel of its own (CPU's Triton schedule), and on the H200 the signs had one per
    write (decode step of the 1B Llama, turbo-8: 9 kernels per layer for the writes, 5 now). Eager,
    it is a matmul."""
    d = xw.shape[-1]
    if torch.compiler.is_compiling() or tracing_with_fake_tensors():
        return (xw.double()[..., :, None] * signed_hadamard(d, seed, device=xw.device, dtype=torch.int8)).sum(-2)
    return xw.double() @ signed_hadamard(d, seed, device=xw.device)  # eager: not the [rows, d, d] product


def _normalised(signed: torch.Tensor, sum_sq: torch.Tensor, d: int, dtype: torch.dtype):
    """``(‖x‖, z)`` in ``dtype`` from :func:`_signed_rotation` and the row's sum of squares, both
    float64: ``‖signed‖ = √d·‖x‖`` and ``z = signed·√d/‖signed‖`` (0 for a zero row)."""
    norm, inv = _unit_scale(sum_sq, d)
    return norm.to(dtype), (signed * inv).to(dtype)


def _unit_scale(sum_sq: torch.Tensor, d: int):
    """``(‖x‖, √d/‖signed‖)`` in float64 from the sum of squares of :func:`_signed_rotation`'s row."""
    length = sum_sq.sqrt()
    return length * d ** -0.5, torch.where(length > 0, d ** 0.5 / length, torch.zeros_like(length))


def _squared_levels(d: int, bits: int, dtype: torch.dtype) -> torch.Tensor:
    """The squares of the levels as held in ``dtype``, in float64: exact (fp16 numbers squared), so one
    rounding to ``dtype`` is the ``y * y`` that eager code computes there."""
    return _fp16_levels(d, bits).to(dtype).double() ** 2


def _table_row(table_fn, *key) -> torch.Tensor:
    """``table_fn(*key)`` as a ``[1, n]`` row (a table that stays a buffer when compiled)."""
    return table_fn(*key).unsqueeze(0)


def turbo_quantize_packed(x: torch.Tensor, bits: int, seed: int, metadata_dtype, rescale_norm: bool = True):
    """:func:`turbo_quantize` with its codes packed (``uint8 [..., packed_size(D, bits)]``, meta
    ``[..., 1]``), in the form Inductor's Triton backend fuses into the one kernel that stores a
    cache row after the rotation's kernel (2, 3, 4 and 8 bits; for a power-of-two head_dim the row's
    norm is taken in that kernel too).

    The codes come out in the packed row's iteration space (:func:`~.packing.byte_sources`). The
    codebook search (:func:`_codebook_search`) and the rescale's lookup of squared centroids read two
    small tables by computed index: graph constants that Inductor loads inside the fused kernel (a
    constant read by pointwise loads is not copied first). As chains of comparisons and selects they
    had made Inductor's codegen of one write 2–3× slower, the bulk of a turbo model's compile time
    (docs/design.md). The codes are :func:`turbo_quantize`'s; the stored norm differs by rounding
    only (the decoded norm sums in another order).
    """
    xw = _finite(x)
    d, owners = x.shape[-1], slot_owners(bits, x.device)
    if is_power_of_two(d):  # the norm from the slots, in the kernel that packs (not one of its own)
        signed = byte_sources(_signed_rotation(xw, seed), bits)
        sum_sq = functools.reduce(torch.add, [torch.where(own, v * v, 0.0) for own, v in zip(owners, signed)])
        norm, inv = _unit_scale(sum_sq.sum((-2, -1))[..., None, None], d)
        slots = [(v * inv).to(xw.dtype) for v in signed]
        norm = norm[..., 0].to(xw.dtype)
    else:
        norm, z = _rotated(xw, seed)
        slots = byte_sources(z, bits)
    if row_grid(d, bits):  # every element is some slot's: their largest |z| is the row's
        top = functools.reduce(torch.maximum, [v.abs() for v in slots]).amax((-2, -1))[..., None, None]
        codes, unit = zip(*[_row_grid_codes(v, top, bits) for v in slots])
        unit = unit[0][..., 0, :] * d ** -0.5
    else:
        # [1, n] tables: Inductor inlines a 1-D constant of up to 8 entries (2- and 3-bit codebooks) as
        # literals, and then a layer's K and V stores share no buffer to fuse over on a GPU: a kernel more
        # per layer and decode step (H200, 2026-12-05; docs/design.md)
        bounds = as_constant(_table_row, _level_boundaries, d, bits, device=x.device, dtype=xw.dtype)[0]
        codes, unit = [_codebook_search(v, bounds) for v in slots], None
    if rescale_norm:  # ‖ŷ‖ over the codes each element owns (3-bit codes sit in two bytes)
        squares = as_constant(_table_row, _squared_levels, d, bits, xw.dtype, device=x.device, dtype=xw.dtype)[0]
        y2 = 0
        for own, c in zip(owners, codes):
            y2 = y2 + torch.where(own, squares[c], 0.0)
        y_norm = y2.sum((-2, -1)).sqrt().unsqueeze(-1)
        norm = norm / torch.where(y_norm > 0, y_norm, torch.ones_like(y_norm))
    else:
        norm = norm * (level_unit(d, bits) if unit is None else unit)
    return pack_sources(list(codes), bits), to_metadata(norm, metadata_dtype)


def _codebook_search(v: torch.Tensor, bounds: torch.Tensor) -> torch.Tensor:
    """``torch.bucketize(v, bounds)`` (ties to the lower code: the number of boundaries strictly below
    ``v``; NaN gives 0) as int32, for ``2^bits − 1`` sorted boundaries: a binary search of ``bits``
    comparisons, each with the boundary a table load picks. Compiled, that is ``bits`` loads and
    comparisons per code where a comparison with every boundary was ``2^bits − 1``, and Inductor's
    bucketize lowering needs its boundaries as a buffer of their own (a copy kernel per call)."""
    bits = (len(bounds) + 1).bit_length() - 1
    if len(bounds) != (1 << bits) - 1:
        raise ValueError(f"{len(bounds)} boundaries: a binary search takes 2^bits - 1 of them")
    code = torch.zeros_like(v, dtype=torch.int32)
    for step in (1 << b for b in reversed(range(bits))):
        code = code + (v > bounds[code + (step - 1)]).to(torch.int32) * step
    return code


def turbo_dequantize(codes: torch.Tensor, meta: torch.Tensor, bits: int, seed: int,
                     dtype: torch.dtype) -> torch.Tensor:
    """Decode ``codes [..., D]`` with norms ``meta [..., 1]`` to ``dtype``."""
    work = torch.float64 if dtype == torch.float64 else torch.float32
    d = codes.shape[-1]
    y = turbo_centroids(d, bits, device=codes.device, dtype=work)[codes.long()]
    return (turbo_rotate(y, seed, inverse=True) * meta.to(work)).to(dtype)
