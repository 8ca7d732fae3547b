"""Split-K decode attention that reads packed K/V codes directly (Triton).

One program handles one (batch, KV head, split of the sequence, tile of ≤ 32 query rows): all
``G = Hq / Hkv`` query heads and all ``L`` query positions of that KV head are the rows of one
tile, so each KV byte is read once. A packed row is never re-interleaved: it splits into
*planes* (plane ``s`` = the codes of dims ``planes·t + s``), the keys of a plane meet the
matching strided query dims in one MMA, and the values accumulate into strided output slices.
2/4/8-bit rows are read as 16-bit words; a field masked in place inside its byte is already an
MMA operand (the fp16 subnormal ``field · 2^-24``), so a code costs half an AND:

* affine keys: ``score_j = s_j · (q·c_j − z_j · Σq)`` (group size = head_dim), the field's place
  value folded into the query planes;
* affine values: the V scale is folded into the probabilities, ``acc += (p·s) @ c`` and the
  zero point comes off once at the end, ``acc −= Σ_j p_j s_j z_j``;
* 3-bit affine: fields in place likewise, in 16-bit lanes of a byte plane with the next byte
  plane above it (the two fields that straddle bytes need the high byte), made by PTX permutes;
* turbo: codes index the 2^b centroids (3/4-bit: warp shuffles from a table held one entry per
  lane; 2-bit: byte permutes from a table in the instructions; 8-bit: a flat ``tl.gather`` from
  shared memory); ``q`` is rotated and the output
  rotated back inside the kernel (fp16 MMAs on fp32 hi/lo halves; for a power-of-two head_dim the
  Hadamard rotation is made plane by plane from indices, or on long 8-bit splits read as ``√d · R``,
  exact ±1 in fp16; other head dims read ``R``), norms scale the scores and the probabilities. Every
  split's output leaves in the model's dims.

A one-warp tile of 4 or 8 query rows fills a quarter or half of the MMA's 16 rows; with *row
groups* (affine, long splits) its rows repeat down the 16 and group ``r`` reads its own part of
every block, so the softmax covers a block in a quarter of the tile; the groups merge after the
loop (:func:`_row_groups`).

Each split writes its running max, normaliser and unnormalised output; :func:`decode_attention`
merges the splits (log-sum-exp). Rows whose keys are all masked give 0, as the oracle.
"""

from __future__ import annotations

import collections
import functools
import operator
from typing import Optional

import torch
import triton
import triton.language as tl

from .. import compat
from ..config import TensorQuantSpec
from ..quant.rotation import hadamard_rotation, is_power_of_two, rotation_matrix
from ..quant.turbo import POLYNOMIAL_LEVELS, level_polynomial, turbo_centroids
from .buffers import TL_DTYPES, dense_row_stride, interpreted, meta_dtype, metadata_pairs, strides_as

__all__ = ["decode_attention", "supports", "unsupported"]

MAX_QUERY_LEN = 8


LOG2E = tl.constexpr(1.4426950408889634)  # scores live in log2 units: exp2 is one instruction
# A 2/4/8-bit field masked in place inside its byte, read as fp16 bits, is the fp16 subnormal
# field · 2^-24 exactly (MMA keeps subnormal fp16 operands): one AND per two codes makes MMA
# operands, with no offset to fold away and no shift for the fields of the low byte. The
# field's place value (``_field_unit``) is folded into the query (keys) or the output (values).
MAX_TILE_ROWS = 32  # query rows per program; 64 would make Triton pick wgmma, which faults here (H200, Triton 3.6)

# Query rows a tile holds at least (the MMA pads to 16 either way; a tile of GQA × query positions
# rows takes more). More rows than the query has cost softmax work on padding. Affine 4-bit took 16
# in four-warp programs (from sm_90 SASS of a four-warp loop at 32K, 24.1 against 25.4 instructions
# per key, before long caches ran one-warp programs): H200, B=8, Hq=32, Hkv=8, D=128, 1K, CUDA graph
# µs, 16 → 4 rows (2026-12-05, ``benchmarks/results/session28_gpu/``): 9.52 → 7.88; at head_dim 64 the
# four warps each computed the whole 16-row tile (sm_90 SASS, 15.50 → 7.62 instructions per key of
# a split). Four-warp programs now run caches under ``LONG_CACHE_KEYS`` and host-bound single-split
# calls.
MIN_TILE_ROWS = 4

# Batch × KV heads × keys at most for which a call outside a CUDA graph runs one split (no merge
# launch, no partials): at batch 1 a decode step is bound by the host launching kernels (H200,
# 16-layer 1B model at 1 × 1K: ~0.6 ms of host time per layer against ~10 µs of attention on
# the GPU), so a launch and an allocation fewer is worth more than the splits' parallelism.
# A call captured into a CUDA graph launches nothing from the host and splits as usual.
HOST_BOUND_KEY_ROWS = 1 << 16

# Keys per sequence at most for which 3-bit K/V take 128-key blocks (affine also 2 stages): a short
# cache's grid is small and a block's fixed work dominates, so twice the registers per program cost
# less than the second block. `benchmarks/decode_attention.py --sweep --contexts 1024 --methods
# affine --bits 3` (H200, 2026-12-02, B=8, Hq=32, Hkv=8, D=128, CUDA graph): 10.43 µs against
# 10.98 at 64 keys / 3 stages, the default before; longer contexts were not swept again. Turbo 3-bit
# (`--variants b128:block_n=128`, 2026-12-05, ``benchmarks/results/session29_gpu/``): 16.32 against 17.41.
SHORT_3BIT_KEYS = 1024

# Keys per sequence from which a program is one warp (:func:`_one_warp_programs`).
LONG_CACHE_KEYS = 2048

# Keys per split from which a split's loop, not its fixed work, sets its time: one-warp affine tiles
# hold row groups from here (:func:`_row_groups`; shorter splits ran 2–3% slower with them, H200, 4K
# context: 256 keys per split, 1024 and more faster), turbo 8-bit rotations read the matrix
# (:func:`_plane_hadamard`), and affine values without row groups sum their blocks in fp32 adds
# (:func:`_block_sums`).
LONG_SPLIT_KEYS = 1024


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
def _load_row_bytes(row_ptr, n_ok, BITS: tl.constexpr, NBYTES: tl.constexpr, PW: tl.constexpr):
    """The words that hold plane column ``t`` of each row (``[BLOCK_N, PW]``; three byte tensors for 3 bits).

    For 2, 4 and 8 bits ``row_ptr`` points at int16 and word ``t`` holds the codes of dims
    ``planes·t … planes·t + planes − 1`` (with :func:`_byte_cols` at uint8, and byte ``t``, as the low
    byte of an int16 lane, those of ``planes·t …``); for 3 bits (uint8) the 24-bit word ``t`` holds dims
    ``8t … 8t + 7`` and its bytes lie byte-planar at ``t``, ``W + t``, ``2W + t``
    (``W = NBYTES / 3`` words): three contiguous loads.
    """
    W: tl.constexpr = NBYTES // 3 if BITS == 3 else NBYTES // _code_word_bytes(BITS, NBYTES)
    t = tl.arange(0, PW)
    ok = n_ok[:, None] & (t[None, :] < W)  # a row narrower than the plane leaves zeros (dims past D)
    if BITS == 3:
        b0 = tl.load(row_ptr + t[None, :], mask=ok, other=0)
        b1 = tl.load(row_ptr + W + t[None, :], mask=ok, other=0)
        b2 = tl.load(row_ptr + 2 * W + t[None, :], mask=ok, other=0)
    else:
        b0 = tl.load(row_ptr + t[None, :], mask=ok, other=0)
        if _code_word_bytes(BITS, NBYTES) == 1:  # low bytes of int16 lanes (Triton widens four by two permutes)
            b0 = b0.to(tl.int16)
        b1 = b0
        b2 = b0
    return b0, b1, b2


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


@triton.jit
def _field_values(w, S: tl.constexpr, BITS: tl.constexpr, USE_ASM: tl.constexpr):
    """fp16 subnormals of plane ``S``'s fields of int16 words ``w``, in place (worth ``_field_unit``)."""
    HIGH: tl.constexpr = S >= 8 // BITS  # the field lies in the word's high byte
    MASK: tl.constexpr = _field_mask(BITS, S)
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
def _byte3_asm(mask):
    """Four bytes' fields masked in place, then spread into the low bytes of four 16-bit lanes."""
    m = int(mask) * 0x01010101
    return ("{ .reg .b32 t; and.b32 t, $2, " + f"{m:#010x}" + "; prmt.b32 $0, t, 0, 0x4140; "
            "prmt.b32 $1, t, 0, 0x4342; }")


@triton.constexpr_function
def _pair3_asm(mask):
    """Four lanes ``low byte | next plane's byte << 8`` (one permute per two), masked in place."""
    m = int(mask) * 0x00010001
    return ("{ prmt.b32 $0, $2, $3, 0x5140; prmt.b32 $1, $2, $3, 0x7362; "
            f"and.b32 $0, $0, {m:#010x}; and.b32 $1, $1, {m:#010x}; " + "}")


@triton.jit
def _field3_lanes(b0, b1, b2, S: tl.constexpr, USE_ASM: tl.constexpr):
    """3-bit plane ``S``'s fields in place in int16 lanes (``code << _field3_shift(S)``): the lane is a
    byte of the plane that holds the field's low bits, with the next byte plane above it, masked to
    the field; a field inside one byte needs no high byte (planes 2 and 5 straddle two). Four codes
    cost an AND and two permutes (two permutes and two ANDs for a straddling plane) on byte-packed
    registers, where Triton's unpacking of each byte took three instructions per two codes."""
    SHIFT: tl.constexpr = _field3_shift(S)
    MASK: tl.constexpr = 7 << SHIFT
    STRADDLES: tl.constexpr = SHIFT > 5
    lo, hi = _field3_bytes(b0, b1, b2, S)
    if USE_ASM:
        if STRADDLES:
            ASM2: tl.constexpr = _pair3_asm(MASK)
            lanes = tl.inline_asm_elementwise(ASM2, "=r,=r,r,r", [lo, hi], dtype=tl.int16, is_pure=True, pack=4)
        else:
            ASM1: tl.constexpr = _byte3_asm(MASK)
            lanes = tl.inline_asm_elementwise(ASM1, "=r,=r,r", [lo], dtype=tl.int16, is_pure=True, pack=4)
    else:
        lane = lo.to(tl.int32)
        if STRADDLES:
            lane = lane | (hi.to(tl.int32) << 8)
        lanes = (lane & MASK).to(tl.int16)
    return lanes


@triton.jit
def _plane_values(b0, b1, b2, S: tl.constexpr, BITS: tl.constexpr, TURBO: tl.constexpr, lut_ptr,
                  USE_ASM: tl.constexpr, LUT: tl.constexpr):
    """fp16 ``[BLOCK_N, PW]`` values of plane ``S``, worth ``_field_unit(BITS, TURBO, S)`` each:
    turbo centroids (by PTX with ``LUT``: :func:`_shuffle_lut_asm`, :func:`_polynomial_asm` or
    :func:`_register_lut_asm`; else :func:`_lookup`'s gather), 3-bit affine codes, or 2/4/8-bit affine fields in place."""
    if TURBO and USE_ASM and _lut_kind(LUT) == "shfl":
        SHFL: tl.constexpr = _shuffle_lut_asm(BITS, LUT, S)
        if BITS != 3:
            vals = tl.inline_asm_elementwise(SHFL, "=r,r", [b0], dtype=tl.float16, is_pure=True, pack=2)
        elif _field3_shift(S) > 5:  # four codes an asm: a plane's bytes and the next plane's (fields straddle)
            lo, hi = _field3_bytes(b0, b1, b2, S)
            vals = tl.inline_asm_elementwise(SHFL, "=r,=r,r,r", [lo, hi], dtype=tl.float16, is_pure=True, pack=4)
        else:
            lo, hi = _field3_bytes(b0, b1, b2, S)
            vals = tl.inline_asm_elementwise(SHFL, "=r,=r,r", [lo], dtype=tl.float16, is_pure=True, pack=4)
    elif TURBO and USE_ASM and _lut_kind(LUT) == "poly":
        POLY: tl.constexpr = _polynomial_asm(LUT, S)
        vals = tl.inline_asm_elementwise(POLY, "=r,r", [b0], dtype=tl.float16, is_pure=True, pack=2)
    elif TURBO and USE_ASM and LUT != "":
        ASM: tl.constexpr = _register_lut_asm(BITS, LUT, S)
        src = _field3_lanes(b0, b1, b2, S, USE_ASM) if BITS == 3 else b0
        vals = tl.inline_asm_elementwise(ASM, "=r,r", [src], dtype=tl.float16, is_pure=True, pack=2)
    elif TURBO:
        vals = _lookup(lut_ptr, _plane_codes(b0, b1, b2, S, BITS), BITS)
    elif BITS == 3:  # fp16 subnormals in place
        vals = _field3_lanes(b0, b1, b2, S, USE_ASM).to(tl.float16, bitcast=True)
    else:
        vals = _field_values(b0, S, BITS, USE_ASM)
    return vals


