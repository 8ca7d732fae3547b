"""Packed K/V rows as the decode kernel's MMA operands (Triton).

A packed row splits into *planes* (plane ``s`` holds the codes of dims ``planes·t + s``): 2/4/8-bit rows
read as 16-bit words (rows of at most 16 bytes a byte per column), 3-bit rows as three byte planes.
A 2/4/8-bit field masked in place inside its byte, read as fp16 bits, is the fp16 subnormal
``field · 2^-24`` exactly (MMA keeps subnormal fp16 operands): one AND per two codes makes MMA
operands, with no offset to fold away and no shift for the fields of the low byte; the field's
place value (:func:`_field_unit`) is folded into the query (keys) or the output (values). 3-bit
fields are in place likewise, in 16-bit lanes a byte plane makes with the next one. Turbo codes
become their levels: 3/4/8-bit's level polynomial computed from the code, or centroid lookups (warp
shuffles from a table held one entry per lane, byte permutes from a table in the instructions, or a
gather), as PTX the kernel inlines; the interpreter gathers the same numbers from the table. 2-bit turbo levels are
linear in the code's bits (:func:`_linear_level_words`): such codes are fields in place as affine
ones, with their low bits a second operand.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..config import TensorQuantSpec
from ..quant.turbo import level_polynomial, turbo_centroids


def _planes(bits: int, nbytes: int) -> int:
    """Planes a packed row of ``nbytes`` splits into: plane ``s`` holds the codes of dims ``planes·t + s``.

    2/4/8-bit rows are read as 16-bit words (``16 / bits`` codes each): the dot operand then has
    the 16-bit layout (k-width 2), which keeps the query's MMA fragments in place; 8-bit
    sources made Triton use k-width 4 and ptxas copied four query registers before every MMA.
    Rows of at most 16 bytes are read a byte per column instead (:func:`_byte_cols`).
    3-bit rows are read as 24-bit words from three byte planes (8 codes each).
    """
    if bits == 3:
        return 8
    return 8 * _code_word_bytes.fn(bits, nbytes) // bits


@triton.constexpr_function
def _byte_cols(bits, nbytes):
    """Whether a 2/4/8-bit row is read one byte per plane column (``8 / bits`` planes), not one 16-bit word
    (``16 / bits``): rows of at most 16 bytes (head_dim 64 at 2 bits). A plane of words would be
    narrower than an MMA's 16-deep step, and padded to it: at head_dim 64, 2-bit rows made eight
    planes of 8 columns padded to 16, as many MMAs and conversions per key as head_dim 128's.
    In bytes, four planes of 16 columns: no padding. (Wider rows that still pad, 80 and 96 dims at 2
    bits, pad as much either way, and their bytes cost more: 32K affine 2-bit 17.61 against 22.03 per
    key at head_dim 80 in words and bytes.) The bytes widen to 16-bit lanes once per block,
    and every plane reads them as it reads words' low bytes. sm_90 SASS of the loop, head_dim 64,
    instructions per key, words → bytes (``benchmarks/decode_sass.py METHOD 2 --head-dim 64``): 32K affine
    2-bit 14.64 → 13.02, turbo 2-bit 29.30 → 20.55 (MMAs a block 128 → 64). Not timed against words;
    H200 figures with it: benchmarks/RESULTS.md, twenty-eighth session (head_dim 64)."""
    return int(bits) != 3 and int(nbytes) <= 16


@triton.constexpr_function
def _code_word_bytes(bits, nbytes):
    """Bytes of the unit a code row is read and strided in: 1 for 3-bit byte planes and
    :func:`_byte_cols` rows (uint8), 2 for 16-bit words (int16)."""
    return 1 if int(bits) == 3 or _byte_cols(bits, nbytes) else 2


@triton.jit
def _load_row_bytes(row_ptr, n_ok, BITS: tl.constexpr, NBYTES: tl.constexpr, PW: tl.constexpr,
                    TRANSPOSED: tl.constexpr = False):
    """The words that hold plane column ``t`` of each row ``row_ptr [BLOCK_N]`` (``[BLOCK_N, PW]``, or with
    ``TRANSPOSED`` ``[PW, BLOCK_N]``; three byte tensors for 3 bits).

    For 2, 4 and 8 bits ``row_ptr`` points at int16 and word ``t`` holds the codes of dims
    ``planes·t … planes·t + planes − 1`` (with :func:`_byte_cols` at uint8, and byte ``t``, as the low
    byte of an int16 lane, those of ``planes·t …``); for 3 bits (uint8) the 24-bit word ``t`` holds dims
    ``8t … 8t + 7`` and its bytes lie byte-planar at ``t``, ``W + t``, ``2W + t``
    (``W = NBYTES / 3`` words): three contiguous loads.
    """
    W: tl.constexpr = NBYTES // 3 if BITS == 3 else NBYTES // _code_word_bytes(BITS, NBYTES)
    if TRANSPOSED:
        t = tl.arange(0, PW)[:, None]
        rows, ok = row_ptr[None, :], n_ok[None, :] & (t < W)
    else:
        t = tl.arange(0, PW)[None, :]
        rows, ok = row_ptr[:, None], n_ok[:, None] & (t < W)  # a row narrower than the plane leaves zeros
    if BITS == 3:
        b0 = tl.load(rows + t, mask=ok, other=0)
        b1 = tl.load(rows + W + t, mask=ok, other=0)
        b2 = tl.load(rows + 2 * W + t, mask=ok, other=0)
    else:
        b0 = tl.load(rows + t, mask=ok, other=0)
        if _code_word_bytes(BITS, NBYTES) == 1:  # low bytes of int16 lanes (Triton widens four by two permutes)
            b0 = b0.to(tl.int16)
        b1 = b0
        b2 = b0
    return b0, b1, b2


@triton.jit
def _block_rows(base, first, S, stride, BITS: tl.constexpr, NBYTES: tl.constexpr, PW: tl.constexpr, N: tl.constexpr,
                TRANSPOSED: tl.constexpr = False):
    """:func:`_load_row_bytes` of keys ``first … first + N − 1`` of a head whose rows start at ``base``, ``stride``
    apart (keys from ``S`` on read as zeros)."""
    n = first + tl.arange(0, N)
    return _load_row_bytes(base + n.to(tl.int64) * stride, n < S, BITS, NBYTES, PW, TRANSPOSED)


@triton.jit
def _plane_codes(b0, b1, b2, S: tl.constexpr, BITS: tl.constexpr):
    """Integer codes of plane ``S`` from the row words of :func:`_load_row_bytes`."""
    if BITS != 3:
        # 8-bit codes widen to int32 (as load offsets of the former global-memory lookup, int16 ones
        # ran turbo 8-bit 869 µs at 32K against 805, H200; not re-timed with the gather); ≤ 4-bit
        # gather indices stay int16, two per register. The mask drops int16 sign bits.
        w = b0.to(tl.int32) if BITS == 8 else b0
        c = (w >> (BITS * S)) & ((1 << BITS) - 1)
    else:
        # int16 words (int32 ones: 73.2 instructions per key against 69.2, sm_90 SASS); turbo gathers
        # in a layout of its own, where _field3_lanes' byte-packed permutes cost more (82.9)
        w0 = b0.to(tl.int16)
        w1 = b1.to(tl.int16)
        w2 = b2.to(tl.int16)
        if S == 0:
            c = w0 & 7
        elif S == 1:
            c = (w0 >> 3) & 7
        elif S == 2:
            c = (w0 >> 6) | ((w1 & 1) << 2)
        elif S == 3:
            c = (w1 >> 1) & 7
        elif S == 4:
            c = (w1 >> 4) & 7
        elif S == 5:
            c = (w1 >> 7) | ((w2 & 3) << 1)
        elif S == 6:
            c = (w2 >> 2) & 7
        else:
            c = w2 >> 5
    return c


@triton.constexpr_function
def _field_unit(bits, turbo, s):
    """What one unit of plane ``s``'s fp16 value is worth: ``2^-24 · 2^(bits · (s mod planes per byte))``
    for in-place fields (2/4/8-bit affine; 3-bit: ``2^-24 · 2^(3s mod 8)``), 1 for table values (turbo)."""
    bits, s = int(bits), int(s)
    if bool(turbo):
        return 1.0
    if bits == 3:  # in place in a 16-bit lane (_field3_lanes)
        return 2.0 ** ((3 * s) % 8 - 24)
    return 2.0 ** (bits * (s % (8 // bits)) - 24)


@triton.constexpr_function
def _field_mask(bits, s):
    """Mask of plane ``s``'s field in a 16-bit word, within the byte it lies in."""
    bits, s = int(bits), int(s)
    return ((1 << bits) - 1) << (bits * (s % (8 // bits)))


@triton.constexpr_function
def _field_asm(mask):
    """``and`` with a :func:`_field_mask` in both words of a register."""
    return f"and.b32 $0, $1, {int(mask) * 0x00010001:#010x};"


@triton.jit
def _high_bytes(w):
    """Each int16 word's high byte moved down, zeros above (one ``prmt`` per two words)."""
    return tl.inline_asm_elementwise("prmt.b32 $0, $1, 0, 0x4341;", "=r,r", [w], dtype=tl.int16, is_pure=True,
                                     pack=2)


@triton.constexpr_function
def _low_bit_mask(bits, s):
    """Mask of the lowest bit of plane ``s``'s field in a 16-bit word, within the byte it lies in."""
    bits, s = int(bits), int(s)
    return 1 << (bits * (s % (8 // bits)))


@triton.jit
def _field_values(w, S: tl.constexpr, BITS: tl.constexpr, USE_ASM: tl.constexpr, LOW_BIT: tl.constexpr = False):
    """fp16 subnormals of plane ``S``'s fields of int16 words ``w``, in place (worth ``_field_unit``); with
    ``LOW_BIT`` the fields' lowest bits alone, in place likewise (:func:`_linear_level_words`)."""
    HIGH: tl.constexpr = S >= 8 // BITS  # the field lies in the word's high byte
    MASK: tl.constexpr = _low_bit_mask(BITS, S) if LOW_BIT else _field_mask(BITS, S)
    if USE_ASM:
        src = _high_bytes(w) if HIGH else w
        if BITS == 8 and HIGH:
            vals = src.to(tl.float16, bitcast=True)
        else:
            ASM: tl.constexpr = _field_asm(MASK)
            vals = tl.inline_asm_elementwise(ASM, "=r,r", [src], dtype=tl.float16, is_pure=True, pack=2)
    else:
        word = w.to(tl.int32) & 0xFFFF
        if HIGH:
            word = word >> 8
        vals = (word & MASK).to(tl.int16).to(tl.float16, bitcast=True)
    return vals


@triton.constexpr_function
def _field3_shift(s):
    """Where 3-bit plane ``s``'s field lies in the 16-bit lane of :func:`_field3_lanes`: the field
    of dim ``8t + s`` starts at bit ``3s`` of the 24-bit word, i.e. at bit ``3s mod 8`` of byte
    ``3s // 8``, the lane's low byte (its high byte is the next byte plane)."""
    return (3 * int(s)) % 8


@triton.constexpr_function
def _straddle_lanes_asm(lane0, lane1):
    """PTX that makes four 16-bit lanes ``byte of $2 | byte of $3 << 8`` (``lane0``: bytes 0 and 1, ``lane1``:
    bytes 2 and 3): a byte plane's fields with the next plane's bits above them."""
    return f"prmt.b32 {lane0}, $2, $3, 0x5140; prmt.b32 {lane1}, $2, $3, 0x7362; "


@triton.constexpr_function
def _spread3_asm():
    """:func:`_straddle_lanes_asm` as a whole inline asm: four codes' lanes, one permute per two."""
    return "{ " + _straddle_lanes_asm("$0", "$1") + "}"


@triton.constexpr_function
def _lane_mask_asm(mask):
    """``and`` with ``mask`` in both 16-bit lanes of a register."""
    return f"and.b32 $0, $1, {int(mask) * 0x00010001:#010x};"


@triton.jit
def _field3_spread(b0, b1, b2, S: tl.constexpr, USE_ASM: tl.constexpr):
    """3-bit plane ``S``'s unmasked int16 lanes: the byte plane that holds its fields' low bits, with the next one
    above it (:func:`_field3_bytes`). Planes 0–2 read the same lanes (byte planes 0 and 1), planes 3–5 the same
    (1 and 2), planes 6 and 7 the same (2 and 2): the compiler makes each once a block, pure inline asm of the
    same operands."""
    lo, hi = _field3_bytes(b0, b1, b2, S)
    if USE_ASM:
        SPREAD: tl.constexpr = _spread3_asm()
        lanes = tl.inline_asm_elementwise(SPREAD, "=r,=r,r,r", [lo, hi], dtype=tl.int16, is_pure=True, pack=4)
    else:  # int32 lanes under the interpreter (no sign to carry through the mask)
        lanes = lo.to(tl.int32) | (hi.to(tl.int32) << 8)
    return lanes


@triton.jit
def _field3_lanes(b0, b1, b2, S: tl.constexpr, USE_ASM: tl.constexpr):
    """3-bit plane ``S``'s fields in place in int16 lanes (``code << _field3_shift(S)``): the lanes of
    :func:`_field3_spread` masked to the field (planes 2 and 5 straddle two bytes, the others lie in the low
    one). With the spreads shared by the planes, 32 codes (four of each plane) cost 6 permutes and 16 ANDs; each
    plane spreading its own bytes (the low byte masked first, four codes an AND) had cost 26, and Triton's
    unpacking of each byte three instructions per two codes. sm_90 SASS of the loop at 32K, warp instructions per
    key, own spreads → shared (``benchmarks/decode_sass.py affine 3``): head_dim 128 18.48 → 17.42, 64 18.73 →
    17.67, 96 19.92 → 18.83, 256 35.67 → 32.97 (88 → 56 bytes spilled); 4K 23.11 → 21.94."""
    return _field3_mask(_field3_spread(b0, b1, b2, S, USE_ASM), S, USE_ASM)


@triton.jit
def _field3_mask(lanes, S: tl.constexpr, USE_ASM: tl.constexpr):
    """Plane ``S``'s fields of 16-bit lanes (:func:`_field3_spread`'s, or :func:`_word3_lanes`'), masked in place
    (int16)."""
    MASK: tl.constexpr = 7 << _field3_shift(S)
    if USE_ASM:
        AND: tl.constexpr = _lane_mask_asm(MASK)
        lanes = tl.inline_asm_elementwise(AND, "=r,r", [lanes], dtype=tl.int16, is_pure=True, pack=2)
    else:
        lanes = (lanes & MASK).to(tl.int16)
    return lanes


@triton.jit
def _plane_values(b0, b1, b2, S: tl.constexpr, BITS: tl.constexpr, TURBO: tl.constexpr, lut_ptr,
                  USE_ASM: tl.constexpr, LUT: tl.constexpr):
    """fp16 ``[BLOCK_N, PW]`` values of plane ``S``, worth ``_field_unit(BITS, TURBO, S)`` each:
    turbo centroids (by PTX with ``LUT``: :func:`_shuffle_lut_asm`, :func:`_polynomial_asm` or
    :func:`_register_lut_asm`; else :func:`_lookup`'s gather), 3-bit affine codes, or 2/4/8-bit affine fields in
    place (and 2-bit turbo ones with ``"lin"``, :func:`_linear_level_words`)."""
    if TURBO and _lut_kind(LUT) == "lin":  # levels linear in the code's bits: the field in place, as affine
        vals = _field_values(b0, S, BITS, USE_ASM)
    elif BITS == 3 and (not TURBO or (USE_ASM and _lut_kind(LUT) == "poly")):  # from the lanes the planes share
        vals = _lane3_values(_field3_spread(b0, b1, b2, S, USE_ASM), S, TURBO, lut_ptr, USE_ASM, LUT)
    elif TURBO and USE_ASM and (_lut_kind(LUT) == "shfl" or _lut_kind(LUT) == "poly"):
        CODE_ASM: tl.constexpr = _code_level_asm(BITS, LUT, S)
        if BITS != 3:
            vals = tl.inline_asm_elementwise(CODE_ASM, "=r,r", [b0], dtype=tl.float16, is_pure=True, pack=2)
        elif _field3_shift(S) > 5:  # four codes an asm: a plane's bytes and the next plane's (fields straddle)
            lo, hi = _field3_bytes(b0, b1, b2, S)
            vals = tl.inline_asm_elementwise(CODE_ASM, "=r,=r,r,r", [lo, hi], dtype=tl.float16, is_pure=True, pack=4)
        else:
            lo, hi = _field3_bytes(b0, b1, b2, S)
            vals = tl.inline_asm_elementwise(CODE_ASM, "=r,=r,r", [lo], dtype=tl.float16, is_pure=True, pack=4)
    elif TURBO and USE_ASM and LUT != "":
        ASM: tl.constexpr = _register_lut_asm(BITS, LUT, S)
        src = _field3_lanes(b0, b1, b2, S, USE_ASM) if BITS == 3 else b0
        vals = tl.inline_asm_elementwise(ASM, "=r,r", [src], dtype=tl.float16, is_pure=True, pack=2)
    elif TURBO:
        vals = _lookup(lut_ptr, _plane_codes(b0, b1, b2, S, BITS), BITS)
    else:
        vals = _field_values(b0, S, BITS, USE_ASM)
    return vals


@triton.constexpr_function
def _code_level_asm(bits, lut, s):
    """The PTX that makes plane ``s``'s codes their levels for a ``"shfl"`` or ``"poly"`` lookup
    (:func:`_shuffle_lut_asm`, :func:`_polynomial_asm`): the same operands and results but at 3 bits, where the
    shuffles read the byte planes and the polynomial the lanes of :func:`_field3_spread`."""
    return _shuffle_lut_asm(bits, lut, s) if _lut_kind(lut) == "shfl" else _polynomial_asm(bits, lut, s)


@triton.constexpr_function
def _lut_kind(lut):
    """How a turbo spec's codes become centroids in the kernel: ``LUT`` is ``""`` (:func:`_lookup`'s
    gather), ``"prmt:…"`` (byte permutes, :func:`_register_lut_asm`), ``"shfl:…"`` (warp shuffles,
    :func:`_shuffle_lut_asm`), the words after the colon being :func:`_register_lut_words`',
    ``"poly:…"`` (the level polynomial, :func:`_polynomial_asm`; the words :func:`_polynomial_words`'), or
    ``"lin:…"`` (no lookup: levels linear in the code's bits, :func:`_linear_level_words`)."""
    return str(lut).partition(":")[0]


def _linear_level_words(spec: TensorQuantSpec, d: int):
    """``"α,γ,z"`` where a 2-bit turbo spec's four fp16 levels are linear in the code's bits, else None.

    Four levels ``t0 < t1 < t2 < t3`` with ``t1 − t0 = t3 − t2`` (every symmetric codebook: Lloyd–Max's for
    the rotated coordinates is, exactly in fp16) are ``t0 + (t2 − t0)·h + (t1 − t0)·l`` for the code's high and
    low bits, i.e. ``level(c) = α·(c + γ·l − z)`` with ``α = (t2 − t0)/2``, ``γ = (t1 − t0)/α − 1``,
    ``z = −t0/α``.
    So the code needs no lookup: its field in place is an MMA operand as an affine code's is (an AND per two
    codes), its low bit another, the query (keys) or the probabilities (values) scaled by ``γ`` for the second,
    and ``z`` a zero point common to every row (:func:`_lin_coef`). The same numbers as the table's, up to
    the fp16 roundings of the scaled operands, as an affine code's. Turbo's 2-bit levels are a uniform grid
    (:data:`~turboquant.quant.turbo.POLYNOMIAL_LEVELS`): ``γ = 0`` and ``z = 1.5`` exactly, and the low bit is no
    operand (:func:`_lin_low_bits`); the second operand serves any other symmetric table. A uniform table of any
    width is ``α·(c − z)`` with ``γ = 0``: 8-bit rows of a grid of their own (:func:`~turboquant.quant.turbo.row_grid`,
    ``α = 2^-7``, ``z = 127.5``), whose codes are then fields in place as affine 8-bit ones."""
    if spec.method != "turbo":
        return None
    t = _centroids_fp16(d, spec.bits).double().tolist()
    steps = {b - a for a, b in zip(t, t[1:])}
    if len(steps) == 1:
        alpha = steps.pop()
        return f"{alpha!r},{0.0!r},{-t[0] / alpha!r}"
    if spec.bits != 2 or t[1] - t[0] != t[3] - t[2]:
        return None
    alpha = (t[2] - t[0]) / 2
    return f"{alpha!r},{(t[1] - t[0]) / alpha - 1.0!r},{-t[0] / alpha!r}"


@triton.constexpr_function
def _lin_coef(lut, i):
    """Coefficient ``i`` of a ``"lin:α,γ,z"`` lookup (:func:`_linear_level_words`): 0 α, 1 γ, 2 z."""
    return float(_lut_words(lut).split(",")[int(i)])


@triton.constexpr_function
def _lin_low_bits(lut):
    """Whether a ``"lin"`` lookup's codes take their low bits as a second operand: ``γ ≠ 0``. A uniform grid's
    ``γ`` is 0 (turbo 2-bit's levels since they are a degree-1 polynomial's): its codes are fields in place and
    nothing else, as affine 2-bit codes."""
    return _lut_kind(lut) == "lin" and _lin_coef(lut, 1) != 0.0


@triton.constexpr_function
def _lut_words(lut):
    return str(lut).partition(":")[2]


@triton.constexpr_function
def _shuffle_lut_asm(bits, lut, s):
    """PTX for turbo codes to their fp16 centroids by warp shuffles: lane ``l`` holds entry
    ``l mod 2^bits`` of the table (``T``, made from the table words by :func:`_register_lut_asm`'s
    permutes on the lane's number: loop-invariant, ptxas hoists it), and a code's centroid is ``T`` of
    the lane the code names. ``shfl.idx`` reads only bits 0–4 of its lane operand and the table repeats
    every ``2^bits`` lanes, so a code needs no mask: one shift (none for a field at bit 0), one shuffle,
    and a permute per two results to pack them. Against :func:`_lookup`'s gather, which Triton lowers
    to the same shuffles (one-warp programs) or shared-memory loads (four warps) after a shift and a
    mask per code, and a conversion and pack. The shuffles name every lane of the warp as a member: the
    lookups are straight-line code of the loop, never under a branch some lanes skip.

    2/4-bit (pack 2): ``$1`` two int16 row words, plane ``s``'s field at bit ``bits · s`` of each;
    ``$0`` their two centroids. 3-bit (pack 4): ``$2`` four bytes of the byte plane that holds plane
    ``s``'s low bits, the field at bit ``3s mod 8``; where it straddles into the next byte plane,
    ``$3`` that plane's four bytes; ``$0``, ``$1`` the four centroids."""
    bits, s = int(bits), int(s)
    lane_code = f"mov.u32 v, %laneid; and.b32 v, v, {(1 << bits) - 1}; "
    table = _register_lut_asm(bits, lut, 0, lane_code).replace("$0", "T")
    head = table[: table.rindex("}")].replace("{ .reg .b32 ", "{ .reg .b32 T, i, r0, r1, r2, r3, ", 1)
    shfl = "shfl.sync.idx.b32 r{0}, T, i, 0x1f, 0xffffffff; "
    if bits != 3:
        shift = bits * s
        lo = f"shr.b32 i, $1, {shift}; " if shift else "mov.b32 i, $1; "
        return (head + lo + shfl.format(0) + f"shr.b32 i, $1, {16 + shift}; " + shfl.format(1)
                + "prmt.b32 $0, r0, r1, 0x5410; }")
    shift = _field3_shift(s)
    if shift > 5:  # 16-bit lanes: the byte, the next plane's byte above it
        body = _straddle_lanes_asm("a", "b")
        srcs = [("a", shift), ("a", 16 + shift), ("b", shift), ("b", 16 + shift)]
    else:
        body = ""
        srcs = [("$2", 8 * k + shift) for k in range(4)]
    for r in range(4):
        src, sh = srcs[r]
        body += (f"shr.b32 i, {src}, {sh}; " if sh else f"mov.b32 i, {src}; ") + shfl.format(r)
    return head + body + "prmt.b32 $0, r0, r1, 0x5410; prmt.b32 $1, r2, r3, 0x5410; }"


@triton.constexpr_function
def _polynomial_asm(bits, lut, s):
    """PTX for turbo codes to their fp16 levels computed from the code
    (:data:`~turboquant.quant.turbo.POLYNOMIAL_LEVELS`). 4/8-bit (pack 2): ``$1`` two int16 row words, plane
    ``s``'s code at bit ``bits · s`` of each; ``$0`` their two levels. 3-bit (pack 2): ``$1`` two lanes of
    :func:`_field3_spread` (the byte plane that holds plane ``s``'s low bits, the next one above it), the field at
    bit ``3s mod 8``; ``$0`` their two levels.

    Each code ``k`` becomes the fp16 number ``x = 1024 + 2^(a−1)·(2k + 1)``: the code in the mantissa at bit
    ``a ≥ 1``, the half bit below it, the exponent of 1024 above. 8-bit: a permute (byte ``s`` to the low byte of
    each half) and ``x·2 + 0x6401``. 4-bit: a shift puts two planes' fields at bits 1 and 5 (``shl 1`` for
    planes 0 and 1, ``shr 7`` for 2 and 3: ptxas shares each between two planes), then one ``lop3`` keeps the
    field and sets the rest. 3-bit: one ``lop3`` per two codes (an AND and a ``mad`` at bit 0) on the lanes that
    the planes share (three spreads, a permute per two codes each, for eight planes; a spread of each plane's own
    bytes cost 27 instructions per 32 codes against 24: sm_90 SASS of turbo 3-bit's loop at 32K, see
    ``benchmarks/RESULTS.md``, fifty-fifth session).
    Then ``u = x·2^(1−a−bits) − (2^(11−a−bits) + 1) = (2k + 1)/2^bits −
    1`` (exact: both constants are fp16 numbers, and so is the result), ``y = u·u + k0``, Horner's rule in ``y``
    from ``y`` itself (one ``fma`` a further number), times ``u``: 3 fp16x2 operations per two codes at 3/4 bits,
    5 at 8 (:func:`~turboquant.quant.turbo.level_polynomial`'s depressed monic form; Horner's rule on the free
    coefficients in ``w = u·u`` took one more). The operations and roundings of
    :func:`~turboquant.quant.turbo._polynomial_levels`, whose values the table holds (``.rn``: ptxas keeps every
    rounding). No memory, no shuffle: 8-bit's 256-entry table was a shared-memory gather per code
    (:func:`_lookup`), 3/4-bit tables a warp shuffle per code (:func:`_shuffle_lut_asm`)."""
    bits, s = int(bits), int(s)
    coefs = [int(x, 16) for x in _lut_words(lut).split(",")]  # k0, k1, …: degree 3 or more (degree 1 is "lin")
    regs = "".join(f", c{i}" for i in range(len(coefs)))
    asm = ("{ .reg .b32 x, u, v, w, p, k" + regs + "; "
           + "".join(f"mov.b32 c{i}, {c:#010x}; " for i, c in enumerate(coefs)))
    if bits == 8:
        at = 1
        sel = 0x4040 | (2 + s) << 8 | s  # byte s of each word to the low byte of its half, zero above
        asm += f"prmt.b32 x, $1, 0, {sel:#06x}; mad.lo.u32 x, x, 2, 0x64016401; "
    elif bits == 3:  # two lanes of _field3_spread: the field and its half bit kept, the exponent's byte set
        pos = _field3_shift(s)
        at = max(pos, 1)
        mask, magic = 7 << pos, 0x6400 | 1 << (at - 1)
        if pos == 0:
            asm += f"and.b32 x, $1, {mask * 0x10001:#010x}; mad.lo.u32 x, x, 2, {magic * 0x10001:#010x}; "
        else:
            asm += f"mov.b32 k, {magic * 0x10001:#010x}; lop3.b32 x, $1, {mask * 0x10001:#010x}, k, 0xEA; "
    else:
        per_shift = (9 - bits) // bits + 1  # fields that fit at bits 1, 1 + bits, … of the mantissa (0–9)
        at = 1 + bits * (s % per_shift)
        shift = bits * s - at
        asm += "shl.b32 x, $1, 1; " if shift == -1 else f"shr.b32 x, $1, {shift}; " if shift else "mov.b32 x, $1; "
        asm += (f"mov.b32 k, {(0x6400 | 1 << (at - 1)) * 0x10001:#010x}; "
                f"lop3.b32 x, x, {(((1 << bits) - 1) << at) * 0x10001:#010x}, k, 0xEA; ")
    scale, offset = _fp16x2_word(2.0 ** (1 - at - bits)), _fp16x2_word(-(2.0 ** (11 - at - bits) + 1))
    asm += f"mov.b32 w, {scale:#010x}; mov.b32 k, {offset:#010x}; "
    asm += "fma.rn.f16x2 u, x, w, k; fma.rn.f16x2 v, u, u, c0; "  # y = u² + k0, and p = y
    p = "v"
    for i in range(1, len(coefs)):
        asm += f"fma.rn.f16x2 p, {p}, v, c{i}; "
        p = "p"
    return asm + f"mul.rn.f16x2 $0, {p}, u; }}"


@triton.constexpr_function
def _fp16x2_word(value):
    """An fp16 number (exact) in both halves of a word."""
    import struct

    bits = struct.unpack("<H", struct.pack("<e", float(value)))[0]
    assert struct.unpack("<e", struct.pack("<H", bits))[0] == float(value), value
    return bits * 0x10001


def _polynomial_words(spec: TensorQuantSpec, d: int) -> str:
    """:func:`~turboquant.quant.turbo.level_polynomial`'s numbers as ``fp16x2`` words (the number in both
    halves), ``k0`` first."""
    return ",".join(f"{_fp16x2_word.fn(c):#x}" for c in level_polynomial(d, spec.bits))


@triton.jit
def _field3_bytes(b0, b1, b2, S: tl.constexpr):
    """The byte plane that holds 3-bit plane ``S``'s low bits, and the next one (its fields' high bits
    where they straddle): see :func:`_field3_shift`."""
    if S < 3:
        lo = b0
        hi = b1
    elif S < 6:
        lo = b1
        hi = b2
    else:
        lo = b2
        hi = b2
    return lo, hi


@triton.constexpr_function
def _register_lut_asm(bits, lut, s, codes=None):
    """PTX for two turbo codes to their two fp16 centroids (``$0``) from a table held in the
    instructions (``lut``: ``"prmt:"`` and :func:`_register_lut_words`), by byte permutes: no shared memory, where
    :func:`_lookup`'s gather costs a shared-memory load (four warps) or a shuffle (one warp) per
    code. ``$1``: two int16 row
    words whose plane-``s`` fields are the codes (2/4-bit; cut out here, a permute, shift and AND
    per two codes against Triton's shift and AND per code), or for 3 bits two lanes of
    :func:`_field3_lanes` (the code in place at bit ``3s mod 8``). ``codes``: PTX that puts the codes in
    ``v`` instead (:func:`_shuffle_lut_asm`'s lane number).

    ``v`` holds the codes in bytes 0 and 1; ``v · 0x11`` repeats each in two nibbles, the selector
    of two output bytes: a centroid's low byte from the low-byte registers, its high byte from the
    high-byte ones. 2-bit: one permute over 4 entries (selector nibbles ``f, f + 4``); 3-bit: one per
    byte half over 8 entries, merged; 4-bit: entries 0–7 and 8–15 apart, then each byte chosen by
    the code's top bit (a permute's nibble with bit 3 set would sign-fill instead of select)."""
    bits, s = int(bits), int(s)
    w = [int(x, 16) for x in _lut_words(lut).split(",")]
    movs = "".join(f"mov.b32 t{i}, {x:#010x}; " for i, x in enumerate(w))
    head = "{ .reg .b32 v, s, a, b, c, e, t0, t1, t2, t3, t4, t5, t6, t7; " + movs
    if codes is not None:  # PTX that leaves the codes in bytes 0 and 1 of v
        head += str(codes)
    elif bits == 3:  # fields masked in place: shifted down, bytes 0 and 2 are the codes
        head += f"shr.b32 v, $1, {_field3_shift(s)}; prmt.b32 v, v, 0, 0x4420; "
    else:  # the byte that holds the field, of each word, then the field
        byte, shift = divmod(bits * s, 8)
        head += f"prmt.b32 v, $1, 0, {0x4400 | (2 + byte) << 4 | byte:#06x}; "
        if shift:
            head += f"shr.b32 v, v, {shift}; "
        head += f"and.b32 v, v, {((1 << bits) - 1) * 0x0101:#06x}; "
    if bits == 2:  # t0: low bytes of entries 0-3, t1: high bytes; selector nibbles f, f + 4
        return head + "mad.lo.u32 s, v, 17, 0x4040; prmt.b32 $0, t0, t1, s; }"
    head += "mul.lo.u32 s, v, 17; "
    if bits == 3:  # t0, t1: low bytes of entries 0-7; t2, t3: high bytes
        body = ("prmt.b32 a, t0, t1, s; prmt.b32 b, t2, t3, s; "
                "and.b32 a, a, 0x00FF00FF; and.b32 b, b, 0xFF00FF00; or.b32 $0, a, b; ")
    else:  # t0-t3: low bytes of entries 0-15, t4-t7: high bytes
        body = ("and.b32 e, s, 0x7777; shr.b32 c, s, 1; and.b32 c, c, 0x4444; or.b32 c, c, 0x3210; "
                "prmt.b32 a, t0, t1, e; prmt.b32 b, t2, t3, e; prmt.b32 a, a, b, c; "
                "prmt.b32 b, t4, t5, e; prmt.b32 e, t6, t7, e; prmt.b32 b, b, e, c; "
                "and.b32 a, a, 0x00FF00FF; and.b32 b, b, 0xFF00FF00; or.b32 $0, a, b; ")
    return head + body + "}"


def _register_lut_words(spec: TensorQuantSpec, d: int) -> str:
    """The fp16 centroid table of a ≤ 4-bit turbo spec as the words :func:`_register_lut_asm` moves
    into registers: the entries' low bytes four to a word, then their high bytes."""
    bits = _centroids_fp16(d, spec.bits).view(torch.int16).to(torch.int32).tolist()
    lo = [b & 0xFF for b in bits]
    hi = [(b >> 8) & 0xFF for b in bits]
    word = lambda bs: sum(x << (8 * i) for i, x in enumerate(bs))  # noqa: E731
    return ",".join(f"{word(bs[i:i + 4]):#x}" for bs in (lo, hi) for i in range(0, len(bs), 4))


@triton.jit
def _lookup(lut_ptr, codes, BITS: tl.constexpr):
    """Centroid values (fp16) of turbo ``codes``, gathered from the fp16 table as one flat vector.

    A 1-D ``tl.gather`` of four-warp programs lowers to loads from the table in shared memory (one
    store of its 2^bits entries per call); a 16-entry table sits in 8 banks, so a warp's 32 lookups
    are one conflict-free load. It replaced a global-memory gather for 8 bits (``LDGSTS`` per code,
    the 256-entry table spread over L1 lines) and a ``tl.gather`` of the table broadcast to
    ``[BLOCK_N, 2^bits]`` for ≤ 4 bits (a shared-memory store per code). H200, B=8, Hq=32, Hkv=8,
    D=128, CUDA graph µs, before → after (nineteenth session, benchmarks/RESULTS.md): turbo 8-bit
    812.6 → 410.2 at 32K (380.4 with three stages, now its default) and 30.16 → 25.51 at 1K; turbo
    4-bit 288.2 → 264.6 and 17.25 → 16.88; turbo 3-bit one-warp 309.0 → 299.8 at 32K. One-warp
    programs hold the table in the warp and gather by shuffles."""
    lut = tl.load(lut_ptr + tl.arange(0, 1 << BITS))
    flat = tl.reshape(codes, [codes.shape[0] * codes.shape[1]])
    return tl.reshape(tl.gather(lut, flat, axis=0), [codes.shape[0], codes.shape[1]]).to(tl.float16)


def _centroids_fp16(d: int, bits: int, device=None) -> torch.Tensor:
    return turbo_centroids(d, bits, device=device, dtype=torch.float16)  # fp16 numbers: exact, what the MMAs see


# ---- 3-bit values as 16-bit words ----------------------------------------------------------------------------
#
# A head_dim-128 3-bit row is three 16-byte byte planes; read as int16 words, word w of a plane holds the bytes of
# dim columns t = 2w and 2w + 1. The value tiles are Y [keys, 16], the row's first 32 bytes (columns 0–7 byte plane
# 0's words, 8–15 plane 1's), and X, plane 2's words (columns 0–7; 8–15 zeros, not read): 48 bytes a key, as the
# byte planes. A value tile is the B operand of the probabilities' MMA, and in its fragment of a 16-key, 16-column
# tile of 16-bit values a thread's four registers hold two keys' words each, of column n (the first two) and
# n + 8 (the last two): the register bases are key + 1, key + 8, column + 8 at the 16-bit operands' k-width 2 (the
# kernel tests check the layout, and the compiled kernel's width: ``tests/test_bench.py``). So one inline asm of
# pack 8 sees, for its thread's keys, word n of all three byte planes, Y's columns n and n + 8 and X's n:
# it makes the 16-bit lanes ``byte plane a | byte plane a + 1 << 8`` of dim columns 2n (registers 0, 1: the
# operand's column n) and 2n + 1 (2, 3: column n + 8), one permute per two keys. Words load by ldmatrix, where a
# byte plane's bytes as this operand were one shared-memory load each (LDS.U8, 96 a 64-key block). Planes 0–2
# mask lanes of byte planes 0 | 1, 3–5 of 1 | 2, 6 and 7 of 2 (:func:`_lane3_values`, as the byte planes' lanes);
# a plane's operand column c is its dim column 2c (c < 8) or 2(c − 8) + 1, which the accumulators undo after the
# loop (:func:`_word3_planes`). 16-key tiles: one row group's sub-block (4-row tiles of 64-key blocks).

WORD3_COLUMNS = tl.constexpr(16)  # head_dim 128's byte planes, 16 bytes each, as two 8-word halves


@triton.constexpr_function
def _word3_lanes_asm(a):
    """PTX of :func:`_word3_lanes` on a thread's fragment (pack 8): ``$4``–``$7`` Y's registers, ``$8``–``$11``
    X's; ``$0``, ``$1`` the lanes of byte planes ``a`` | ``a + 1`` (or 2 | 2) of even dim columns, ``$2``, ``$3`` of
    odd ones (each two keys')."""
    word = {0: (4, 5), 1: (6, 7), 2: (8, 9)}  # byte plane -> its registers of keys (k, k+1), (k+8, k+9)
    lo, hi = word[int(a)], word[min(int(a) + 1, 2)]
    return "{ " + "".join(f"prmt.b32 ${2 * odd + h}, ${lo[h]}, ${hi[h]}, {sel}; "
                          for odd, sel in enumerate(("0x6240", "0x7351")) for h in range(2)) + "}"


@triton.jit
def _value_words3(base, first, S, stride, N: tl.constexpr):
    """The Y and X int16 tiles ``[N, 16]`` of keys ``first … first + N − 1`` (rows at ``base``, ``stride`` bytes
    apart; keys from ``S`` on read as zeros), and the rows' word pointers and bounds ``[N, 1]``."""
    n = first + tl.arange(0, N)
    rows = (base + n.to(tl.int64) * stride).to(tl.pointer_type(tl.int16))[:, None]
    ok = (n < S)[:, None]
    c = tl.arange(0, WORD3_COLUMNS)[None, :]
    y = tl.load(rows + c, mask=ok, other=0)
    x = tl.load(rows + 16 + c, mask=ok & (c < 8), other=0)
    return y, x, rows, ok


@triton.jit
def _word3_lanes(y, x, rows, ok, A: tl.constexpr, USE_ASM: tl.constexpr):
    """16-bit lanes ``[N, 16]`` of byte planes ``A`` | ``A + 1`` (or 2 | 2): column c holds dim column 2c
    (c < 8) or 2(c − 8) + 1. The interpreter reads the planes' words again for them (a column's lane comes from
    another column's word, which only the GPU's fragment has at hand)."""
    if USE_ASM:
        LANES: tl.constexpr = _word3_lanes_asm(A)
        lanes = tl.inline_asm_elementwise(LANES, "=r,=r,=r,=r,r,r,r,r,r,r,r,r", [y, x], dtype=tl.int16,
                                          is_pure=True, pack=8)
    else:
        B: tl.constexpr = A + 1 if A < 2 else 2
        c = tl.arange(0, WORD3_COLUMNS)[None, :]
        lo = tl.load(rows + 8 * A + c % 8, mask=ok, other=0).to(tl.int32) & 0xFFFF
        hi = tl.load(rows + 8 * B + c % 8, mask=ok, other=0).to(tl.int32) & 0xFFFF
        lanes = tl.where(c < 8, (lo & 0xFF) | ((hi & 0xFF) << 8), (lo >> 8) | (hi & 0xFF00))
    return lanes


@triton.jit
def _lane3_values(lanes, S: tl.constexpr, TURBO: tl.constexpr, lut_ptr, USE_ASM: tl.constexpr, LUT: tl.constexpr):
    """fp16 values of 3-bit plane ``S`` from its 16-bit lanes (:func:`_field3_spread`'s or :func:`_word3_lanes`'):
    affine fields in place (worth ``_field_unit(3, False, S)``), or turbo levels (the level polynomial,
    :func:`_polynomial_asm`; the interpreter gathers them from the table)."""
    if TURBO:
        if USE_ASM:
            CODE_ASM: tl.constexpr = _code_level_asm(3, LUT, S)
            vals = tl.inline_asm_elementwise(CODE_ASM, "=r,r", [lanes], dtype=tl.float16, is_pure=True, pack=2)
        else:
            vals = _lookup(lut_ptr, (lanes >> _field3_shift(S)) & 7, 3)
    else:
        vals = _field3_mask(lanes, S, USE_ASM).to(tl.float16, bitcast=True)
    return vals


@triton.jit
def _word3_plane(a):
    """A value plane's accumulator ``[R, 16]`` with its columns in dim order: column c of :func:`_word3_lanes`'
    order holds dim column 2c (c < 8) or 2(c − 8) + 1."""
    even, odd = tl.split(tl.permute(tl.reshape(a, [a.shape[0], 2, 8]), (0, 2, 1)))
    return tl.reshape(tl.join(even, odd), [a.shape[0], 16])


@triton.jit
def _word3_planes(a0, a1, a2, a3, a4, a5, a6, a7):
    """:func:`_word3_plane` of each of the eight value planes (after the loop, once per program)."""
    return (_word3_plane(a0), _word3_plane(a1), _word3_plane(a2), _word3_plane(a3), _word3_plane(a4),
            _word3_plane(a5), _word3_plane(a6), _word3_plane(a7))