@triton.constexpr_function
def _lut_kind(lut):
    """How a turbo spec's codes become centroids in the kernel: ``LUT`` is ``""`` (:func:`_lookup`'s
    gather), ``"prmt:…"`` (byte permutes, :func:`_register_lut_asm`), ``"shfl:…"`` (warp shuffles,
    :func:`_shuffle_lut_asm`), the words after the colon being :func:`_register_lut_words`', or
    ``"poly:…"`` (the level polynomial, :func:`_polynomial_asm`; the words :func:`_polynomial_words`')."""
    return str(lut).partition(":")[0]


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
        body = "prmt.b32 a, $2, $3, 0x5140; prmt.b32 b, $2, $3, 0x7362; "
        srcs = [("a", shift), ("a", 16 + shift), ("b", shift), ("b", 16 + shift)]
    else:
        body = ""
        srcs = [("$2", 8 * k + shift) for k in range(4)]
    for r in range(4):
        src, sh = srcs[r]
        body += (f"shr.b32 i, {src}, {sh}; " if sh else f"mov.b32 i, {src}; ") + shfl.format(r)
    return head + body + "prmt.b32 $0, r0, r1, 0x5410; prmt.b32 $1, r2, r3, 0x5410; }"


@triton.constexpr_function
def _polynomial_asm(lut, s):
    """PTX for two 8-bit turbo codes to their fp16 levels computed from the code
    (:data:`~turboquant.quant.turbo.POLYNOMIAL_LEVELS`): ``$1`` two int16 row words, plane ``s``'s code
    in byte ``s`` of each; ``$0`` the two levels. A permute puts each code ``k`` in the low byte of a
    half and ``x·2 + 0x6401`` makes the half the fp16 number ``1025 + 2k``; ``u = x/256 − 5 =
    (2k + 1)/256 − 1`` (exact), ``w = u·u``, Horner's rule over ``w`` from the top coefficient (one
    ``fma`` each), times ``u``: the operations and roundings of :func:`~turboquant.quant.turbo._polynomial_levels`,
    whose values the table holds (``.rn``: ptxas keeps every rounding). Eight instructions per two
    codes, no memory: the 256-entry table was a shared-memory gather per code (:func:`_lookup`)."""
    coefs = [int(x, 16) for x in _lut_words(lut).split(",")]
    regs = "".join(f", c{i}" for i in range(len(coefs)))
    sel = 0x4040 | (2 + int(s)) << 8 | int(s)  # byte s of each word to the low byte of its half, zero above
    asm = "{ .reg .b32 x, u, w, p, k" + regs + "; " + "".join(f"mov.b32 c{i}, {c:#010x}; " for i, c in enumerate(coefs))
    asm += (f"prmt.b32 x, $1, 0, {sel:#06x}; mad.lo.u32 x, x, 2, 0x64016401; mov.b32 w, 0x1C001C00; "
            "mov.b32 k, 0xC500C500; fma.rn.f16x2 u, x, w, k; mul.rn.f16x2 w, u, u; ")
    top = len(coefs) - 1
    horner = "".join(f"fma.rn.f16x2 p, p, w, c{i}; " for i in reversed(range(top)))
    return asm + f"mov.b32 p, c{top}; " + horner + "mul.rn.f16x2 $0, p, u; }"


def _computed_levels(spec: TensorQuantSpec) -> bool:
    """Whether a spec's levels are a polynomial's values, which the kernel can compute from the code
    (:func:`_polynomial_asm`; turbo 8-bit) rather than look up."""
    return spec.method == "turbo" and spec.bits in POLYNOMIAL_LEVELS


def _polynomial_words(spec: TensorQuantSpec, d: int) -> str:
    """:func:`~turboquant.quant.turbo.level_polynomial`'s coefficients as ``fp16x2`` words (the
    coefficient in both halves), lowest power first."""
    half = torch.tensor(level_polynomial(d, spec.bits), dtype=torch.float16).view(torch.int16).to(torch.int32)
    return ",".join(f"{(h & 0xFFFF) * 0x10001:#x}" for h in half.tolist())


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


def _gathers(spec: TensorQuantSpec) -> bool:
    """Whether the kernels look a spec's codes up in a ≤ 16-entry centroid table."""
    return spec.method == "turbo" and spec.bits <= 4


def _register_lut(spec: TensorQuantSpec, one_warp: bool) -> bool:
    """Whether a gathering spec's (:func:`_gathers`) codes are looked up by byte permutes
    (:func:`_register_lut_asm`) by default rather than by ``tl.gather``, where :func:`_shuffle_lut`'s
    shuffles are off (on by default for 3- and 4-bit codes). H200, B=8, Hq=32, Hkv=8,
    D=128, CUDA graph µs, gather → register table (2026-12-03,
    ``benchmarks/results/decode_register_lut_session17.csv``): turbo 2-bit 277.8 → 121.3 at 32K and
    19.71 → 15.56 at 1K; turbo 3-bit 21.85 → 19.35 at 1K (four-warp programs) but 308.4 → 375.1 at
    32K (one-warp programs; not explained: their loop has fewer instructions with the table, 57.3
    against 69.3 per key in sm_90 SASS); turbo 4-bit slower in both (287.5 → 342.3, 17.26 → 20.14:
    sixteen entries take six permutes and a select per two codes, 23.1 against 17.3 warp
    instructions per key in sm_90 SASS). Those gather figures were the broadcast-table gather's;
    against :func:`_lookup`'s flat gather (2026-12-03, ``benchmarks/results/decode_gather_session19/``)
    the table still wins where it is on: 2-bit 247.1 → 121.5 at 32K and 20.25 → 15.59 at 1K, 3-bit
    23.25 → 19.42 at 1K."""
    return spec.bits == 2 or (spec.bits == 3 and not one_warp)


def _shuffle_lut(spec: TensorQuantSpec) -> bool:
    """Whether a gathering spec's (:func:`_gathers`) codes are looked up by warp shuffles from a table
    register (:func:`_shuffle_lut_asm`) by default; where on, it takes precedence over
    :func:`_register_lut`. sm_90 SASS of the loop, warp instructions per key (``benchmarks/decode_sass.py
    turbo BITS [--S 1024] --shuffle-lut``), default → shuffles: one-warp turbo 4-bit 44.2 → 30.9, 3-bit
    49.7 → 36.8, 2-bit 29.3 → 29.9 (against the byte permutes); four-warp (1K) 4-bit 14.4 → 9.4 per warp
    (registers 165 → 96), 3-bit 23.8 → 16.5, 2-bit 12.5 → 12.0. H200, B=8, Hq=32, Hkv=8, D=128, CUDA graph
    µs, default → shuffles (2026-12-04, ``benchmarks/results/session26_gpu/``): 32K turbo 4-bit 246.0 →
    149.8 (144.1 with the planes of :func:`_plane_hadamard`), 3-bit 288.2 → 166.1, 2-bit 110.4 → 133.1;
    16K 134.4 → 86.0, 152.4 → 88.3, 60.7 → 72.2; 1K 14.94 → 11.71, 17.50 → 17.31, 12.62 → 14.00. So 3-
    and 4-bit codes take the shuffles and 2-bit ones keep the permutes (one per two codes)."""
    return spec.bits in (3, 4)


def _lut_constexpr(spec: TensorQuantSpec, d: int, one_warp: bool, shuffle_lut: Optional[bool],
                   register_lut: Optional[bool], polynomial_levels: Optional[bool]) -> str:
    """The kernel's ``K_LUT``/``V_LUT`` for a spec (:func:`_lut_kind`): the lookup the overrides or the
    defaults (:func:`_shuffle_lut`, then :func:`_register_lut`) pick for a gathering spec, with its
    table words; the level polynomial for a polynomial one (:func:`_polynomial_asm`, unless
    ``polynomial_levels`` is False: then the table's gather)."""
    if _computed_levels(spec):
        return "" if polynomial_levels is False else f"poly:{_polynomial_words(spec, d)}"
    if not _gathers(spec):
        return ""
    if _shuffle_lut(spec) if shuffle_lut is None else shuffle_lut:
        return f"shfl:{_register_lut_words(spec, d)}"
    if _register_lut(spec, one_warp) if register_lut is None else register_lut:
        return f"prmt:{_register_lut_words(spec, d)}"
    return ""


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
        SCALE: tl.constexpr = _field_unit(BITS, TURBO, 0) / _field_unit(BITS, TURBO, S)
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
    return q_plane.to(tl.float32) * (_field_unit(BITS, TURBO, S) / _field_unit(BITS, TURBO, 0))


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


@triton.jit
def _decode_split_kernel(
    q_ptr, kc_ptr, km_ptr, vc_ptr, vm_ptr, klut_ptr, vlut_ptr, krot_ptr, vrot_ptr, mask_ptr, ring_pos_ptr, out_ptr,
    ws_ptr,
    S, n_parts, split_blocks, sm_scale, softcap,
    stride_qb, stride_qh, stride_ql,
    stride_kcb, stride_kch, stride_kcs,
    stride_kmb, stride_kmh, stride_kms,
    stride_vcb, stride_vch, stride_vcs,
    stride_vmb, stride_vmh, stride_vms,
    stride_mb, stride_mh, stride_ml, stride_ms,
    HKV: tl.constexpr, G: tl.constexpr, L: tl.constexpr, M: tl.constexpr, D: tl.constexpr, DQ: tl.constexpr,
    BLOCK_N: tl.constexpr,
    K_BITS: tl.constexpr, V_BITS: tl.constexpr, K_TURBO: tl.constexpr, V_TURBO: tl.constexpr,
    K_NBYTES: tl.constexpr, V_NBYTES: tl.constexpr, KP: tl.constexpr, VP: tl.constexpr,
    KPW: tl.constexpr, VPW: tl.constexpr, USE_ASM: tl.constexpr, FINAL: tl.constexpr,
    HAS_MASK: tl.constexpr, MASK_BOOL: tl.constexpr, IS_CAUSAL: tl.constexpr, SOFTCAP: tl.constexpr,
    RING_W: tl.constexpr, K_META: tl.constexpr, V_META: tl.constexpr, K_HADAMARD: tl.constexpr,
    V_HADAMARD: tl.constexpr, SKIP_RESCALE: tl.constexpr, NG: tl.constexpr, FIXED_BLOCKS: tl.constexpr,
    ROTATE: tl.constexpr, K_LUT: tl.constexpr, V_LUT: tl.constexpr, K_PLANE_H: tl.constexpr,
    V_PLANE_H: tl.constexpr, BLOCK_SUMS: tl.constexpr, K_ALIGN: tl.constexpr, V_ALIGN: tl.constexpr,
    KC_ROW: tl.constexpr, KM_ROW: tl.constexpr, VC_ROW: tl.constexpr, VM_ROW: tl.constexpr,
    K_PAIR: tl.constexpr, V_PAIR: tl.constexpr,
):
    # The packed row is never re-interleaved: a row of P planes meets the query as P dots over
    # matching strided query dims (keys), and the values accumulate into P strided output slices.
    tl.static_assert(KP * KPW >= D)
    tl.static_assert(VP * VPW >= D)
    tl.static_assert(KPW >= 16)
    tl.static_assert(VPW >= 16)
    # the caller passes the buffers as they are stored (bytes, integer metadata words, bool masks):
    # reinterpreting the pointers here spares a tensor view per buffer and call on the host
    if _code_word_bytes(K_BITS, K_NBYTES) == 2:
        kc_ptr = kc_ptr.to(tl.pointer_type(tl.int16))
    if _code_word_bytes(V_BITS, V_NBYTES) == 2:
        vc_ptr = vc_ptr.to(tl.pointer_type(tl.int16))
    km_ptr = km_ptr.to(tl.pointer_type(K_META))
    vm_ptr = vm_ptr.to(tl.pointer_type(V_META))
    if MASK_BOOL:
        mask_ptr = mask_ptr.to(tl.pointer_type(tl.uint8))
    po_ptr, pm_ptr, pl_ptr = _workspace(ws_ptr, tl.num_programs(0) * (G * L), n_parts, VP * VPW)
    pid_bh = tl.program_id(0)
    split = tl.program_id(1)
    b = (pid_bh // HKV).to(tl.int64)
    h = (pid_bh % HKV).to(tl.int64)

    # NG row groups: the tile's TR query rows repeated NG times down the M rows of the MMA, group r
    # reading keys r·SUB_N … of each block (key groups, see _row_groups)
    TR: tl.constexpr = M // NG
    SUB_N: tl.constexpr = BLOCK_N // NG
    tl.static_assert(NG == 1 or SUB_N >= 16)
    grp = tl.arange(0, M) // TR
    rows = tl.program_id(2) * TR + tl.arange(0, M) % TR  # query rows (head-major, then position) of this tile
    row_ok = rows < G * L
    qh = h * G + rows // L
    ql = rows % L
    q_row = q_ptr + b * stride_qb + qh[:, None] * stride_qh + ql[:, None] * stride_ql
    if K_PLANE_H:  # turbo, power-of-two D: the Hadamard rotation plane by plane, no matrix read
        q0, q1, q2, q3, q4, q5, q6, q7 = _hadamard_q_planes(q_row, row_ok, krot_ptr, KP, KPW, D)
    else:
        q_hi, q_lo = _q_halves(q_row, row_ok, D, DQ)  # read by turbo's rotation only (unused loads vanish otherwise)
        q0 = _q_plane(q_row, row_ok, q_hi, q_lo, krot_ptr, 0, KP, KPW, D, DQ, K_BITS, K_TURBO, K_HADAMARD)
        q1 = _q_plane(q_row, row_ok, q_hi, q_lo, krot_ptr, 1, KP, KPW, D, DQ, K_BITS, K_TURBO, K_HADAMARD)
        q2 = _q_plane(q_row, row_ok, q_hi, q_lo, krot_ptr, 2, KP, KPW, D, DQ, K_BITS, K_TURBO, K_HADAMARD)
        q3 = _q_plane(q_row, row_ok, q_hi, q_lo, krot_ptr, 3, KP, KPW, D, DQ, K_BITS, K_TURBO, K_HADAMARD)
        q4 = _q_plane(q_row, row_ok, q_hi, q_lo, krot_ptr, 4, KP, KPW, D, DQ, K_BITS, K_TURBO, K_HADAMARD)
        q5 = _q_plane(q_row, row_ok, q_hi, q_lo, krot_ptr, 5, KP, KPW, D, DQ, K_BITS, K_TURBO, K_HADAMARD)
        q6 = _q_plane(q_row, row_ok, q_hi, q_lo, krot_ptr, 6, KP, KPW, D, DQ, K_BITS, K_TURBO, K_HADAMARD)
        q7 = _q_plane(q_row, row_ok, q_hi, q_lo, krot_ptr, 7, KP, KPW, D, DQ, K_BITS, K_TURBO, K_HADAMARD)
    # Σq (for the key zero points) in plain units, from the fp16 query the dots see
    q_sum = tl.sum(_q_unscaled(q0, 0, K_BITS, K_TURBO) + _q_unscaled(q1, 1, K_BITS, K_TURBO)
                   + _q_unscaled(q2, 2, K_BITS, K_TURBO) + _q_unscaled(q3, 3, K_BITS, K_TURBO)
                   + _q_unscaled(q4, 4, K_BITS, K_TURBO) + _q_unscaled(q5, 5, K_BITS, K_TURBO)
                   + _q_unscaled(q6, 6, K_BITS, K_TURBO) + _q_unscaled(q7, 7, K_BITS, K_TURBO), axis=1)

    m_i = tl.full([M], float("-inf"), tl.float32)   # running max, log2 units
    l_i = tl.zeros([M], tl.float32)
    a0 = tl.zeros([M, VPW], tl.float32)
    a1 = tl.zeros([M, VPW], tl.float32)
    a2 = tl.zeros([M, VPW], tl.float32)
    a3 = tl.zeros([M, VPW], tl.float32)
    a4 = tl.zeros([M, VPW], tl.float32)
    a5 = tl.zeros([M, VPW], tl.float32)
    a6 = tl.zeros([M, VPW], tl.float32)
    a7 = tl.zeros([M, VPW], tl.float32)
    z_acc = tl.zeros([M], tl.float32)
    qk_scale = sm_scale if SOFTCAP else sm_scale * LOG2E
    K_UNIT: tl.constexpr = _field_unit(K_BITS, K_TURBO, 0)  # what one unit of the dots is worth
    rz = tl.cast(S < 0, tl.float32)  # never true; see _plus_dot

    start = split * (split_blocks * BLOCK_N)
    km_base = km_ptr + b * stride_kmb + h * stride_kmh
    vm_base = vm_ptr + b * stride_vmb + h * stride_vmh
    stride_kcb, stride_kch, stride_kcs = _aligned(stride_kcb, stride_kch, stride_kcs, K_ALIGN)
    stride_vcb, stride_vch, stride_vcs = _aligned(stride_vcb, stride_vch, stride_vcs, V_ALIGN)
    stride_kcs, stride_kms = _row_stride(stride_kcs, KC_ROW), _row_stride(stride_kms, KM_ROW)
    stride_vcs, stride_vms = _row_stride(stride_vcs, VC_ROW), _row_stride(stride_vms, VM_ROW)
    kc_base = kc_ptr + b * stride_kcb + h * stride_kch
    vc_base = vc_ptr + b * stride_vcb + h * stride_vch
    # each key's position as the scores hold it: [BLOCK_N], or [M, SUB_N] with row groups
    kpos = _key_positions(start, grp, BLOCK_N, NG)
    # ROTATE: each program walks its split from its own block on, wrapping around (the softmax does
    # not care about order), so the programs of a wave do not all read at the same offset of their
    # splits (at power-of-two lengths, multiples of 256 KB apart). H200, 32K, CUDA graph µs: turbo
    # 3-bit 319.2 → 308.3, 2-bit 283.2 → 276.1, affine 8-bit 136.6 → 134.8; affine 4/3/2-bit within
    # ±1.5% of either sign (benchmarks/RESULTS.md, fourteenth session)
    first = 0
    if ROTATE:
        first = ((pid_bh * tl.num_programs(1) + split) * 37) % split_blocks
    k_scale, k_zero, v_scale, v_zero = _block_meta(km_base, vm_base, start + first * BLOCK_N + tl.arange(0, BLOCK_N),
                                                   S, stride_kms, stride_vms, K_TURBO, V_TURBO, K_META, V_META,
                                                   K_PAIR, V_PAIR)
    # blocks per split: an argument for one-warp programs, a constant for four-warp ones and under
    # the interpreter (_make_plan); named inside range(), since the interpreter turns a constant
    # assigned to a variable into an array as well
    for i in range(FIXED_BLOCKS if FIXED_BLOCKS > 0 else split_blocks):
        j = i
        j_next = i + 1
        if ROTATE:
            j = i + first
            j = tl.where(j >= split_blocks, j - split_blocks, j)
            j_next = tl.where(j + 1 >= split_blocks, 0, j + 1)
        blk = start + j * BLOCK_N
        n = kpos + j * BLOCK_N
        n64 = n.to(tl.int64)
        # the next block's metadata is loaded a block ahead (the codes go through the pipeliner's
        # shared-memory stages, these small loads do not): loaded in the block that reads them, each
        # waited the full memory latency, 24% of affine 4-bit's and 48% of 8-bit's issue cycles at 32K
        # (ncu long-scoreboard stalls, H200, one-warp programs)
        next_meta = _block_meta(km_base, vm_base, start + j_next * BLOCK_N + tl.arange(0, BLOCK_N), S, stride_kms,
                                stride_vms, K_TURBO, V_TURBO, K_META, V_META, K_PAIR, V_PAIR)

        # ---- scores -------------------------------------------------------------------
        dots = _block_dots(q0, q1, q2, q3, q4, q5, q6, q7, kc_base, blk, S, stride_kcs, grp, K_BITS, K_TURBO,
                           K_NBYTES, KP, KPW, BLOCK_N, NG, klut_ptr, USE_ASM, K_LUT)
        if K_TURBO:
            s = dots * _per_key(k_scale.to(tl.float32) * (qk_scale / K_UNIT), NG, TR)
        else:
            a_k = k_scale.to(tl.float32) * qk_scale
            z_k = k_zero.to(tl.float32)
            s = dots * _per_key(a_k / K_UNIT, NG, TR) - q_sum[:, None] * _per_key(z_k * a_k, NG, TR)
        if SOFTCAP:
            s = softcap * (2.0 * tl.sigmoid(2.0 * s / softcap) - 1.0)  # softcap · tanh(s / softcap)
            s = s * LOG2E
        # rows past G·L are padding (zero queries, never stored): only keys are masked
        keep = _per_key(n < S, NG)
        if IS_CAUSAL:  # top-left aligned, as scaled_dot_product_attention
            keep = keep & (_per_key(n, NG) <= ql[:, None])
        if HAS_MASK:
            keep = keep & row_ok[:, None]
            mptr = (mask_ptr + b * stride_mb + qh[:, None] * stride_mh + ql[:, None] * stride_ml
                    + _per_key(n64, NG) * stride_ms)
            if MASK_BOOL:
                keep = keep & (tl.load(mptr, mask=keep, other=0) != 0)
            else:
                s = s + tl.load(mptr, mask=keep, other=0.0).to(tl.float32) * LOG2E
        if RING_W > 0:  # positions a residual window's ring holds are the wrapper's part, read dense
            held = tl.load(ring_pos_ptr + n64 % RING_W, mask=n < S, other=-1) == n64
            keep = keep & ~_per_key(held, NG)
        s = tl.where(keep, s, float("-inf"))

        # ---- online softmax (base 2) ------------------------------------------------------
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.exp2(s - m_safe[:, None])
        if SKIP_RESCALE:
            # the accumulators are rescaled only in blocks where some row's running max rose (a few
            # blocks of a long split): the same arithmetic without multiplying by 1 everywhere else.
            # One-warp programs only, where the test is a few shuffles; with four warps it is one
            # more barrier per block. H200, 32K, CUDA graph: affine 8-bit 136.8 → 133.7 µs, 4-bit
            # 91.2 → 88.1, 3-bit 104.9 → 101.9, 2-bit 78.0 → 79.2 (benchmarks/RESULTS.md)
            # (four-warp programs rescale as the accumulators enter the value dots below, where
            # this path's factor is 1: 4% fewer loop instructions for four-warp affine 2-bit than
            # rescaling them here, sm_90 SASS)
            if tl.max((m_new > m_i).to(tl.int32), axis=0) > 0:
                l_i, z_acc, a0, a1, a2, a3, a4, a5, a6, a7 = _rescaled(
                    tl.exp2(m_i - m_safe), l_i, z_acc, a0, a1, a2, a3, a4, a5, a6, a7, VP)
            alpha = tl.full([M], 1.0, tl.float32)
        else:
            alpha = tl.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        m_i = m_new

        # ---- values -------------------------------------------------------------------------
        pv = (p * _per_key(v_scale.to(tl.float32), NG, TR)).to(tl.float16)
        if not V_TURBO:
            # values enter the dots as exact codes (no offset: one would cancel over thousands of keys)
            z_v = v_zero.to(tl.float32)
            z_acc = z_acc * alpha + tl.sum(pv.to(tl.float32) * _per_key(z_v, NG, TR), axis=1)
        # group r's probabilities meet sub-block r's values; the other groups' rows are zeros there
        a0, a1, a2, a3, a4, a5, a6, a7 = _value_dots(
            pv if NG == 1 else _group_rows(pv, grp, 0, USE_ASM), vc_base, blk, S, stride_vcs,
            a0 * alpha[:, None], a1 * alpha[:, None], a2 * alpha[:, None], a3 * alpha[:, None], a4 * alpha[:, None],
            a5 * alpha[:, None], a6 * alpha[:, None], a7 * alpha[:, None], V_BITS, V_TURBO, V_NBYTES, VP, VPW, SUB_N,
            vlut_ptr, USE_ASM, V_LUT, rz, BLOCK_SUMS)
        for r in tl.static_range(1, NG):
            a0, a1, a2, a3, a4, a5, a6, a7 = _value_dots(
                _group_rows(pv, grp, r, USE_ASM), vc_base, blk + r * SUB_N, S, stride_vcs, a0, a1, a2, a3, a4,
                a5, a6, a7, V_BITS, V_TURBO, V_NBYTES, VP, VPW, SUB_N, vlut_ptr, USE_ASM, V_LUT, rz, BLOCK_SUMS)
        k_scale, k_zero, v_scale, v_zero = next_meta

    if NG > 1:  # the row groups' running sums become each query row's (log-sum-exp), TR rows from here
        m_i, l_i, z_acc, a0, a1, a2, a3, a4, a5, a6, a7 = _merged_row_groups(m_i, l_i, z_acc, a0, a1, a2, a3, a4,
                                                                             a5, a6, a7, NG, TR, VP)
        rows = tl.program_id(2) * TR + tl.arange(0, TR)
        row_ok = rows < G * L
        qh = h * G + rows // L
        ql = rows % L

    W_OUT: tl.constexpr = D if FINAL else VP * VPW  # row width of what this program stores
    if FINAL:  # one split: normalise here, no partials
        out_row = out_ptr + ((b * HKV * G + qh) * L + ql)[:, None] * D
        inv = 1.0 / tl.where(l_i > 0, l_i, 1.0)  # every key masked: 0, as the oracle
        z_c = (z_acc * inv)[:, None]
        inv = inv[:, None]
    else:  # partials: [B, Hq, L, n_parts, VP·VPW] in natural dim order (a ring's part is the last)
        prow = ((b * HKV * G + qh) * L + ql) * n_parts + split
        out_row = po_ptr + prow[:, None] * (VP * VPW)
        inv = tl.full([TR, 1], 1.0, tl.float32)
        z_c = z_acc[:, None]
        tl.store(pm_ptr + prow, m_i, mask=row_ok)
        tl.store(pl_ptr + prow, l_i, mask=row_ok)
    if V_TURBO:  # rotated back here, so every part leaves in the model's dims (the merge only adds)
        # each row scaled by its largest magnitude: the fp16 halves of the MMAs neither overflow nor
        # lose a row of small values
        c = tl.max(tl.abs(a0), axis=1)
        if VP > 1:
            c = tl.maximum(c, tl.max(tl.abs(a1), axis=1))
        if VP > 2:
            c = tl.maximum(tl.maximum(c, tl.max(tl.abs(a2), axis=1)), tl.max(tl.abs(a3), axis=1))
        if VP > 4:
            c = tl.maximum(tl.maximum(c, tl.max(tl.abs(a4), axis=1)), tl.max(tl.abs(a5), axis=1))
            c = tl.maximum(tl.maximum(c, tl.max(tl.abs(a6), axis=1)), tl.max(tl.abs(a7), axis=1))
        c = tl.where(c > 0, c, 1.0)[:, None]
        if V_PLANE_H:
            # S < 0 is never true, but the compiler cannot know: the in-plane matrix is made again
            # here instead of being held through the loop
            _store_hadamard_back(out_row, a0, a1, a2, a3, a4, a5, a6, a7, c, c * inv, rz.to(tl.int32), vrot_ptr,
                                 row_ok, VP, VPW, D)
        else:
            _store_dense_back(out_row, a0, a1, a2, a3, a4, a5, a6, a7, c, c * inv, vrot_ptr, row_ok, VP, VPW, D, DQ,
                              V_HADAMARD)
    else:
        _store_plane(out_row, a0 * (inv / _field_unit(V_BITS, V_TURBO, 0)) - z_c, 0, VP, VPW, row_ok, W_OUT)
        if VP > 1:
            _store_plane(out_row, a1 * (inv / _field_unit(V_BITS, V_TURBO, 1)) - z_c, 1, VP, VPW, row_ok, W_OUT)
        if VP > 2:
            _store_plane(out_row, a2 * (inv / _field_unit(V_BITS, V_TURBO, 2)) - z_c, 2, VP, VPW, row_ok, W_OUT)
            _store_plane(out_row, a3 * (inv / _field_unit(V_BITS, V_TURBO, 3)) - z_c, 3, VP, VPW, row_ok, W_OUT)
        if VP > 4:
            _store_plane(out_row, a4 * (inv / _field_unit(V_BITS, V_TURBO, 4)) - z_c, 4, VP, VPW, row_ok, W_OUT)
            _store_plane(out_row, a5 * (inv / _field_unit(V_BITS, V_TURBO, 5)) - z_c, 5, VP, VPW, row_ok, W_OUT)
            _store_plane(out_row, a6 * (inv / _field_unit(V_BITS, V_TURBO, 6)) - z_c, 6, VP, VPW, row_ok, W_OUT)
            _store_plane(out_row, a7 * (inv / _field_unit(V_BITS, V_TURBO, 7)) - z_c, 7, VP, VPW, row_ok, W_OUT)


@triton.jit
def _aligned(sb, sh, ss, ALIGN: tl.constexpr):
    """Code strides as the multiples of ``ALIGN`` words they are (:func:`_code_alignment`): an identity
    the compiler reads, where the JIT marks only multiples of 16."""
    if ALIGN > 1:
        sb = (sb // ALIGN) * ALIGN
        sh = (sh // ALIGN) * ALIGN
        ss = (ss // ALIGN) * ALIGN
    return sb, sh, ss


@triton.jit
def _row_stride(stride, ROW: tl.constexpr):
    """A row stride as the constant ``ROW`` where the launcher knows it (:func:`_row_constants`; else 0).
    Each key's load address is then the block's base plus a constant, where a run-time stride took a
    64-bit multiply and add per row."""
    if ROW > 0:
        stride = ROW
    return stride


@triton.jit
def _rescaled(alpha, l_i, z_acc, a0, a1, a2, a3, a4, a5, a6, a7, VP: tl.constexpr):
    """The running sums of a split (normaliser, value zero-point sum, the ``VP`` used accumulators)
    times ``alpha``, the drop of each row's running max (``2^(m_old − m_new)``)."""
    a0 = a0 * alpha[:, None]
    if VP > 1:
        a1 = a1 * alpha[:, None]
    if VP > 2:
        a2 = a2 * alpha[:, None]
        a3 = a3 * alpha[:, None]
    if VP > 4:
        a4 = a4 * alpha[:, None]
        a5 = a5 * alpha[:, None]
        a6 = a6 * alpha[:, None]
        a7 = a7 * alpha[:, None]
    return l_i * alpha, z_acc * alpha, a0, a1, a2, a3, a4, a5, a6, a7


@triton.jit
def _key_positions(start, grp, BLOCK_N: tl.constexpr, NG: tl.constexpr):
    """Positions of a block's keys as the scores hold them: ``[BLOCK_N]`` (one row group: every row
    reads every key), or ``[M, BLOCK_N / NG]`` (row group ``r`` reads keys ``r · BLOCK_N / NG …``)."""
    if NG == 1:
        pos = start + tl.arange(0, BLOCK_N)
    else:
        SUB_N: tl.constexpr = BLOCK_N // NG
        pos = start + grp[:, None] * SUB_N + tl.arange(0, SUB_N)[None, :]
    return pos


@triton.jit
def _per_key(x, NG: tl.constexpr, TR: tl.constexpr = 1):
    """A per-key quantity in the score tile's shape: broadcast over the rows if ``x`` has
    :func:`_key_positions`' shape; a block's ``[BLOCK_N]`` laid out ``[M, BLOCK_N / NG]`` with
    ``TR`` rows per group given."""
    if NG == 1:
        x = x[None, :]
    elif len(x.shape) == 1:
        SUB_N: tl.constexpr = x.shape[0] // NG
        x = tl.reshape(tl.broadcast_to(tl.reshape(x, [NG, 1, SUB_N]), [NG, TR, SUB_N]), [NG * TR, SUB_N])
    return x


@triton.jit
def _key_dots(q0, q1, q2, q3, q4, q5, q6, q7, kc_base, first, S, stride_kcs, BITS: tl.constexpr, TURBO: tl.constexpr,
              NBYTES: tl.constexpr, KP: tl.constexpr, KPW: tl.constexpr, N: tl.constexpr, klut_ptr,
              USE_ASM: tl.constexpr, LUT: tl.constexpr):
    """The query planes' dots with keys ``first … first + N − 1`` (``[M, N]``, in plane 0's units)."""
    n = first + tl.arange(0, N)
    k0, k1, k2 = _load_row_bytes(kc_base + n.to(tl.int64)[:, None] * stride_kcs, n < S, BITS, NBYTES, KPW)
    dots = tl.dot(q0, tl.trans(_plane_values(k0, k1, k2, 0, BITS, TURBO, klut_ptr, USE_ASM, LUT)))
    if KP > 1:
        dots = tl.dot(q1, tl.trans(_plane_values(k0, k1, k2, 1, BITS, TURBO, klut_ptr, USE_ASM, LUT)), dots)
    if KP > 2:
        dots = tl.dot(q2, tl.trans(_plane_values(k0, k1, k2, 2, BITS, TURBO, klut_ptr, USE_ASM, LUT)), dots)
        dots = tl.dot(q3, tl.trans(_plane_values(k0, k1, k2, 3, BITS, TURBO, klut_ptr, USE_ASM, LUT)), dots)
    if KP > 4:
        dots = tl.dot(q4, tl.trans(_plane_values(k0, k1, k2, 4, BITS, TURBO, klut_ptr, USE_ASM, LUT)), dots)
        dots = tl.dot(q5, tl.trans(_plane_values(k0, k1, k2, 5, BITS, TURBO, klut_ptr, USE_ASM, LUT)), dots)
        dots = tl.dot(q6, tl.trans(_plane_values(k0, k1, k2, 6, BITS, TURBO, klut_ptr, USE_ASM, LUT)), dots)
        dots = tl.dot(q7, tl.trans(_plane_values(k0, k1, k2, 7, BITS, TURBO, klut_ptr, USE_ASM, LUT)), dots)
    return dots


@triton.jit
def _block_dots(q0, q1, q2, q3, q4, q5, q6, q7, kc_base, blk, S, stride_kcs, grp, BITS: tl.constexpr,
                TURBO: tl.constexpr, NBYTES: tl.constexpr, KP: tl.constexpr, KPW: tl.constexpr,
                BLOCK_N: tl.constexpr, NG: tl.constexpr, klut_ptr, USE_ASM: tl.constexpr,
                LUT: tl.constexpr):
    """A block's dots in the score tile's layout: group ``r``'s rows take the dots of sub-block ``r``
    (every group's MMA rows are computed and the others dropped: the MMA pads to 16 rows anyway,
    and the softmax then runs once for the block)."""
    SUB_N: tl.constexpr = BLOCK_N // NG
    dots = _key_dots(q0, q1, q2, q3, q4, q5, q6, q7, kc_base, blk, S, stride_kcs, BITS, TURBO, NBYTES, KP, KPW, SUB_N,
                     klut_ptr, USE_ASM, LUT)
    for r in tl.static_range(1, NG):
        dots = tl.where(grp[:, None] == r, _key_dots(q0, q1, q2, q3, q4, q5, q6, q7, kc_base, blk + r * SUB_N, S,
                                                     stride_kcs, BITS, TURBO, NBYTES, KP, KPW, SUB_N, klut_ptr,
                                                     USE_ASM, LUT), dots)
    return dots


@triton.jit
def _plus_dot(pv, vals, acc, rz, BLOCK_SUMS: tl.constexpr):
    """``acc + pv @ vals``. The MMA's fp32 accumulation truncates, a bias that grows with the number of
    blocks summed into one accumulator; affine values cancel their zero point only at the end (sums
    some 500 times the output at 32K keys), so there the bias showed: affine 8-bit 3.06e-3 from a
    float64 attention at 32K against 1.68e-3 at 1K and for the widths with row groups (whose rows sum a
    quarter of the blocks each). With ``BLOCK_SUMS`` each block's dot starts from zero and joins the
    sum by an fp32 add, which rounds to nearest. ``rz``: a run-time 0, since Triton folds ``acc + dot(a,
    b, 0)`` back into ``dot(a, b, acc)``."""
    if BLOCK_SUMS:
        return acc + tl.dot(pv, vals, tl.zeros_like(acc) + rz)
    return tl.dot(pv, vals, acc)


@triton.jit
def _value_dots(pv, vc_base, first, S, stride_vcs, a0, a1, a2, a3, a4, a5, a6, a7, BITS: tl.constexpr,
                TURBO: tl.constexpr, NBYTES: tl.constexpr, VP: tl.constexpr, VPW: tl.constexpr, N: tl.constexpr,
                vlut_ptr, USE_ASM: tl.constexpr, LUT: tl.constexpr, rz, BLOCK_SUMS: tl.constexpr):
    """The accumulators plus ``pv [M, N]`` times the values of keys ``first … first + N − 1``, plane by plane
    (:func:`_plus_dot`)."""
    n = first + tl.arange(0, N)
    v0, v1, v2 = _load_row_bytes(vc_base + n.to(tl.int64)[:, None] * stride_vcs, n < S, BITS, NBYTES, VPW)
    a0 = _plus_dot(pv, _plane_values(v0, v1, v2, 0, BITS, TURBO, vlut_ptr, USE_ASM, LUT), a0, rz, BLOCK_SUMS)
    if VP > 1:
        a1 = _plus_dot(pv, _plane_values(v0, v1, v2, 1, BITS, TURBO, vlut_ptr, USE_ASM, LUT), a1, rz, BLOCK_SUMS)
    if VP > 2:
        a2 = _plus_dot(pv, _plane_values(v0, v1, v2, 2, BITS, TURBO, vlut_ptr, USE_ASM, LUT), a2, rz, BLOCK_SUMS)
        a3 = _plus_dot(pv, _plane_values(v0, v1, v2, 3, BITS, TURBO, vlut_ptr, USE_ASM, LUT), a3, rz, BLOCK_SUMS)
    if VP > 4:
        a4 = _plus_dot(pv, _plane_values(v0, v1, v2, 4, BITS, TURBO, vlut_ptr, USE_ASM, LUT), a4, rz, BLOCK_SUMS)
        a5 = _plus_dot(pv, _plane_values(v0, v1, v2, 5, BITS, TURBO, vlut_ptr, USE_ASM, LUT), a5, rz, BLOCK_SUMS)
        a6 = _plus_dot(pv, _plane_values(v0, v1, v2, 6, BITS, TURBO, vlut_ptr, USE_ASM, LUT), a6, rz, BLOCK_SUMS)
        a7 = _plus_dot(pv, _plane_values(v0, v1, v2, 7, BITS, TURBO, vlut_ptr, USE_ASM, LUT), a7, rz, BLOCK_SUMS)
    return a0, a1, a2, a3, a4, a5, a6, a7


@triton.jit
def _group_rows(pv, grp, r, USE_ASM: tl.constexpr):
    """``pv`` on row group ``r``'s rows, zeros on the others. On the GPU an ``and`` with a row mask per two
    values: ``tl.where`` on fp16 selected each value apart and packed the pairs again (sm_90 SASS of the
    loop at 32K, affine 4 / 3 / 2-bit 14.34 / 20.80 / 13.42 → 13.97 / 20.25 / 13.08 warp instructions per
    key; not timed)."""
    if USE_ASM:
        keep = tl.broadcast_to(tl.where(grp[:, None] == r, -1, 0).to(tl.int16), pv.shape)
        pv = tl.inline_asm_elementwise("and.b32 $0, $1, $2;", "=r,r,r", [pv, keep], dtype=tl.float16,
                                       is_pure=True, pack=2)
    else:
        pv = tl.where(grp[:, None] == r, pv, 0.0)
    return pv


@triton.jit
def _group_merge(x, w, NG: tl.constexpr, TR: tl.constexpr):
    """``Σ_r w_r · x_r`` over the row groups of ``x [NG·TR, …]`` (weights per row): ``[TR, …]``."""
    if len(x.shape) == 1:
        y = tl.sum(tl.reshape(x * w, [NG, TR]), axis=0)
    else:
        y = tl.sum(tl.reshape(x * w[:, None], [NG, TR, x.shape[1]]), axis=0)
    return y


@triton.jit
def _merged_row_groups(m_i, l_i, z_acc, a0, a1, a2, a3, a4, a5, a6, a7, NG: tl.constexpr, TR: tl.constexpr,
                       VP: tl.constexpr):
    """The row groups' running max, normaliser, value zero-point sum and accumulators merged into each
    query row's (log-sum-exp), as the merge kernel merges splits."""
    m_row = tl.max(tl.reshape(m_i, [NG, TR]), axis=0)
    m_safe = tl.where(m_row == float("-inf"), 0.0, m_row)
    m_b = tl.reshape(tl.broadcast_to(m_safe[None, :], [NG, TR]), [NG * TR])
    w = tl.where(m_i == float("-inf"), 0.0, tl.exp2(m_i - m_b))
    a0 = _group_merge(a0, w, NG, TR)
    if VP > 1:
        a1 = _group_merge(a1, w, NG, TR)
    if VP > 2:
        a2 = _group_merge(a2, w, NG, TR)
        a3 = _group_merge(a3, w, NG, TR)
    if VP > 4:
        a4 = _group_merge(a4, w, NG, TR)
        a5 = _group_merge(a5, w, NG, TR)
        a6 = _group_merge(a6, w, NG, TR)
        a7 = _group_merge(a7, w, NG, TR)
    return m_row, _group_merge(l_i, w, NG, TR), _group_merge(z_acc, w, NG, TR), a0, a1, a2, a3, a4, a5, a6, a7


@triton.jit
def _block_meta(km_base, vm_base, n, S, stride_kms, stride_vms, K_TURBO: tl.constexpr, V_TURBO: tl.constexpr,
                K_META: tl.constexpr, V_META: tl.constexpr, K_PAIR: tl.constexpr, V_PAIR: tl.constexpr):
    """Keys ``n``'s metadata as stored: K scale (turbo: norm), K zero point, V scale (norm), V zero
    point; a turbo row has no zero point (its norm stands in, unread)."""
    n_ok = n < S
    k_scale, k_zero = _scale_zero(km_base + n.to(tl.int64) * stride_kms, n_ok, K_TURBO, K_META, K_PAIR)
    v_scale, v_zero = _scale_zero(vm_base + n.to(tl.int64) * stride_vms, n_ok, V_TURBO, V_META, V_PAIR)
    return k_scale, k_zero, v_scale, v_zero


@triton.jit
def _scale_zero(row, n_ok, TURBO: tl.constexpr, META: tl.constexpr, PAIR: tl.constexpr):
    """One key's scale and zero point from its metadata row (turbo: the norm, twice). ``PAIR``: the row
    is the integer word that holds the pair (:func:`turboquant.quant.affine.metadata_word`), read in
    one load."""
    if PAIR:
        if META.primitive_bitwidth == 16:
            w = tl.load(row.to(tl.pointer_type(tl.int32)), mask=n_ok, other=0)
            scale = w.to(tl.int16).to(META, bitcast=True)
            zero = (w >> 16).to(tl.int16).to(META, bitcast=True)
        else:
            w = tl.load(row.to(tl.pointer_type(tl.int64)), mask=n_ok, other=0)
            scale = w.to(tl.int32).to(META, bitcast=True)
            zero = (w >> 32).to(tl.int32).to(META, bitcast=True)
    else:
        scale = tl.load(row, mask=n_ok, other=0.0)
        zero = scale if TURBO else tl.load(row + 1, mask=n_ok, other=0.0)
    return scale, zero


@triton.jit
def _workspace(ws_ptr, n_rows, n_parts, PO_W: tl.constexpr):
    """The split kernel's partials in one allocation: outputs ``[rows, n_parts, PO_W]``, then the
    running maxima and the normalisers ``[rows, n_parts]`` each (one allocation per call, not three)."""
    n_rp = n_rows.to(tl.int64) * n_parts
    pm_ptr = ws_ptr + n_rp * PO_W
    return ws_ptr, pm_ptr, pm_ptr + n_rp


@triton.jit
def _merge_splits_kernel(ws_ptr, out_ptr, n_splits, D: tl.constexpr, PO_W: tl.constexpr, BLOCK_D: tl.constexpr,
                         BLOCK_SPLITS: tl.constexpr):
    """One output row from its splits' (max in log2 units, normaliser, unnormalised output in the
    model's dims).

    A kernel of its own, one program per row: merged by the split kernel's last program instead
    (one launch), 32K affine 4-bit ran 152 µs against 117 (its registers crossed 128, one program
    per SM fewer) and turbo 4-bit at 1K 27.6 against 20.8 (H200, 2026-12-01). Nor as a programmatic
    dependent launch (the split kernel signalling at its start, the merge waiting at
    ``griddepcontrol.wait``): H200, B=8, Hq=32, Hkv=8, D=128, CUDA graph µs, plain → dependent
    (2026-12-05, ``benchmarks/results/session28_gpu/decode_variants_pdl_*.csv``): 1K affine 8 / 4 / 3 /
    2-bit 8.65 → 13.20, 7.88 → 7.68, 10.03 → 10.05, 8.69 → 8.61, turbo 23.58 → 25.22, 11.68 → 13.04,
    17.19 → 17.36, 12.59 → 14.37; 32K affine 4 / 3-bit 81.9 → 82.4, 96.6 → 98.3."""
    po_ptr, pm_ptr, pl_ptr = _workspace(ws_ptr, tl.num_programs(0), n_splits, PO_W)
    row = tl.program_id(0).to(tl.int64)
    sp = tl.arange(0, BLOCK_SPLITS)
    sp_ok = sp < n_splits
    m = tl.load(pm_ptr + row * n_splits + sp, mask=sp_ok, other=float("-inf"))
    l = tl.load(pl_ptr + row * n_splits + sp, mask=sp_ok, other=0.0)
    m_max = tl.max(m, axis=0)
    m_max = tl.where(m_max == float("-inf"), 0.0, m_max)
    w = tl.where(sp_ok, tl.exp2(m - m_max), 0.0)
    den = tl.sum(w * l, axis=0)
    d = tl.arange(0, BLOCK_D)
    o = tl.load(po_ptr + (row * n_splits + sp[:, None]) * PO_W + d[None, :], mask=sp_ok[:, None] & (d[None, :] < D),
                other=0.0)
    acc = tl.sum(w[:, None] * o, axis=0)
    acc = acc / tl.where(den > 0, den, 1.0)  # every key masked: 0, as the oracle
    tl.store(out_ptr + row * D + d, acc.to(out_ptr.dtype.element_ty), mask=d < D)


def supports(q: torch.Tensor, k_spec: TensorQuantSpec, v_spec: TensorQuantSpec, head_dim: int, v_head_dim: int,
             hkv: int) -> Optional[str]:
    """None if the kernel handles this call, else the reason it does not."""
    return unsupported(q.shape[1], q.shape[2], k_spec, v_spec, head_dim, v_head_dim, hkv)


def unsupported(hq: int, lq: int, k_spec: TensorQuantSpec, v_spec: TensorQuantSpec, head_dim: int, v_head_dim: int,
                 hkv: int) -> Optional[str]:
    """:func:`supports` from the numbers alone (query heads and length, KV heads)."""
    if lq > MAX_QUERY_LEN:
        return f"query length {lq} > {MAX_QUERY_LEN} (prefill)"
    if head_dim != v_head_dim:
        return "K and V head dims differ"
    for spec in (k_spec, v_spec):
        if spec.method == "affine" and spec.resolved_group_size(head_dim) != head_dim:
            return f"affine group_size={spec.group_size} < head_dim"
    if hq % hkv:
        return "query heads are not a multiple of KV heads"
    for spec, d in ((k_spec, head_dim), (v_spec, v_head_dim)):
        if spec.bits != 3 and (d * spec.bits) % 16:
            return f"{spec.bits}-bit rows of head_dim {d} are not whole 16-bit words"
    return None


def _ring_part(q, k_ring, v_ring, ring_pos, S, attn_mask, is_causal, scale, softcap, po, pm, pl):
    """The ring's partial, written into the last part: unnormalised output (the model's dims, as
    the kernel's parts), running max in log2 units, normaliser."""
    B, HQ, L = q.shape[:3]
    g = HQ // k_ring.shape[1]
    kr = k_ring.float().repeat_interleave(g, 1)
    vr = v_ring.float().repeat_interleave(g, 1)
    s = (q.float() @ kr.transpose(-1, -2)) * scale                     # [B, Hq, L, W]
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    s = s * LOG2E.value
    w = ring_pos.shape[0]
    # a slot counts only where it holds its own position (pos mod W), as overlay_ring reads it
    keep = ((ring_pos >= 0) & (ring_pos < S) & (ring_pos % w == torch.arange(w, device=q.device))).expand(B, HQ, L, -1)
    if is_causal:  # top-left aligned, as the kernel and scaled_dot_product_attention
        keep = keep & (ring_pos[None, :] <= torch.arange(L, device=q.device)[:, None])
    if attn_mask is not None:
        m = attn_mask.expand(B, HQ, L, S).index_select(-1, ring_pos.clamp(0, max(S - 1, 0)))
        if m.dtype == torch.bool:
            keep = keep & m
        else:
            s = s + m.float() * LOG2E.value
    s = s.masked_fill(~keep, float("-inf"))
    m_r = s.amax(-1)
    p = torch.exp2(s - torch.where(m_r == float("-inf"), 0.0, m_r)[..., None])
    pm.copy_(m_r)
    pl.copy_(p.sum(-1))
    po.copy_(p @ vr)


def _one_warp_programs(k_spec: TensorQuantSpec, v_spec: TensorQuantSpec, S: int, rows: int,
                       polynomial_levels: bool = True) -> bool:
    """Whether a long cache's programs are one warp each (64 keys per block, 32 for 8-bit rows, 3
    stages, 4 query rows per tile). Four warps split a block's keys and meet at a barrier for every
    max, sum and layout change of the softmax (18 per block, sm_90 SASS); one warp has none of them and
    eight such programs fit an SM. H200, 32K context, B=8, Hq=32, Hkv=8, D=128, CUDA graph µs, four
    warps against one (2026-12-02, ``benchmarks/results/decode_sweep_one_warp_session11.csv`` and
    ``decode_one_warp_threshold_session11.csv``; ``benchmarks/decode_attention.py --sweep`` sweeps the
    same parameters): affine 4-bit 117.1 → 100.3, 3-bit 229.9 → 106.3,
    2-bit 146.4 → 90.9, 8-bit 173.1 → 159.1; turbo 3-bit 371.6 → 306.5 and 2-bit 327.6 → 269.3 (with
    spills). Turbo 4-bit, with the centroid gather of :func:`_lookup`: 264.6 → 247.6 (2026-12-03,
    ``benchmarks/results/decode_gather_session19/``). At 1K every width ran slower with one warp (affine
    4-bit 9.6 → 11.6 µs): a short split is mostly the program's fixed work (the query planes, the
    epilogue), which one warp does alone. Turbo 8-bit with its levels computed (:func:`_polynomial_asm`)
    takes one warp at every length: 32K 222.6 → 200.3, 1K 21.42 → 18.29 (head_dim 64: 123.7 → 111.2,
    10.78 → 10.32; 2026-12-05, ``benchmarks/results/session29_gpu/``); gathered from its 256-entry table
    (``polynomial_levels=False``) it keeps four warps (410.2 → 1450 at 32K: a one-warp gather of 256
    entries is shuffles and selects, not a shared-memory load). A tile of more than 16 rows (5–8 query
    positions) keeps four warps: its accumulators would not fit one warp's registers."""
    computed = [_computed_levels(s) for s in (k_spec, v_spec)]
    if rows > 16 or (any(computed) and not polynomial_levels):
        return False
    return all(computed) or S >= LONG_CACHE_KEYS


def _row_groups(k_spec: TensorQuantSpec, v_spec: TensorQuantSpec, rows: int, block_n: int, split_keys: int) -> int:
    """Row groups of a one-warp tile (:func:`_one_warp_programs`). A tile of ``rows`` query rows (4,
    or 8) fills a quarter or half of the MMA's 16 rows, and the softmax ran on all 16: its score tile
    was ``16 × block_n`` for ``rows × block_n`` scores. With ``16 / rows`` groups the tile's rows
    repeat down the MMA's and group ``r`` takes keys ``r · block_n / groups …`` of each block: the
    MMAs do the same work, and the softmax, the metadata's layout and the running max cover the
    block in a ``16 × block_n / groups`` tile. The groups merge (log-sum-exp) once, after the loop.

    sm_90 SASS of the loop (warp instructions per key, B=8 Hq=32 Hkv=8 D=128, 32K): affine 4-bit
    18.9 → 15.6, 2-bit 18.3 → 14.1, 3-bit 24.4 → 22.0, 8-bit (32-key blocks, 2 groups) 22.5 → 20.7.
    H200, CUDA graph µs, one group against the default (2026-12-02,
    ``benchmarks/results/decode_row_groups_session13.csv``): 32K affine 4-bit 93.0 → 89.5, 2-bit
    77.7 → 72.5, 3-bit 102.7 → 100.2; 16K 49.2 → 47.9, 43.6 → 41.8, 55.6 → 56.1; at 4K (256 keys per
    split) every width ran 2–3% slower (the merge is a larger share of a short split). Not for
    8-bit (142.5 against 143.0 at 32K: it is near the memory already) nor turbo (its gathers spill
    more: turbo 2-bit 269.6 → 316.8 at 32K). Sub-blocks stay at least 16 keys (an MMA's k-step).
    Nor 3-bit tiles of 8 rows (GQA 5–8, or 4 with two query positions): with their two groups ptxas
    spilled 216 bytes and the loop took 40.64 warp instructions per key; with one (and the value
    block sums that then apply, :func:`_block_sums`) 25.97 and 16 bytes (sm_90 SASS, B=8, Hkv=4, GQA
    8, D=128, 32K, ``benchmarks/decode_sass.py affine 3 --gqa 8 --kv-heads 4``; GQA 4's 4-row tiles:
    21.73, no spill). Not timed on a GPU."""
    if any(s.method != "affine" or s.bits == 8 for s in (k_spec, v_spec)) or split_keys < LONG_SPLIT_KEYS:
        return 1
    if 3 in (k_spec.bits, v_spec.bits) and rows > 4:
        return 1
    return min(16 // rows, block_n // 16)  # one-warp tiles: rows ≤ 16, block_n ≥ 16


def _min_split_keys(k_spec: TensorQuantSpec, block_n: int) -> int:
    """Keys a split covers at least. A program's fixed work is large for turbo keys (the query's
    rotation: R read and two or three MMAs per plane when this was swept; made plane by plane from
    indices since, :func:`_plane_hadamard`, and not swept again) and for 3-bit affine (registers for eight planes);
    at short contexts fewer, longer splits pay. Sweep at 1K, B=8, Hq=32, Hkv=8, D=128, CUDA graph
    µs (H200, 2026-12-01, ``benchmarks/decode_attention.py --sweep``): turbo 4-bit 21.0 at 128 keys
    per split against 18.9 at 256, turbo 3-bit 34.0 (64) against 23.0 (256), turbo 2-bit 23.3
    (128) against 22.0 (256); affine 3-bit 13.0 (64) against 11.6 (128). Turbo 8-bit with its
    levels computed (one-warp programs of 32-key blocks, :func:`_one_warp_programs`): 18.35 at 64 keys
    per split, 16.69 at 128, 21.79 at 256 (2026-12-05, ``benchmarks/results/session29_gpu/``). Long
    contexts split into thousands of keys either way."""
    if k_spec.method == "turbo" and k_spec.bits <= 4:
        return 256
    if _turbo8(k_spec):
        return 128
    if k_spec.method == "affine" and k_spec.bits == 3:
        return 128
    return block_n


def _plane_hadamard(spec: TensorQuantSpec, split_keys: int) -> bool:
    """Whether a turbo spec's Hadamard rotation (power-of-two head_dim) is made plane by plane from
    indices (:func:`_hadamard_q_planes`, :func:`_store_hadamard_back`) rather than read as the matrix
    ``√D · R``: no 32 KB matrix read per program and direction (D = 128) and a quarter to an eighth of
    its MMA work, for more instructions to make the in-plane matrix. H200, B=8, Hq=32, Hkv=8, D=128,
    CUDA graph µs, matrix → planes (2026-12-03, ``benchmarks/results/decode_plane_hadamard_session20/``):
    1K turbo 8 / 4 / 3 / 2-bit 25.47 → 23.71, 16.87 → 14.96, 19.38 → 17.38, 15.64 → 12.65; 4K 4 / 3 / 2-bit
    46.93 → 41.42, 55.22 → 48.88, 28.88 → 23.17 (8-bit equal); 32K 3 / 2-bit 297.8 → 288.6, 120.5 → 110.6.
    On long splits 4- and 8-bit ran slower with it, in every repeat: 32K 246.5 → 253.9 and 377.6 → 390.4,
    16K 134.6 → 135.7 and 200.3 → 205.6 (not explained; the SASS loop of turbo 4-bit has 18 fewer
    instructions with it and spills less), so from ``LONG_SPLIT_KEYS`` keys per split 8-bit reads the
    matrix. 4-bit did too while its codes were gathered; with :func:`_shuffle_lut`'s lookups the planes
    are faster on long splits as well (2026-12-04, ``benchmarks/results/session26_gpu/``): 32K 149.8 →
    144.1 µs, 16K 86.0 → 79.6."""
    return spec.bits <= 4 or split_keys < LONG_SPLIT_KEYS


def _block_sums(v_spec: TensorQuantSpec, row_groups: int, split_keys: int) -> bool:
    """Whether each block's value dots start from zero and join the accumulators by fp32 adds
    (:func:`_plus_dot`): affine values, on splits of ``LONG_SPLIT_KEYS`` keys or more, in tiles without
    row groups (whose rows sum a fraction of the blocks each). H200, B=8, Hq=32, Hkv=8, D=128, CUDA
    graph µs and error against a float64 attention over the dequantized cache, affine 8-bit, MMA
    accumulation → block sums (2026-12-03, ``benchmarks/results/decode_block_sums_session20/``): 16K
    72.72 → 73.34 µs, 1.82e-3 → 1.67e-3; 32K 134.5 → 134.8, 3.06e-3 → 1.67e-3; 64K 262.3 → 265.4,
    **8.45e-3** → 1.67e-3 (the kernel's bound is 2e-3). Affine 4-bit, whose long splits have four row
    groups, kept its error (1.69e-3 at 32K, 1.73e-3 at 64K) and ran 84.9 → 100.8 µs with block sums at
    32K: not for row groups. Four-warp affine tiles on long splits (a host-bound call of one split, up
    to ``HOST_BOUND_KEY_ROWS`` key rows) take them too: not timed, and host-bound by definition."""
    return v_spec.method == "affine" and row_groups == 1 and split_keys >= LONG_SPLIT_KEYS


def _code_alignment(strides: tuple, word: torch.dtype) -> int:
    """What the kernel tells the compiler about a code tensor's strides (batch, head, row; in ``word``
    units): the largest power of two up to a 16-byte vector's words that divides them all, or 1 where
    the JIT's own hint covers them (it marks an integer divisible by 16, and nothing less).

    Rows whose stride is not a multiple of 16 words (head_dim 64 at 2 bits: 8 words; at 3 bits: 24
    bytes; every width at head_dim 80 and 96) had no known alignment, so each row's words were loaded
    one scalar load each, straight into registers, never staged through shared memory by the
    pipeliner. sm_90 SASS of the loop, instructions per key before → after (``benchmarks/decode_sass.py
    METHOD BITS --head-dim D [--S 1024]``), 32K: head_dim 64 affine 3-bit 42.45 → 22.09, 2-bit 24.69 →
    14.64, turbo 3-bit 55.70 → 37.77, 2-bit 38.19 → 29.30 (72–200 scalar loads a block → 8); head_dim 96
    affine 4-bit 36.83 → 16.17, turbo 4-bit 52.23 → 30.92. Not timed against the unaligned loads; H200
    figures at head_dim 64 with it: benchmarks/RESULTS.md, twenty-eighth session. 80-dim 3-bit rows keep scalar loads
    (30 bytes: their second byte plane starts 10 bytes in, below cp.async's 4-byte alignment)."""
    if all(x % 16 == 0 for x in strides):
        return 1
    align = 16 // word.itemsize
    for x in strides:
        while x % align:
            align //= 2
    return align


def _row_constants(k_codes, k_meta, v_codes, v_meta, k_word, v_word, k_meta_t, v_meta_t, k_spec, v_spec,
                   on: bool) -> dict:
    """The split kernel's row constants: each buffer's row stride where its rows lie back to back
    (:func:`~turboquant.templates.buffers.dense_row_stride`, :func:`_row_stride`; 0 = read at run time) and
    whether affine metadata comes as (scale, zero) words (:func:`~turboquant.templates.buffers.metadata_pairs`,
    :func:`_scale_zero`). A cache's own buffers are both. sm_90 SASS of the loop, warp instructions per key
    at 32K, head_dim 128, run-time strides and half loads → these (``benchmarks/decode_sass.py METHOD BITS``):
    affine 8 / 4 / 3 / 2-bit 25.31 / 16.09 / 21.73 / 14.56 → 22.28 / 14.34 / 20.80 / 13.42, turbo 47.94 /
    30.94 / 36.92 / 29.36 → 44.84 / 28.25 / 35.84 / 27.52; metadata loads a block halve for affine. Not
    timed yet (no GPU when written)."""
    if not on:
        return dict(KC_ROW=0, KM_ROW=0, VC_ROW=0, VM_ROW=0, K_PAIR=False, V_PAIR=False)
    return dict(KC_ROW=dense_row_stride(k_codes, k_word), KM_ROW=dense_row_stride(k_meta, k_meta_t),
                VC_ROW=dense_row_stride(v_codes, v_word), VM_ROW=dense_row_stride(v_meta, v_meta_t),
                K_PAIR=metadata_pairs(k_meta, k_spec), V_PAIR=metadata_pairs(v_meta, v_spec))


def _turbo8(spec: TensorQuantSpec) -> bool:
    return spec.method == "turbo" and spec.bits == 8


def _rotation(spec: TensorQuantSpec, d: int, q: torch.Tensor) -> Optional[torch.Tensor]:
    """What the kernels rotate turbo rows by (one copy per device, see
    :func:`turboquant.quant.constants.as_constant`): for a power-of-two ``d`` the signed Hadamard
    matrix ``√d · R`` in fp16 (entries ±1, exact: two MMAs on the operand's hi/lo halves and half
    the bytes of R), otherwise ``R [d, d]`` in fp32. Row-major both, so the kernels' tiles are
    contiguous runs: ``√d · Rᵀ`` read through the same tiles (strided) ran turbo 4-bit 36.6 µs
    against 19.7 at 1K and 382 against 317 at 32K (H200, CUDA graphs, 2026-12-02).
    None for affine (the call passes a placeholder pointer: a plan keeps no tensor of a call,
    which CUDA graph trees would find alive in their memory pool)."""
    if spec.method != "turbo":
        return None
    if is_power_of_two(d):
        return hadamard_rotation(d, spec.seed, device=q.device, dtype=torch.float16)
    return rotation_matrix(d, spec.seed, device=q.device, dtype=torch.float32)


def _use_asm(q: torch.Tensor) -> bool:
    """PTX byte permutes on a real GPU; the same arithmetic in plain Triton under the interpreter."""
    return not interpreted(q)


def _centroids_fp16(d: int, bits: int, device=None) -> torch.Tensor:
    return turbo_centroids(d, bits, device=device, dtype=torch.float16)  # fp16 numbers: exact, what the MMAs see


def _lut(spec: TensorQuantSpec, d: int, q: torch.Tensor) -> Optional[torch.Tensor]:
    """The centroids turbo codes index (one copy per device): fp16, as the MMAs take them (the
    levels are fp16 numbers, so the table is exact). An fp32 table cost a conversion per code for
    ≤ 4 bits; for 8 bits it would also double the shared memory of :func:`_lookup`'s gather and its
    bank conflicts (eight table words per bank instead of four; not timed).
    None for affine, which reads no table (its codes are their own values; the call passes a
    placeholder pointer)."""
    if spec.method != "turbo":
        return None
    return _centroids_fp16(d, spec.bits, q.device)


@functools.lru_cache(maxsize=None)
def _multiprocessors(device: torch.device) -> int:
    # get_device_properties re-resolves the device index and lazy-init state on every call, and
    # the launch runs once per layer per decode step on a host-bound path
    return torch.cuda.get_device_properties(device).multi_processor_count


def _cdiv(a: int, b: int) -> int:
    # plain integers: triton.cdiv is a constexpr function whose Python call costs ~4 µs, and the
    # launch computes several (host time per call 82 → 37 µs without the launches, CPU measurement)
    return -(-a // b)


def _pow2(n: int) -> int:  # n >= 1
    return 1 << max(0, int(n) - 1).bit_length()


_PLANS: "collections.OrderedDict[tuple, _Plan]" = collections.OrderedDict()
# the SMs a plan for CPU tensors (the interpreter) fills: a few, so that small test shapes split;
# benchmarks/decode_sass.py sets an H200's 132 to compile the plan a GPU call would get
CPU_PLAN_MULTIPROCESSORS = 4
_MAX_PLANS = 256  # one per call shape; a generation uses a handful


class _Launch:
    """One kernel's launch in a plan: grid, launch options, the arguments after the tensors (static
    per shape), and the compiled kernel once the first call built it."""

    __slots__ = ("kernel", "grid", "tail", "options", "compiled", "static", "static_tail")

    def __init__(self, kernel, grid, tail, options):
        grid = (*grid, 1, 1)[:3]  # the launcher takes three dimensions
        self.kernel, self.grid, self.tail, self.options, self.compiled = kernel, grid, tail, options, None
        self.static = self.static_tail = None

    def jit(self, tensors: tuple) -> None:
        """The first launch: through Triton's JIT with the tensors, which compiles (and, under
        ``TRITON_INTERPRET``, runs the kernel on CPU tensors, which keeps no compiled kernel)."""
        ck = self.kernel[self.grid](*tensors, *self.tail, **self.options)
        if isinstance(ck, triton.compiler.CompiledKernel):
            static = compat.static_cuda_launch(ck, len(tensors))
            if static is not None:
                self.static_tail = tuple(self.tail[i] for i in static[0])
                self.static = static[1]
            self.compiled = ck

    def __call__(self, stream, pointers: tuple) -> None:
        """The compiled kernel launched directly, by torch's C++ launcher for Triton kernels where it can
        (:func:`~turboquant.compat.static_cuda_launch`: the runtime arguments only, one C call), else as
        the JIT would launch it. The JIT's argument binding and specialisation cost the host more than
        the launch itself (50 µs against 17 for the split kernel on the H200's host), and the split
        kernel's launch alone took 12.4 µs through Triton's launcher and 7.6 through torch's (H200
        hosts of two calls, 2026-12-04). A plan's key holds every value the
        JIT specialises on (integers exactly, pointer alignment), so the kernel :meth:`jit` compiled for
        the first call serves them all; later calls pass the tensors' ``pointers``, which the launchers
        take as they are (for a tensor Triton's calls ``data_ptr`` and asks the driver about the pointer:
        2.7 µs a call for the split kernel's arguments, H200 host)."""
        hooks = triton.knobs.runtime
        enter, leave = _hook(hooks.launch_enter_hook), _hook(hooks.launch_exit_hook)
        if self.static is not None and enter is None and leave is None:
            self.static(self.grid, stream, pointers + self.static_tail)
            return
        ck = self.compiled
        args = pointers + self.tail
        metadata = None if enter is None else ck.launch_metadata(self.grid, stream, *args)
        ck.run(*self.grid, stream, ck.function, ck.packed_metadata, metadata, enter, leave, *args)


def _hook(hook):
    """A launch hook, or None when it would do nothing: Triton 3.6 keeps its hooks in chains that
    are never None, and the launcher calls them, and the JIT builds their metadata, on every launch
    (empty chains: ~2 µs a launch on the H200's host)."""
    return None if hook is None or not getattr(hook, "calls", True) else hook


class _Plan:
    """Everything a call of one shape needs but the tensors: the split kernel's and the merge
    kernel's launches, the output's shape, the workspace's size and the constant tables. A batch-1
    decode step is host-bound and runs one call per layer; with a plan a call costs a dictionary
    lookup, two allocations and the launches."""

    __slots__ = ("out_shape", "out_stride", "n_parts", "ws_numel", "tables", "table_pointers", "split", "merge")


# decode_attention's launch overrides, in the order of the tuning tuple a plan is made from
_TUNING_DEFAULTS = dict(block_n=None, num_splits=None, num_warps=None, num_stages=None, programs_per_sm=8, use_asm=None,
                        min_tile_rows=None, maxnreg=None, row_groups=None, rotate_blocks=None, register_lut=None,
                        plane_hadamard=None, block_sums=None, shuffle_lut=None, polynomial_levels=None,
                        constant_rows=None)


def _tuning(**overrides) -> tuple:
    """The tuning tuple of :func:`_make_plan` from keyword overrides (tests and tools)."""
    unknown = set(overrides) - set(_TUNING_DEFAULTS)
    if unknown:
        raise TypeError(f"unknown launch overrides {sorted(unknown)}; allowed: {list(_TUNING_DEFAULTS)}")
    return tuple((_TUNING_DEFAULTS | overrides).values())


def _make_plan(q, k_codes, k_meta, v_codes, v_meta, k_spec, v_spec, attn_mask, is_causal, softcap, ring_w, scale,
               tuning, capturing):
    (block_n, num_splits, num_warps, num_stages, programs_per_sm, use_asm, min_tile_rows, maxnreg, row_groups,
     rotate_blocks, register_lut, plane_hadamard, block_sums, shuffle_lut, polynomial_levels, constant_rows) = tuning
    B, HQ, L, D = q.shape
    HKV, S = k_codes.shape[1], k_codes.shape[2]
    G = HQ // HKV
    for t in (k_codes, k_meta, v_codes, v_meta):
        assert t.stride(-1) == 1, "packed rows must be contiguous along their last dim"
    host_bound = q.is_cuda and not capturing and B * HKV * S <= HOST_BOUND_KEY_ROWS
    if num_warps is None:
        # one split of a host-bound call is the whole sequence: it keeps its four warps
        one = (_one_warp_programs(k_spec, v_spec, S, G * L, polynomial_levels is not False)
               and not (host_bound and num_splits in (None, 1)))
        num_warps = 1 if one else 4
    one_warp = num_warps == 1
    KP, VP = _planes(k_spec.bits, k_codes.shape[-1]), _planes(v_spec.bits, v_codes.shape[-1])
    KPW = max(16, _pow2(_cdiv(D, KP)))
    VPW = max(16, _pow2(_cdiv(D, VP)))
    if min_tile_rows is None:
        min_tile_rows = MIN_TILE_ROWS
    M = min(MAX_TILE_ROWS, max(min_tile_rows, _pow2(G * L)))
    short3 = S <= SHORT_3BIT_KEYS and k_spec.bits == v_spec.bits == 3
    short_affine3 = short3 and k_spec.method == v_spec.method == "affine"
    if block_n is None and one_warp:
        block_n = 32 if 8 in (k_spec.bits, v_spec.bits) else 64
    if block_n is None:
        # 3-bit planes need the registers: turbo 523 vs 543 µs at 32K (H200); affine 142 against
        # 247 registers at the same 54 warp instructions per key (sm_90 SASS); everything else 128
        # (and short 3-bit caches, SHORT_3BIT_KEYS)
        block_n = 64 if any(s.bits == 3 or _turbo8(s) for s in (k_spec, v_spec)) and not short3 else 128
    if num_stages is None:
        # 3 stages are best or equal everywhere (affine 4-bit 116.7 against 159.9 at 2 stages and
        # 145.4 at 4; turbo 8-bit 380.4 against 410.2 at 32K, equal at 1K, since its table moved to a
        # shared-memory gather: H200, 2026-12-03) but short 3-bit affine caches
        num_stages = 2 if short_affine3 and not one_warp else 3
    if num_splits is None and host_bound:
        num_splits = 1  # launched from Python on a host-bound step: one launch, no merge, no workspace
    if num_splits is None:
        # as many splits as fill one wave of programs_per_sm per SM and no more: a split past it
        # starts a second wave that runs alone
        sms = _multiprocessors(q.device) if q.is_cuda else CPU_PLAN_MULTIPROCESSORS
        num_splits = max(1, min(programs_per_sm * sms // (B * HKV), _cdiv(S, _min_split_keys(k_spec, block_n))))
    split_blocks = _cdiv(_cdiv(max(S, 1), num_splits), block_n)
    # blocks per split: for one-warp programs the loop's bound is an argument, so any cache length
    # splits evenly into one wave (a power of two had left 32800 keys 17 splits, a second wave:
    # affine 4-bit 132.1 µs against 84.9 with the bound an argument, H200, B=8, Hkv=8; at 32768
    # 86.6 against 84.3). Four-warp programs keep a constant power of two (turbo 4-bit ran 5% slower
    # at 32K with the argument, when it ran four-warp programs), so a growing cache recompiles them only
    # log2(S) times.
    fixed_blocks = not one_warp
    if fixed_blocks:
        split_blocks = _pow2(split_blocks)
    split_keys = split_blocks * block_n  # what the long-split rules below go by
    num_splits = max(1, _cdiv(S, split_keys))
    if row_groups is None:
        row_groups = _row_groups(k_spec, v_spec, M, block_n, split_keys) if one_warp else 1
    if row_groups != 1 and (row_groups not in (2, 4, 8, 16) or M * row_groups > 16 or block_n % (16 * row_groups)):
        raise ValueError(f"row_groups={row_groups} does not fit {M} query rows per tile and block_n={block_n}; "
                         f"allowed: 1, or a power of two with row_groups × rows ≤ 16 and 16 · row_groups dividing "
                         f"block_n")
    luts = [_lut_constexpr(s, D, one_warp, shuffle_lut, register_lut, polynomial_levels) for s in (k_spec, v_spec)]
    planes_h = [_plane_hadamard(s, split_keys) if plane_hadamard is None else bool(plane_hadamard)
                for s in (k_spec, v_spec)]
    n_parts = num_splits + (1 if ring_w else 0)
    k_turbo, v_turbo = k_spec.method == "turbo", v_spec.method == "turbo"
    k_meta_t, v_meta_t = meta_dtype(k_meta, k_spec), meta_dtype(v_meta, v_spec)
    k_word, v_word = (torch.uint8 if _code_word_bytes.fn(s.bits, c.shape[-1]) == 1 else torch.int16
                      for s, c in ((k_spec, k_codes), (v_spec, v_codes)))
    final = n_parts == 1  # one split normalises in place
    plan = _Plan()
    plan.out_shape = (B, HQ, L, D)
    plan.out_stride = (HQ * L * D, L * D, D, 1)
    plan.n_parts = n_parts
    plan.ws_numel = 0 if final else B * HQ * L * n_parts * (VP * VPW + 2)
    plan.tables = (_lut(k_spec, D, q), _lut(v_spec, D, q), _rotation(k_spec, D, q), _rotation(v_spec, D, q))
    # an absent table's pointer: never read; 0 has every alignment the kernel may assume
    plan.table_pointers = tuple(0 if t is None else t.data_ptr() for t in plan.tables)
    mask_strides = (0, 0, 0, 0) if attn_mask is None else attn_mask.expand(B, HQ, L, S).stride()
    kc_strides, vc_strides = strides_as(k_codes, k_word), strides_as(v_codes, v_word)
    strides = (*q.stride()[:3], *kc_strides, *strides_as(k_meta, k_meta_t), *vc_strides,
               *strides_as(v_meta, v_meta_t), *mask_strides)
    consts = dict(
        HKV=HKV, G=G, L=L, M=M * row_groups, D=D, DQ=max(16, _pow2(D)), BLOCK_N=block_n,
        K_BITS=k_spec.bits, V_BITS=v_spec.bits, K_TURBO=k_turbo, V_TURBO=v_turbo,
        K_NBYTES=k_codes.shape[-1], V_NBYTES=v_codes.shape[-1], KP=KP, VP=VP, KPW=KPW, VPW=VPW,
        USE_ASM=_use_asm(q) if use_asm is None else use_asm, FINAL=final,
        HAS_MASK=attn_mask is not None, MASK_BOOL=attn_mask is not None and attn_mask.dtype == torch.bool,
        IS_CAUSAL=bool(is_causal), SOFTCAP=bool(softcap), RING_W=ring_w, K_META=TL_DTYPES[k_meta_t],
        V_META=TL_DTYPES[v_meta_t],
        K_HADAMARD=k_turbo and is_power_of_two(D), V_HADAMARD=v_turbo and is_power_of_two(D),
        K_PLANE_H=k_turbo and is_power_of_two(D) and planes_h[0],
        V_PLANE_H=v_turbo and is_power_of_two(D) and planes_h[1],
        BLOCK_SUMS=(_block_sums(v_spec, row_groups, split_keys) if block_sums is None
                    else bool(block_sums)),
        SKIP_RESCALE=one_warp, NG=row_groups, ROTATE=one_warp if rotate_blocks is None else bool(rotate_blocks),
        # Triton 3.6's interpreter passes scalars as 1-element arrays, which numpy ≥ 2.4 will not
        # take as a loop bound: there the bound is a constant too
        FIXED_BLOCKS=split_blocks if fixed_blocks or interpreted(q) else 0,
        K_LUT=luts[0], V_LUT=luts[1],
        K_ALIGN=_code_alignment(kc_strides, k_word), V_ALIGN=_code_alignment(vc_strides, v_word),
        **_row_constants(k_codes, k_meta, v_codes, v_meta, k_word, v_word, k_meta_t, v_meta_t, k_spec, v_spec,
                         constant_rows is not False))
    names = _decode_split_kernel.arg_names
    tail = (S, n_parts, split_blocks, float(scale), float(softcap or 0.0), *strides,
            *(consts[n] for n in names[names.index("HKV"):]))
    assert len(names) == 13 + len(tail), "the split launch's arguments follow the kernel's signature"
    options = dict(num_warps=num_warps, num_stages=num_stages, **({} if maxnreg is None else {"maxnreg": maxnreg}))
    plan.split = _Launch(_decode_split_kernel, (B * HKV, num_splits, _cdiv(G * L, M)), tail, options)
    plan.merge = None if final else _Launch(
        _merge_splits_kernel, (B * HQ * L,),
        (n_parts, D, VP * VPW, max(16, _pow2(D)), max(2, _pow2(n_parts))), {})
    return plan


def decode_attention(q: torch.Tensor, k_codes: torch.Tensor, k_meta: torch.Tensor, v_codes: torch.Tensor,
                     v_meta: torch.Tensor, k_spec: TensorQuantSpec, v_spec: TensorQuantSpec, head_dim: int,
                     attn_mask: Optional[torch.Tensor] = None, is_causal: bool = False, scale: Optional[float] = None,
                     softcap: float = 0.0, block_n: Optional[int] = None, num_splits: Optional[int] = None,
                     num_warps: Optional[int] = None, num_stages: Optional[int] = None, programs_per_sm: int = 8,
                     use_asm: Optional[bool] = None, k_ring: Optional[torch.Tensor] = None,
                     v_ring: Optional[torch.Tensor] = None, ring_pos: Optional[torch.Tensor] = None,
                     min_tile_rows: Optional[int] = None, maxnreg: Optional[int] = None,
                     row_groups: Optional[int] = None, rotate_blocks: Optional[bool] = None,
                     register_lut: Optional[bool] = None, plane_hadamard: Optional[bool] = None,
                     block_sums: Optional[bool] = None, shuffle_lut: Optional[bool] = None,
                     polynomial_levels: Optional[bool] = None, constant_rows: Optional[bool] = None) -> torch.Tensor:
    """Attention of ``q [B, Hq, L ≤ 8, D]`` over packed caches ``[B, Hkv, S, ·]``; returns ``[B, Hq, L, D]``
    in ``q``'s dtype.

    ``k_ring``/``v_ring [B, Hkv, W, D]`` and ``ring_pos [W]``: a residual window. The kernel skips
    the positions the ring holds; their dense attention is one more partial, merged by the
    splits' merge (log-sum-exp), so the ring never widens the kernel. ``num_warps``: warps per
    program; by default one for caches of ``LONG_CACHE_KEYS`` keys or more (affine, turbo 2/3/4-bit;
    :func:`_one_warp_programs`), four otherwise. ``maxnreg``: a register cap for
    the split kernel (CUDA, for tuning: on the H200 every cap tried, 96 and 80, spilled and ran
    slower than none). ``row_groups``: row groups of a one-warp tile (:func:`_row_groups`; by
    default 4 or 2 for affine 2/3/4-bit on splits of ``LONG_SPLIT_KEYS`` keys or more, else 1).
    ``rotate_blocks``: whether each program walks its split from its own block, wrapping around (by
    default for one-warp programs). ``shuffle_lut``: turbo codes of ≤ 4 bits looked up by warp
    shuffles from a table held one entry per lane (GPU; the interpreter keeps the gather; by default
    for 3- and 4-bit codes, :func:`_shuffle_lut`). ``register_lut``: where the shuffles are off, by
    byte permutes in a table held in the instructions instead of by :func:`_lookup`'s gather (by
    default for 2-bit codes, and 3-bit ones in four-warp programs: :func:`_register_lut`).
    ``plane_hadamard``: turbo's rotation for a power-of-two head_dim made plane by plane from indices
    (:func:`_hadamard_q_planes`, :func:`_store_hadamard_back`) rather than read as the matrix ``√D · R``
    (:func:`_q_plane`, :func:`_rotated_back`); by default for 2-, 3- and 4-bit codes, and for 8-bit
    ones on splits shorter than ``LONG_SPLIT_KEYS`` keys (:func:`_plane_hadamard`). ``block_sums``: each
    block's value dots start from zero and join the accumulators by fp32 adds (:func:`_plus_dot`; by
    default for affine values on long splits without row groups, :func:`_block_sums`).
    ``polynomial_levels``: False gathers 8-bit turbo levels from their table (:func:`_lookup`) where
    by default a GPU computes them from the code (:func:`_polynomial_asm`; the same fp16 numbers).
    ``constant_rows``: False reads every row by its run-time stride and affine metadata a half at a time,
    where by default rows back to back have their stride compiled in and (scale, zero) words are read
    one load a pair (:func:`_row_constants`; the same numbers).
    """
    if q.stride(-1) != 1:
        q = q.contiguous()  # turbo: the kernel rotates q (see _q_plane)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    ring_w = 0 if k_ring is None else k_ring.shape[-2]
    # in _TUNING_DEFAULTS' order; a literal, not _tuning(): this runs on every host-bound decode step
    tuning = (block_n, num_splits, num_warps, num_stages, programs_per_sm, use_asm, min_tile_rows, maxnreg, row_groups,
              rotate_blocks, register_lut, plane_hadamard, block_sums, shuffle_lut, polynomial_levels, constant_rows)
    # q stands in as the pointer of an absent mask or ring
    mask_or_q = q if attn_mask is None else attn_mask
    ring_pos_or_q = ring_pos if ring_w else q
    pointers = (q.data_ptr(), k_codes.data_ptr(), k_meta.data_ptr(), v_codes.data_ptr(), v_meta.data_ptr(),
                mask_or_q.data_ptr(), ring_pos_or_q.data_ptr())
    aligned = not functools.reduce(operator.or_, pointers) & 15
    device = q.get_device()
    capturing = device >= 0 and torch.cuda.is_current_stream_capturing()
    key = (capturing, q.shape, q.stride(), q.dtype, device, k_codes.shape, k_codes.stride(), k_meta.shape,
           k_meta.stride(), k_meta.dtype, v_codes.shape, v_codes.stride(), v_meta.shape, v_meta.stride(),
           v_meta.dtype, k_spec, v_spec,
           None if attn_mask is None else (attn_mask.shape, attn_mask.stride(), attn_mask.dtype), bool(is_causal),
           softcap, scale, ring_w, tuning, True if aligned else tuple(p % 16 == 0 for p in pointers))
    plan = _PLANS.get(key)
    if plan is None:
        plan = _make_plan(q, k_codes, k_meta, v_codes, v_meta, k_spec, v_spec, attn_mask, is_causal, softcap, ring_w,
                          scale, tuning, capturing)
        _PLANS[key] = plan
        if len(_PLANS) > _MAX_PLANS:
            _PLANS.popitem(last=False)
    out = compat.empty_cuda(plan.out_shape, plan.out_stride, q.dtype, device)
    ws = out if plan.merge is None else compat.empty_cuda((plan.ws_numel,), (1,), torch.float32, device)
    if ring_w:
        B, HQ, L, D = q.shape
        n_rp = B * HQ * L * plan.n_parts
        po = ws[: plan.ws_numel - 2 * n_rp].view(B, HQ, L, plan.n_parts, -1)
        pm = ws[po.numel(): po.numel() + n_rp].view(B, HQ, L, plan.n_parts)
        pl = ws[po.numel() + n_rp:].view(B, HQ, L, plan.n_parts)
        _ring_part(q, k_ring, v_ring, ring_pos, k_codes.shape[2], attn_mask, is_causal, scale, softcap,
                   po[..., -1, :D], pm[..., -1], pl[..., -1])
    split, merge = plan.split, plan.merge
    if split.compiled is None or (merge is not None and merge.compiled is None):
        # the first call of a plan (every call under the interpreter)
        split.jit((q, k_codes, k_meta, v_codes, v_meta, *(q if t is None else t for t in plan.tables), mask_or_q,
                   ring_pos_or_q, out, ws))
        if merge is not None:
            merge.jit((ws, out))
        return out
    stream = compat.current_raw_stream(device)
    out_pointers = (out.data_ptr(), ws.data_ptr())
    split(stream, pointers[:5] + plan.table_pointers + pointers[5:] + out_pointers)
    if merge is not None:
        merge(stream, out_pointers[::-1])
    return out
