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
* turbo: codes become their levels (3/4/8-bit levels are a polynomial's values, computed from the
  code in fp16x2 arithmetic; 2-bit levels are a uniform grid, ``α·(c − z)``, so in keys-major tiles and
  four-warp programs the field in place is the MMA operand as an affine code is, and row-major one-warp
  tiles look it up by byte permutes from a table in the instructions); ``q`` is rotated and the output
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

This module is the entry point and the launch plan; the kernels are in :mod:`.decode_kernel`, the
packed rows' operands in :mod:`.code_operands`, the query and output planes (turbo's rotation) in
:mod:`.query_planes`.
"""

from __future__ import annotations

import collections
import functools
import operator
from typing import Optional

import torch
import triton

from .. import compat
from ..config import TensorQuantSpec
from ..quant.rotation import hadamard_rotation, is_power_of_two, rotation_matrix
from ..quant.turbo import POLYNOMIAL_LEVELS, row_grid
from .buffers import TL_DTYPES, dense_row_stride, interpreted, meta_dtype, metadata_pairs, strides_as
from .code_operands import (_byte_cols, _centroids_fp16, _code_word_bytes, _linear_level_words, _lut_kind, _planes,
                            _polynomial_words, _register_lut_words)
from .decode_kernel import LOG2E, _decode_split_kernel, _merge_splits_kernel

__all__ = ["decode_attention", "supports", "unsupported"]

MAX_QUERY_LEN = 8

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
# 16-layer 1B model at 1 × 1K: ~0.45–0.6 ms of host time per layer against tens of µs of attention
# on the GPU), so a launch and an allocation fewer is worth more than the splits' parallelism. One
# split is slow on the GPU (H100, 1 × 1056 keys, µs a call, one → 4 splits: turbo-3 61.9 → 22.4,
# turbo-4 31.3 → 20.1, affine-4 28.7 → 20.3; ``benchmarks/attention_call_host.py --variants``), but
# the step ran slower or equal with splits (H200, 1B model at 1 × 1K, vs bf16, one split → splits,
# ``benchmarks/decode_step_host.py SETTING/splits``, 2026-12-05, ``benchmarks/results/session33_gpu/``):
# turbo-3 0.926 → 0.851×, turbo-8 0.962 → 0.914×, turbo-4 0.956 → 0.910×, affine-4 1.023 → 1.021×.
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

# Programs per multiprocessor from which a short 3-bit cache's programs are two warps (:func:`_two_warp_programs`):
# between the grids timed, 3.9 per SM (two warps faster) and 1.9 (four faster).
TWO_WARP_PROGRAMS_PER_SM = 3

# Programs per multiprocessor at most for which a one-block split loads its rows early by default (_early_rows)
EARLY_ROWS_PROGRAMS_PER_SM = 4

# Keys per split from which a split's loop, not its fixed work, sets its time: one-warp affine tiles
# hold row groups from here (:func:`_row_groups`; shorter splits ran 2–3% slower with them, H200, 4K
# context: 256 keys per split, 1024 and more faster), and affine values without row groups sum their
# blocks in fp32 adds (:func:`_block_sums`).
LONG_SPLIT_KEYS = 1024
WIDE_BLOCK_SPLIT_KEYS = 2048  # the split length 128-key blocks were timed at (32K, B=8, Hkv=8, 132 SMs)
# an H100/H200 multiprocessor's shared memory as the occupancy calculator counts it, and what each resident
# program takes of it besides its own (occupancy_cap)
SM_SHARED_BYTES = 233472
PROGRAM_RESERVED_SHARED = 1024
# Triton's loader raises a kernel's dynamic shared memory limit past 48 KB only for kernels that need it
# themselves: a cap pads to at most this
MAX_PADDED_SHARED = 49152


def _computed_levels(spec: TensorQuantSpec, d: int) -> bool:
    """Whether a spec's levels are a polynomial's values, which the kernel computes from the code
    (:func:`~.code_operands._polynomial_asm`; turbo 3/4/8-bit) rather than look up, by default. H200, B=8, Hq=32,
    Hkv=8, D=128, CUDA graph µs, shuffle lookups (:func:`_shuffle_lut`) → computed, same codes, same process
    (2026-12-06, ``benchmarks/results/session47_gpu/decode_variants_poly_vs_shfl_h200.log``): turbo 4-bit 32K
    130.6 → 118.3, 16K 71.17 → 66.13, 4K 23.30 → 22.64, 1K 10.44 → 9.892; turbo 3-bit 157.7 → 141.4, 84.17 →
    76.09, 28.58 → 26.72, 11.20 → 11.06. sm_90 SASS of the loop at 32K (``benchmarks/decode_sass.py turbo BITS``
    with and without ``--no-polynomial-levels``), warp instructions per key: 4-bit 26.39 → 29.11, 3-bit 32.23 →
    34.23: more instructions, but fixed-latency fp16x2 arithmetic where each shuffle's result was a
    short-scoreboard wait (a third of the 4-bit loop's stall samples, ncu, H100). Not a degree-1 polynomial's
    (2-bit's uniform grid, 8-bit's row grid up to head_dim 128: :func:`~turboquant.quant.turbo.row_grid`): those codes
    are fields in place where :func:`_linear_levels` says, else looked up."""
    return spec.method == "turbo" and POLYNOMIAL_LEVELS.get(spec.bits, 0) > 1 and not row_grid(d, spec.bits)


def _gathers(spec: TensorQuantSpec) -> bool:
    """Whether the kernels look a spec's codes up in a ≤ 16-entry centroid table."""
    return spec.method == "turbo" and spec.bits <= 4


def _register_lut(spec: TensorQuantSpec, one_warp: bool) -> bool:
    """Whether a gathering spec's (:func:`_gathers`) codes are looked up by byte permutes
    (:func:`~.code_operands._register_lut_asm`) by default rather than by ``tl.gather``, where :func:`_shuffle_lut`'s
    shuffles are off (on by default for 3- and 4-bit codes). H200, B=8, Hq=32, Hkv=8,
    D=128, CUDA graph µs, gather → register table (2026-12-03,
    ``benchmarks/results/decode_register_lut_session17.csv``): turbo 2-bit 277.8 → 121.3 at 32K and
    19.71 → 15.56 at 1K; turbo 3-bit 21.85 → 19.35 at 1K (four-warp programs) but 308.4 → 375.1 at
    32K (one-warp programs; not explained: their loop has fewer instructions with the table, 57.3
    against 69.3 per key in sm_90 SASS); turbo 4-bit slower in both (287.5 → 342.3, 17.26 → 20.14:
    sixteen entries take six permutes and a select per two codes, 23.1 against 17.3 warp
    instructions per key in sm_90 SASS). Those gather figures were the broadcast-table gather's;
    against :func:`~.code_operands._lookup`'s flat gather (2026-12-03, ``benchmarks/results/decode_gather_session19/``)
    the table still wins where it is on: 2-bit 247.1 → 121.5 at 32K and 20.25 → 15.59 at 1K, 3-bit
    23.25 → 19.42 at 1K."""
    return spec.bits == 2 or (spec.bits == 3 and not one_warp)


def _linear_levels(spec: TensorQuantSpec, d: int, keys_major: bool, one_warp: bool) -> bool:
    """Whether a turbo spec's codes are read as fields in place, with no lookup, by default: where its levels are
    linear in the code's bits (every 2-bit codebook symmetric about 0: :func:`~.code_operands._linear_level_words`), in
    keys-major tiles (:func:`_keys_major_default`: one-warp programs from head_dim 96). A code then costs what a
    2-bit affine code costs and its low bit one more AND and MMA, against a byte permute lookup
    (:func:`_register_lut`): sm_90 SASS of the loop, warp instructions per key, table → fields
    (``benchmarks/decode_sass.py turbo 2 [--S 1024] --no-linear-levels``): 32K 25.20 → 19.09 (registers 168 → 233),
    four-warp programs at 1K 11.52 → 9.76. H100, B=8, Hq=32, Hkv=8, D=128, CUDA graph µs, table → fields, same
    process (2026-12-06, ``benchmarks/results/session41_gpu/``): 32K 93.72 → 86.22, 16K 52.59 → 48.88, 4K 20.86 →
    20.06; but 1K (four-warp programs) 11.89 → 12.16, and row-major one-warp tiles ran slower too: head_dim 64 (byte
    columns) 67.45 → 78.63 at 32K and 13.40 → 14.18 at 4K; head_dim 128 forced row-major 133.6 at 32K (the table's
    row-major tile: 107.0, thirty-seventh session). So keys-major tiles only, then. Since the forty-seventh session
    2-bit levels are a uniform grid (``γ = 0``: no low-bit operand, :func:`~.code_operands._lin_low_bits`), and the
    fields are also the default in four-warp programs (short caches). sm_90 SASS, warp instructions per key: 32K
    19.09 → 13.22 (affine 2-bit 12.26), 1K four-warp table 11.46 → fields 6.86. H100, CUDA graph µs, same codes,
    table → fields (2026-12-06, ``benchmarks/results/session47_gpu/decode_variants_turbo2_uniform_h100.log``): 32K
    92.58 → 61.11 (5.74× cuDNN; affine 2-bit 58.97 in the forty-fifth session), 16K 51.76 → 35.60, 4K 19.93 → 16.15,
    1K (four-warp programs) 10.74 → 9.404. Row-major one-warp tiles (head_dim 64) keep the table: not timed since.
    8-bit rows that are a grid of their own (:func:`~turboquant.quant.turbo.row_grid`) are fields in every tile, as
    affine 8-bit rows are: their other reading is the 256-entry gather."""
    return (keys_major or not one_warp or row_grid(d, spec.bits)) and _linear_level_words(spec, d) is not None


def _shuffle_lut(spec: TensorQuantSpec) -> bool:
    """Whether a gathering spec's (:func:`_gathers`) codes are looked up by warp shuffles from a table
    register (:func:`~.code_operands._shuffle_lut_asm`) by default where their levels are not computed
    (:func:`_computed_levels`; ``polynomial_levels=False``); where on, it takes precedence over
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
                   register_lut: Optional[bool], polynomial_levels: Optional[bool],
                   linear_levels: Optional[bool] = None, keys_major: bool = False) -> str:
    """The kernel's ``K_LUT``/``V_LUT`` for a spec (:func:`~.code_operands._lut_kind`): no lookup where the levels
    are linear in the code's bits (2-bit turbo: :func:`_linear_levels`, or as ``linear_levels`` says); else the
    lookup the overrides or the defaults pick: the level polynomial for a polynomial spec
    (:func:`~.code_operands._polynomial_asm`) unless ``polynomial_levels`` is False; then, or for a gathering spec
    whose levels are not a polynomial's, :func:`_shuffle_lut`'s or :func:`_register_lut`'s lookup with its table
    words, or the gather (``""``; 8-bit's always)."""
    words = _linear_level_words(spec, d)
    if words is not None and (_linear_levels(spec, d, keys_major, one_warp) if linear_levels is None
                              else linear_levels):
        return f"lin:{words}"
    if _computed_levels(spec, d) and polynomial_levels is not False:
        return f"poly:{_polynomial_words(spec, d)}"
    if not _gathers(spec):
        return ""
    if _shuffle_lut(spec) if shuffle_lut is None else shuffle_lut:
        return f"shfl:{_register_lut_words(spec, d)}"
    if _register_lut(spec, one_warp) if register_lut is None else register_lut:
        return f"prmt:{_register_lut_words(spec, d)}"
    return ""


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


def _one_warp_programs(k_spec: TensorQuantSpec, v_spec: TensorQuantSpec, S: int, rows: int, d: int,
                       polynomial_levels: bool = True) -> bool:
    """Whether a long cache's programs are one warp each (64 keys per block, 32 for 8-bit rows, 3
    stages, 4 query rows per tile). Four warps split a block's keys and meet at a barrier for every
    max, sum and layout change of the softmax (18 per block, sm_90 SASS); one warp has none of them and
    eight such programs fit an SM. H200, 32K context, B=8, Hq=32, Hkv=8, D=128, CUDA graph µs, four
    warps against one (2026-12-02, ``benchmarks/results/decode_sweep_one_warp_session11.csv`` and
    ``decode_one_warp_threshold_session11.csv``; ``benchmarks/decode_attention.py --sweep`` sweeps the
    same parameters): affine 4-bit 117.1 → 100.3, 3-bit 229.9 → 106.3,
    2-bit 146.4 → 90.9, 8-bit 173.1 → 159.1; turbo 3-bit 371.6 → 306.5 and 2-bit 327.6 → 269.3 (with
    spills). Turbo 4-bit, with the centroid gather of :func:`~.code_operands._lookup`: 264.6 → 247.6 (2026-12-03,
    ``benchmarks/results/decode_gather_session19/``). At 1K every width ran slower with one warp (affine
    4-bit 9.6 → 11.6 µs): a short split is mostly the program's fixed work (the query planes, the
    epilogue), which one warp does alone. Turbo 8-bit with its levels computed
    (:func:`~.code_operands._polynomial_asm`; head dims above 128, where the rows are no grid of their own:
    :func:`~turboquant.quant.turbo.row_grid`, read as fields and planned as affine 8-bit) takes one warp at every
    length: 32K 222.6 → 200.3, 1K 21.42 → 18.29 (head_dim 64: 123.7 → 111.2,
    10.78 → 10.32; 2026-12-05, ``benchmarks/results/session29_gpu/``); gathered from its 256-entry table
    (``polynomial_levels=False``) it keeps four warps (410.2 → 1450 at 32K: a one-warp gather of 256
    entries is shuffles and selects, not a shared-memory load). A tile of more than 16 rows (5–8 query
    positions) keeps four warps: its accumulators would not fit one warp's registers."""
    computed = [_turbo8(s, d) for s in (k_spec, v_spec)]
    if rows > 16 or (any(computed) and not polynomial_levels):
        return False
    return all(computed) or S >= LONG_CACHE_KEYS


def _two_warp_programs(short3: bool, rows: int, programs: int, sms: int) -> bool:
    """Whether a short cache's programs, which :func:`_one_warp_programs` leaves more than one warp, are two warps
    rather than four: ``short3``, 3-bit keys and values of at most ``SHORT_3BIT_KEYS`` keys (one 128-key block a
    split), tiles of at most 16 rows, and a grid of at least ``TWO_WARP_PROGRAMS_PER_SM`` programs per
    multiprocessor. Such a program is one block and its fixed work, much of which every warp repeats: sm_90 SASS,
    warps × instructions a warp, four → two, turbo 3-bit 4 × 2680 → 2 × 3208, affine 3-bit 4 × 1600 → 2 × 1848
    (register copies that pad 4-row tiles to the MMA's 16 rows: 446 and 284 a warp with four). H100, B=8, Hq=32,
    Hkv=8, D=128, CUDA graph µs, four warps → two, same process (2026-12-06,
    ``benchmarks/results/session44_gpu/decode_variants_{turbo3,affine3}_1k_warps_h100.log``): 1K (512 programs, 3.9
    per SM) turbo 3-bit 13.41 → 11.30, affine 3-bit 9.85 → 8.71 (cuDNN 10.71–10.75); again in a later call
    (``decode_variants_three_bit_warps_h100.log``) 13.34 → 11.19, 9.62 → 8.63. At 512 keys (256 programs, 1.9 per
    SM) turbo 3-bit ran 9.35 → 9.67 and affine 7.76 → 7.68: with fewer programs than schedulers to fill, four warps
    a program keep more of them busy, so fewer programs (smaller batches, shorter caches, host-bound single splits)
    keep four. Not timed between the two grids, nor at other batch sizes. Not other widths: turbo 4-bit 10.90 →
    12.21 and 2-bit 10.81 → 11.46 at 1K (their 256-key splits); turbo 8-bit keeps one warp. Tiles of 5–16 rows (GQA
    8, or query positions) take it untimed."""
    return short3 and rows <= 16 and programs >= TWO_WARP_PROGRAMS_PER_SM * sms


def _early_rows(k_spec: TensorQuantSpec, v_spec: TensorQuantSpec, split_blocks: int, row_groups: int, programs: int,
                sms: int, override: Optional[bool] = None) -> bool:
    """Whether a split loads its key and value rows before the query's prologue (``early_rows``): only a split of one
    block and one row group can, then as ``override`` says, and by default for affine 3-bit keys and values where the
    grid is at most ``EARLY_ROWS_PROGRAMS_PER_SM`` programs per multiprocessor, the programs that fit one with the early
    rows' registers (sm_90, B=8, Hq=32, Hkv=8, D=128: two-warp programs at 1K 138 → 227 registers, 7 → 4 programs an SM;
    four-warp ones at 512 keys 85 → 118, 5 → 4). H100, same shape, CUDA graph µs, default → early rows, same process
    (2026-12-07, ``benchmarks/results/session50_gpu/decode_variants_early_1k_h100.log`` and two calls after it): affine
    3-bit 1K (3.9 programs an SM) 8.784 → 8.459, 8.627 → 8.277, 512 keys (1.9) 7.945 → 7.442 (cuDNN 7.917). Not turbo
    3-bit (10.39 → 10.44, 10.22 → 10.26, 512 keys 9.161 → 9.251) nor turbo 8-bit, whose four-warp programs then fit 3 an
    SM (9.853 → 12.88). Not timed on the H200 nor at other batch sizes."""
    if split_blocks != 1 or row_groups != 1:
        return False
    if override is not None:
        return bool(override)
    return (all(s.method == "affine" and s.bits == 3 for s in (k_spec, v_spec))
            and programs <= EARLY_ROWS_PROGRAMS_PER_SM * sms)


def _row_groups(k_spec: TensorQuantSpec, v_spec: TensorQuantSpec, rows: int, block_n: int, split_keys: int,
                d: int) -> int:
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
    21.73, no spill). Not timed on a GPU.

    Turbo tiles of 4 rows take 2 groups, 4 where a 3-bit operand is in them (their lookups are warp
    shuffles or computed levels now, not the gathers above; two groups of 3-bit turbo spilled). H100,
    32K, D=128, CUDA graph µs, one group against 2 / 4 (2026-12-05,
    ``benchmarks/results/session31_gpu/``): turbo 8-bit 209.6 → 204.9 / —, 4-bit 141.6 → 139.8 /
    145.0, 3-bit 167.1 → 335.9 / 158.5. Not 2-bit turbo (its register-table lookups): 107.3 → 104.5 /
    107.8 at D=128 is within one run's spread, and at D=64 two groups took the loop from 18.59 to
    23.34 warp instructions per key (sm_90 SASS; 4-bit 16.98 → 15.64, 3-bit 35.48 → 32.62, 8-bit
    25.94 → 24.12 there). Where a tile is keys-major (:func:`_keys_major_default`: affine 2/4/8-bit and
    turbo 2/4-bit rows from head_dim 96) it has no row groups: these figures are the row-major tile's. 8-bit rows of
    a grid of their own (:func:`~turboquant.quant.turbo.row_grid`, fields in place) are affine 8-bit's: one group."""
    if split_keys < LONG_SPLIT_KEYS or any((s.method == "affine" or row_grid(d, s.bits)) and s.bits == 8
                                           for s in (k_spec, v_spec)):
        return 1
    if 3 in (k_spec.bits, v_spec.bits) and rows > 4:
        return 1
    groups = min(16 // rows, block_n // 16)  # one-warp tiles: rows ≤ 16, block_n ≥ 16
    if "turbo" in (k_spec.method, v_spec.method):
        if rows > 4 or any(s.method == "turbo" and s.bits == 2 for s in (k_spec, v_spec)):
            return 1
        if 3 in (k_spec.bits, v_spec.bits):
            return 4 if groups >= 4 else 1
        return min(groups, 2)
    return groups


def _four_warp_row_groups(k_spec: TensorQuantSpec, v_spec: TensorQuantSpec, rows: int, num_warps: int,
                          block_n: int) -> int:
    """Row groups of a four-warp program (a short cache's split, :func:`_one_warp_programs`): 2 for tiles of at most
    4 rows whose keys and values are affine 2/4/8-bit or turbo 4-bit, in blocks of a multiple of 32 keys, else 1.
    As in one-warp tiles (:func:`_row_groups`), the 4 rows repeat down the MMA's 16 and each group takes half of the
    128-key block, so the softmax covers a 16 × 64 tile, not 16 × 128. H100, B=8, Hq=32, Hkv=8, D=128, CUDA graph
    µs, one group → two / four, same process (2026-12-06,
    ``benchmarks/results/session45_gpu/decode_variants_groups_*_h100.log``): 1K affine 8-bit 8.502 → 8.390 / 8.776,
    4-bit 7.700 → 7.591 / 7.930, 2-bit 8.262 → 8.092 / 14.07, turbo 4-bit 10.73 → 10.35 / 10.65 (cuDNN 10.86–10.90);
    512 keys 7.143 → 6.816 / 7.554, 6.476 → 6.365 / 6.954, 6.942 → 6.824 / 8.923, 7.947 → 7.797 / 8.207; with two the
    default, against one (``decode_variants_groups_default_*_h100.log``): 1K 8.272 / 7.530 / 8.080 / 10.36 against
    8.529 / 7.674 / 8.248 / 10.60. Not turbo 2-bit: 10.84 → 11.21 at 1K, 8.969 → 9.201 at 512. Not 3-bit (two-warp
    programs at 1K, :func:`_two_warp_programs`, where groups ran slower, or four with 64-key blocks), nor turbo 8-bit
    (one warp), nor tiles of 5–16 rows: not timed. Host-bound single splits (four warps, any length) take them
    untimed."""
    if num_warps != 4 or rows > 4 or block_n % 32:
        return 1
    grouped = all(s.bits in (2, 4, 8) if s.method == "affine" else s.bits == 4 for s in (k_spec, v_spec))
    return 2 if grouped else 1


def _programs_per_sm(k_spec: TensorQuantSpec, v_spec: TensorQuantSpec, d: int, one_warp: bool) -> int:
    """Programs per multiprocessor the splits fill one wave of. 8 one-warp programs of head_dim 128
    fit an SM (215–255 registers, sm_90); at head_dim 64 2-bit affine programs take 128 registers
    and 16 fit. H100, 32K, D=64, CUDA graph µs, 8 against 12 / 16 per SM (2026-12-05,
    ``benchmarks/results/session31_gpu/``): affine 2-bit 61.54 → 54.52 / 50.81; 4-bit (137
    registers, 14 fit) 61.14 → 60.10 / 73.07 (a second wave), 3-bit (255 registers) 86.68 → 97.86 /
    92.92. Head_dim 128 under a register cap to fit 9 or 10 ran slower at every width (affine 4-bit
    106.2 → 153.1 / 140.2 µs with ``maxnreg`` 224 / 200)."""
    if one_warp and d <= 64 and all(s.method == "affine" and s.bits == 2 for s in (k_spec, v_spec)):
        return 16
    return 8


def _min_split_keys(k_spec: TensorQuantSpec, block_n: int) -> int:
    """Keys a split covers at least. A program's fixed work is large for turbo keys (the query's
    rotation: R read and two or three MMAs per plane when this was swept; made plane by plane from
    indices since, :func:`_plane_hadamard`, and not swept again) and for 3-bit affine (registers for eight planes);
    at short contexts fewer, longer splits pay. Sweep at 1K, B=8, Hq=32, Hkv=8, D=128, CUDA graph
    µs (H200, 2026-12-01, ``benchmarks/decode_attention.py --sweep``): turbo 4-bit 21.0 at 128 keys
    per split against 18.9 at 256, turbo 3-bit 34.0 (64) against 23.0 (256), turbo 2-bit 23.3
    (128) against 22.0 (256); affine 3-bit 13.0 (64) against 11.6 (128). Turbo 8-bit with its
    levels computed (one-warp programs of 32-key blocks, :func:`_one_warp_programs`): 18.35 at 64 keys
    per split, 16.69 at 128, 21.79 at 256 (2026-12-05, ``benchmarks/results/session29_gpu/``). Turbo 3-bit
    with its shuffle lookups and plane-by-plane rotations, 256 → 128 keys per split (H100, 2026-12-06,
    ``benchmarks/results/session42_gpu/decode_variants_turbo3_short_h100.log`` and ``…turbo_1k_h100.log``):
    1K 15.47 → 14.73 and 15.38 → 14.73 in two calls (8 splits of one 128-key block), 2K 20.99 → 20.39
    (16 one-warp splits); turbo 4 / 2-bit at 1K ran 11.32 → 11.41 and 11.89 → 12.32 with 8 splits. Long
    contexts split into thousands of keys either way."""
    if k_spec.method == "turbo" and k_spec.bits in (2, 4):
        return 256
    if k_spec.method == "turbo" or k_spec.bits == 3:  # turbo 3 / 8-bit, affine 3-bit
        return 128
    return block_n


def _num_stages(k_spec: TensorQuantSpec, v_spec: TensorQuantSpec, one_warp: bool, short_affine3: bool,
                split_keys: int) -> int:
    """Pipeline stages of the split kernel's loop. 3 are best or equal nearly everywhere (affine 4-bit 116.7
    against 159.9 at 2 stages and 145.4 at 4; turbo 8-bit 380.4 against 410.2 at 32K, equal at 1K, since its
    table moved to a shared-memory gather: H200, 2026-12-03). 2 for short 3-bit affine caches in four-warp
    programs (``SHORT_3BIT_KEYS``), and for 3-bit one-warp programs: turbo at every length, affine on splits
    shorter than ``WIDE_BLOCK_SPLIT_KEYS`` keys. H100, B=8, Hq=32, Hkv=8, D=128, CUDA graph µs, 3 → 2 stages,
    three calls (2026-12-06, ``benchmarks/results/session42_gpu/decode_variants_three_bit_32k_h100.log``,
    ``turbo3_confirm_stages1.log``, ``turbo3_confirm_stages2.log``): turbo 3-bit 32K 159.1 → 155.9, 159.8 →
    156.0, 158.9 → 155.9; 16K 86.85 → 84.14, 86.76 → 84.2, 86.74 → 84.2; 4K 29.9 → 28.88, 30.24 → 28.74.
    Affine 3-bit 4K 21.67 → 20.72, 21.37 → 20.35; 16K 50.82 → 50.14, 50.83 → 50.25, 50.66 → 50.34; but at
    32K (2048-key splits) 91.0 → 90.5, 90.48 → 91.96, 90.3 → 91.89. 4 stages were slower at both widths
    (32K: affine 93.76, turbo 160.4)."""
    if short_affine3 and not one_warp:
        return 2
    if one_warp and k_spec.bits == v_spec.bits == 3:
        if "turbo" in (k_spec.method, v_spec.method) or split_keys < WIDE_BLOCK_SPLIT_KEYS:
            return 2
    return 3


def _plane_hadamard(spec: TensorQuantSpec, split_keys: int) -> bool:
    """Whether a turbo spec's Hadamard rotation (power-of-two head_dim) is made plane by plane from
    indices (:func:`~.query_planes._hadamard_q_planes`, :func:`~.query_planes._store_hadamard_back`)
    rather than read as the matrix ``√D · R``: no 32 KB matrix read per program and direction (D = 128)
    and a quarter to an eighth of its MMA work, for more instructions to make the in-plane matrix. Now for
    every width and split length. H200, B=8, Hq=32, Hkv=8, D=128, CUDA graph µs, matrix → planes (2026-12-03,
    ``benchmarks/results/decode_plane_hadamard_session20/``):
    1K turbo 8 / 4 / 3 / 2-bit 25.47 → 23.71, 16.87 → 14.96, 19.38 → 17.38, 15.64 → 12.65; 4K 4 / 3 / 2-bit
    46.93 → 41.42, 55.22 → 48.88, 28.88 → 23.17 (8-bit equal); 32K 3 / 2-bit 297.8 → 288.6, 120.5 → 110.6.
    On long splits 4- and 8-bit then ran slower with it (32K 246.5 → 253.9 and 377.6 → 390.4), and kept the
    matrix there; 4-bit took the planes with :func:`_shuffle_lut`'s lookups (2026-12-04, 32K 149.8 → 144.1 µs),
    8-bit once its 64-column planes rotated as halves of 32 with the in-plane matrix in bf16 (forty-third
    session; H100, same process, matrix → planes: 32K 199.2 → 191.3 µs, 16K 112.5 → 103.1,
    ``benchmarks/results/session43_gpu/decode_variants_turbo8_planes_long_h100.log``). ``spec`` and
    ``split_keys`` stay the rule's inputs (the plan asks per spec and split length)."""
    return True


def _block_sums(v_spec: TensorQuantSpec, row_groups: int, split_keys: int, fields: bool = False) -> bool:
    """Whether each block's value dots start from zero and join the accumulators by fp32 adds
    (:func:`~.decode_kernel._plus_dot`): affine values, on splits of ``LONG_SPLIT_KEYS`` keys or more, in tiles without
    row groups (whose rows sum a fraction of the blocks each). H200, B=8, Hq=32, Hkv=8, D=128, CUDA
    graph µs and error against a float64 attention over the dequantized cache, affine 8-bit, MMA
    accumulation → block sums (2026-12-03, ``benchmarks/results/decode_block_sums_session20/``): 16K
    72.72 → 73.34 µs, 1.82e-3 → 1.67e-3; 32K 134.5 → 134.8, 3.06e-3 → 1.67e-3; 64K 262.3 → 265.4,
    **8.45e-3** → 1.67e-3 (the kernel's bound is 2e-3). Affine 4-bit, whose long splits have four row
    groups, kept its error (1.69e-3 at 32K, 1.73e-3 at 64K) and ran 84.9 → 100.8 µs with block sums at
    32K: not for row groups. Four-warp affine tiles on long splits (a host-bound call of one split, up
    to ``HOST_BOUND_KEY_ROWS`` key rows) take them too: not timed, and host-bound by definition. ``fields``: turbo
    values read as fields in place (linear levels, :func:`_linear_levels`), which cancel a zero point as affine
    ones do."""
    return (v_spec.method == "affine" or fields) and row_groups == 1 and split_keys >= LONG_SPLIT_KEYS


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
    (:func:`~.buffers.dense_row_stride`, :func:`~.decode_kernel._row_stride`; 0 = read at run time) and
    whether affine metadata comes as (scale, zero) words (:func:`~.buffers.metadata_pairs`,
    :func:`~.decode_kernel._scale_zero`). A cache's own buffers are both. sm_90 SASS of the loop, warp
    instructions per key at 32K, head_dim 128, run-time strides and half loads → these
    (``benchmarks/decode_sass.py METHOD BITS``): affine 8 / 4 / 3 / 2-bit 25.31 / 16.09 / 21.73 / 14.56 →
    22.28 / 14.34 / 20.80 / 13.42, turbo 47.94 / 30.94 / 36.92 / 29.36 → 44.84 / 28.25 / 35.84 / 27.52;
    metadata loads a block halve for affine. H100, 32K, CUDA graph µs, run-time → these (2026-12-05,
    ``benchmarks/results/session31_gpu/``, ``constant_rows=False``): affine 8 / 4 / 3 / 2-bit 191.8 /
    107.4 / 93.31 / 70.14 → 191.1 / 106.2 / 92.76 / 67.30, turbo 4-bit 147.2 → 141.6."""
    if not on:
        return dict(KC_ROW=0, KM_ROW=0, VC_ROW=0, VM_ROW=0, K_PAIR=False, V_PAIR=False)
    return dict(KC_ROW=dense_row_stride(k_codes, k_word), KM_ROW=dense_row_stride(k_meta, k_meta_t),
                VC_ROW=dense_row_stride(v_codes, v_word), VM_ROW=dense_row_stride(v_meta, v_meta_t),
                K_PAIR=metadata_pairs(k_meta, k_spec), V_PAIR=metadata_pairs(v_meta, v_spec))


def _query_sum_tile(k_spec: TensorQuantSpec, row_groups: int) -> bool:
    """Whether affine keys' zero points meet the query's sums as a score tile made by MMAs
    (:func:`~.query_planes._query_sums`) rather than as a vector: with row groups,
    whose score tiles had the outer product converted through shared memory every block. sm_90 SASS of
    the loop at 32K, warp instructions per key, vector → tile: head_dim 128 affine 4 / 3 / 2-bit 13.97 /
    20.25 / 13.08 → 13.92 / 18.39 / 12.91 (registers 215 / 255 / 198 → 231 / 254 / 217), head_dim 64 9.69 /
    20.73 / 12.27 → 9.20 / 18.53 / 10.62; programs of one block (four warps, short caches) and 8-bit loops
    (no row groups) gain nothing or lose. H100, 32K, CUDA graph µs, vector → tile (2026-12-05,
    ``benchmarks/results/session31_gpu/``, ``query_sum_tile=False``): affine 3-bit 95.33 → 92.76, 4-bit
    105.4 → 106.2, 2-bit 67.45 → 67.30."""
    return k_spec.method == "affine" and row_groups > 1


def _keys_major(k_spec: TensorQuantSpec, v_spec: TensorQuantSpec, k_nbytes: int, v_nbytes: int) -> bool:
    """Whether a one-warp tile can be keys-major: scores ``[keys, rows] = K · Qᵀ`` and value
    accumulators ``[dims, rows] = Vᵀ · Pᵀ``, the query rows on the MMAs' 8-wide N side instead of their
    16-tall M side (4 rows padded to 16 there; row groups, :func:`_row_groups`, put other keys in the
    padding). The MMAs per key halve (64 against 128 per 64-key block at 4 bits) and the accumulators
    hold 8 rows: sm_90 SASS of the loop at 32K, head_dim 128, registers and warp instructions per key,
    row groups → keys-major: affine 4-bit 231 / 13.92 → 167 / 14.94, 2-bit 217 / 12.91 → 167 / 14.00,
    8-bit (no row groups) 205 / 22.28 → 163 / 18.16; head_dim 256 4-bit 255 (56 bytes spilled) / 26.36 →
    249 / 23.58. The values are read transposed (``[dims, keys]``), so that each plane is the A operand as
    it lands in the pipeline's shared memory; read as rows and transposed in registers, Triton converted
    them through shared memory outside the pipeline every block (28.3 instructions per key).

    H100, B=8, Hq=32, Hkv=8, D=128, CUDA graph µs, row groups → keys-major, same process (2026-12-05,
    ``benchmarks/results/session36_gpu/decode_variants_keys_major_h100.csv``): 32K affine 4-bit 103.0 →
    100.3, 2-bit 66.97 → 62.79, 8-bit 184.3 → 183.4; 4K 15.97 → 14.57, 17.38 → 14.98, 29.88 → 29.77; errors
    unchanged (1.69e-3 at 32K; every row sums every block, so the value block sums of :func:`_block_sums`
    apply: without them 8-bit's was 3.06e-3). Not timed on the H200 nor at head_dim 64, where the loop
    takes more instructions than with row groups (4-bit 9.20 → 10.70 per key): by default from head_dim 96,
    for affine rows.

    Keys and values of 2, 4 or 8 bits in 16-bit words, not 3-bit byte planes (as the A operand each byte
    is a shared-memory load of its own, as it is now) nor byte columns (:func:`~.code_operands._byte_cols`).
    Turbo rows too, the accumulators transposed back for the rotation after the loop (sm_90 SASS at 32K, row
    groups → keys-major: turbo 4-bit 255 / 27.05 → 254 / 26.34, 8-bit 254 / 43.09 → 250 / 42.22, 2-bit (no
    row groups) 215 / 27.52 → 167 / 25.47). Where they are by default: :func:`_keys_major_default`."""
    return all(s.bits != 3 and not _byte_cols.fn(s.bits, n) for s, n in ((k_spec, k_nbytes), (v_spec, v_nbytes)))


def _keys_major_default(k_spec: TensorQuantSpec, v_spec: TensorQuantSpec, d: int) -> bool:
    """Where a one-warp tile that can be keys-major (:func:`_keys_major`) is by default: from head_dim 96
    (not timed below), affine rows, and turbo rows of 2 and 4 bits (and of 8, where they are a grid of their
    own read as fields: :func:`~turboquant.quant.turbo.row_grid`, as affine 8-bit rows; not timed). H100, B=8,
    Hq=32, Hkv=8, D=128, CUDA graph µs, row-major → keys-major, same process (2026-12-06,
    ``benchmarks/results/session37_gpu/decode_variants_turbo_km_*_h100.csv``): turbo 2-bit 32K 107.0 → 94.62,
    16K 59.26 → 53.20, 4K 22.28 → 20.49; 4-bit 140.1 → 132.5, 75.93 → 73.62, 24.86 → 24.39; 8-bit 205.4 →
    207.3 at 32K, so not 8-bit (errors unchanged). Affine: :func:`_keys_major`'s figures."""
    return d > 64 and all(s.method == "affine" or s.bits in (2, 4) or row_grid(d, s.bits) for s in (k_spec, v_spec))


def _value_word_tiles(v_spec: TensorQuantSpec, v_lut: str, d: int, v_nbytes: int, v_place: tuple, sub_n: int,
                  num_warps: int, keys_major: bool, early_rows: bool, override: Optional[bool] = None) -> bool:
    """Whether 3-bit values are read as 16-bit word tiles (:func:`~.code_operands._value_words3`) rather than as byte
    planes. They can be for affine values, or turbo ones whose levels are computed (``v_lut`` ``"poly"``), of head_dim
    128 (16-byte byte planes), in one-warp row-major tiles whose row groups take 16 keys each (4 query rows, 64-key
    blocks: long splits); ``v_place``, the codes' address and strides in bytes: a 16-byte aligned address (a plan
    serves only calls whose address is, see :func:`decode_attention`'s plan key) and even strides. As the value
    MMAs' B operand a byte plane's bytes were one shared-memory load each; words load by ldmatrix. By default for
    turbo values only: H100, B=8, Hq=32, Hkv=8, D=128, CUDA graph µs, byte planes → words, same process
    (2026-12-08, ``benchmarks/results/session56_gpu/``): turbo 3-bit 32K 118.1 → 112.1 / 113.8 and 120.9 → 113.0 /
    115.6, 16K 64.43 → 59.98 / 61.64 and 64.47 → 58.98 / 61.66 (errors unchanged); affine 3-bit 32K 86.42 → 91.76 /
    91.87, 16K 48.41 → 50.22 / 50.12, slower, though its loop is shorter (sm_90 SASS, 17.42 → 15.12 warp
    instructions per key; turbo 29.62 → 26.64). Why affine loses is not known. Not timed on the H200. ``override``
    False keeps byte planes; True reads words where the tiles fit and raises elsewhere."""
    fits = ((v_spec.method == "affine" or _lut_kind.fn(v_lut) == "poly") and v_spec.bits == 3 and d == 128
            and v_nbytes == 48 and sub_n == 16 and num_warps == 1 and not keys_major and not early_rows
            and v_place[0] % 16 == 0 and all(x % 2 == 0 for x in v_place[1:]))
    if override and not fits:
        raise ValueError(f"value_words=True takes 3-bit values (affine, or turbo with computed levels) of head_dim 128 "
                         f"in one-warp row-major tiles of 16 keys a row group and even strides; got {v_spec.method} "
                         f"{v_spec.bits}-bit values (lookup {_lut_kind.fn(v_lut)!r}) of "
                         f"head_dim {d}, {sub_n} keys a row group, {num_warps} warps, keys_major={keys_major}, "
                         f"early_rows={early_rows}, address and strides {v_place}")
    return fits and v_spec.method == "turbo" if override is None else bool(override)


def _wide_key_blocks(k_spec: TensorQuantSpec, v_spec: TensorQuantSpec, rows: int, split_keys: int) -> bool:
    """Whether a keys-major tile reads 128 keys a block at 2 pipeline stages instead of 64 at 3: affine 2-bit
    keys and values, tiles of at most 4 query rows, splits of ``WIDE_BLOCK_SPLIT_KEYS`` keys or more (where it
    was timed). H100, B=8, Hq=32, Hkv=8, D=128, 32K, CUDA graph µs, 64 keys / 3 stages → 128 / 2, same process:
    2-bit 63.31 → 60.34 (2026-12-06, 37th session) and 62.75 → 60.25 (38th,
    ``benchmarks/results/session38_gpu/decode_variants_affine_32k_h100.csv``); 4-bit 103.4 → 105.5 and 8-bit
    189.3 → 201.3 slower, 3-bit (row groups, byte planes) 92.13 → 727.2 (it spills: 1704 bytes). Half as
    many blocks pay what each block costs once (its metadata loads, the softmax's row reductions, the rescale
    test): sm_90 SASS at 32K 12.26 loop instructions per key against 14.00, at 242 registers against 167 (8
    programs still fit an SM).
    Why 4-bit loses is not known. Not timed on the H200, nor at 16K."""
    return (all(s.method == "affine" and s.bits == 2 for s in (k_spec, v_spec)) and rows <= 4
            and split_keys >= WIDE_BLOCK_SPLIT_KEYS)


def _query_row_load(one_warp: bool, block_n: int) -> bool:
    """Whether affine keys' query planes come from one load of the query rows, split in registers
    (:func:`~.query_planes._q_row`), rather than a load a plane, each waiting out the one before (a plane's
    conversion to an MMA operand sits between barriers): but for one-warp programs of 128-key blocks. H100,
    B=8, Hq=32, Hkv=8, D=128, CUDA graph µs, a load a plane → one, same call (2026-12-06, 40th session,
    ``benchmarks/results/session40_gpu/decode_attention_*_h100.csv``; turbo's signs and rows in both columns):
    1K affine 8 / 4 / 3 / 2-bit 8.86 → 8.71, 7.85 → 7.69, 9.90 → 9.76, 8.73 → 8.39, turbo 16.27 → 16.15,
    11.78 → 11.54, 16.24 → 15.61, 12.95 → 11.80; 16K affine 3-bit 51.64 → 50.77, 2-bit 35.67 → 34.87; 32K
    3-bit 92.61 → 90.62, the rest within 0.6%. With 128-key blocks (:func:`_wide_key_blocks`: affine 2-bit
    at 32K) one load took the loop from 242 registers to 168 at the same instruction count (12.19 per key
    against 12.26; sm_90 SASS) and 59.07 → 64.65 µs (an earlier form of the change, which also loaded the
    first block's metadata ahead of the query: the same 168 registers), and capping the programs at 8 an SM
    did not bring it back (64.03)."""
    return not (one_warp and block_n >= 128)


def _turbo8(spec: TensorQuantSpec, d: int) -> bool:
    """Whether a spec's codes are 8-bit turbo levels the kernel computes (:func:`_computed_levels`), not a row's
    grid read as fields (:func:`~turboquant.quant.turbo.row_grid`)."""
    return spec.bits == 8 and _computed_levels(spec, d)


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


def _lut(spec: TensorQuantSpec, d: int, q: torch.Tensor) -> Optional[torch.Tensor]:
    """The centroids turbo codes index (one copy per device): fp16, as the MMAs take them (the
    levels are fp16 numbers, so the table is exact). An fp32 table cost a conversion per code for
    ≤ 4 bits; for 8 bits it would also double the shared memory of :func:`~.code_operands._lookup`'s gather and its
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


def _splits(S: int, keys: int, block_n: int, pow2_blocks: bool) -> tuple:
    """Splits of at least ``keys`` keys each in whole blocks (a power of two of them with ``pow2_blocks``):
    ``(blocks per split, keys per split, splits)``, the last split holding what is left of ``S``."""
    blocks = _cdiv(keys, block_n)
    if pow2_blocks:
        blocks = _pow2(blocks)
    return blocks, blocks * block_n, max(1, _cdiv(S, blocks * block_n))


def _capped_shared(occupancy_cap: Optional[int]) -> int:
    """The shared memory a split program is launched with so that at most ``occupancy_cap`` programs fit an
    H100/H200 multiprocessor (0: the kernel's own). A tuning experiment: whether the CTA scheduler spreads a
    wave of ``programs_per_sm`` programs evenly where registers would let 12 share an SM. Launched by torch's
    C++ launcher only (:func:`~turboquant.compat.static_cuda_launch`)."""
    if occupancy_cap is None:
        return 0
    lo = -(-SM_SHARED_BYTES // (MAX_PADDED_SHARED + PROGRAM_RESERVED_SHARED))
    if not isinstance(occupancy_cap, int) or not lo <= occupancy_cap <= 32:
        raise ValueError(f"occupancy_cap={occupancy_cap!r}: allowed None or an integer from {lo} to 32 (programs per "
                         f"multiprocessor; fewer would need more than {MAX_PADDED_SHARED} bytes of shared memory each)")
    return SM_SHARED_BYTES // occupancy_cap - PROGRAM_RESERVED_SHARED


class _Launch:
    """One kernel's launch in a plan: grid, launch options, the arguments after the tensors (static
    per shape), and the compiled kernel once the first call built it."""

    __slots__ = ("kernel", "grid", "tail", "options", "compiled", "static", "static_tail", "min_shared")

    def __init__(self, kernel, grid, tail, options, min_shared=0):
        grid = (*grid, 1, 1)[:3]  # the launcher takes three dimensions
        self.kernel, self.grid, self.tail, self.options, self.compiled = kernel, grid, tail, options, None
        self.static = self.static_tail = None
        self.min_shared = min_shared  # launch with at least this much shared memory (_capped_shared)

    def jit(self, tensors: tuple) -> None:
        """The first launch: through Triton's JIT with the tensors, which compiles (and, under
        ``TRITON_INTERPRET``, runs the kernel on CPU tensors, which keeps no compiled kernel)."""
        ck = self.kernel[self.grid](*tensors, *self.tail, **self.options)
        if isinstance(ck, triton.compiler.CompiledKernel):
            static = compat.static_cuda_launch(ck, len(tensors), self.min_shared)
            if static is None and self.min_shared:
                raise NotImplementedError("occupancy_cap needs torch's C++ launcher for Triton kernels "
                                          "(torch._C._StaticCudaLauncher), which this torch or kernel lacks")
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
_TUNING_DEFAULTS = dict(block_n=None, num_splits=None, num_warps=None, num_stages=None, programs_per_sm=None,
                        use_asm=None, min_tile_rows=None, maxnreg=None, row_groups=None, rotate_blocks=None,
                        register_lut=None, plane_hadamard=None, block_sums=None, shuffle_lut=None,
                        polynomial_levels=None, constant_rows=None, query_sum_tile=None, keys_major=None,
                        occupancy_cap=None, query_row_load=None, linear_levels=None, zero_drain=None,
                        wide_query_rotation=None, early_rows=None, value_words=None)


def _tuning(**overrides) -> tuple:
    """The tuning tuple of :func:`_make_plan` from keyword overrides (tests and tools)."""
    unknown = set(overrides) - set(_TUNING_DEFAULTS)
    if unknown:
        raise TypeError(f"unknown launch overrides {sorted(unknown)}; allowed: {list(_TUNING_DEFAULTS)}")
    return tuple((_TUNING_DEFAULTS | overrides).values())


def _make_plan(q, k_codes, k_meta, v_codes, v_meta, k_spec, v_spec, attn_mask, is_causal, softcap, ring_w, scale,
               tuning, capturing):
    (block_n, num_splits, num_warps, num_stages, programs_per_sm, use_asm, min_tile_rows, maxnreg, row_groups,
     rotate_blocks, register_lut, plane_hadamard, block_sums, shuffle_lut, polynomial_levels, constant_rows,
     query_sum_tile, keys_major, occupancy_cap, query_row_load, linear_levels, zero_drain, wide_query_rotation,
     early_rows, value_words) = tuning
    B, HQ, L, D = q.shape
    HKV, S = k_codes.shape[1], k_codes.shape[2]
    G = HQ // HKV
    block_n_set, stages_set = block_n is not None, num_stages is not None
    for t in (k_codes, k_meta, v_codes, v_meta):
        assert t.stride(-1) == 1, "packed rows must be contiguous along their last dim"
    host_bound = q.is_cuda and not capturing and B * HKV * S <= HOST_BOUND_KEY_ROWS
    warps_set = num_warps is not None
    if not warps_set:
        # one split of a host-bound call is the whole sequence: it keeps its four warps (four may become two
        # once the grid is known: _two_warp_programs)
        one = (_one_warp_programs(k_spec, v_spec, S, G * L, D, polynomial_levels is not False)
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
        block_n = 64 if any(s.bits == 3 or _turbo8(s, D) for s in (k_spec, v_spec)) and not short3 else 128
    if num_splits is None and host_bound:
        num_splits = 1  # launched from Python on a host-bound step: one launch, no merge, no workspace
    sms = _multiprocessors(q.device) if q.is_cuda else CPU_PLAN_MULTIPROCESSORS
    if num_splits is None:
        # as many splits as fill one wave of programs_per_sm per SM and no more: a split past it
        # starts a second wave that runs alone
        if programs_per_sm is None:
            programs_per_sm = _programs_per_sm(k_spec, v_spec, D, one_warp)
        num_splits = max(1, min(programs_per_sm * sms // (B * HKV), _cdiv(S, _min_split_keys(k_spec, block_n))))
    # blocks per split: for one-warp programs the loop's bound is an argument, so any cache length
    # splits evenly into one wave (a power of two had left 32800 keys 17 splits, a second wave:
    # affine 4-bit 132.1 µs against 84.9 with the bound an argument, H200, B=8, Hkv=8; at 32768
    # 86.6 against 84.3). Four-warp programs keep a constant power of two (turbo 4-bit ran 5% slower
    # at 32K with the argument, when it ran four-warp programs), so a growing cache recompiles them only
    # log2(S) times.
    fixed_blocks = not one_warp
    # split_keys: what the long-split rules below go by
    split_blocks, split_keys, num_splits = _splits(S, _cdiv(max(S, 1), num_splits), block_n, fixed_blocks)
    programs = B * HKV * num_splits * _cdiv(G * L, M)
    if not warps_set and num_warps == 4 and _two_warp_programs(short3, G * L, programs, sms):
        num_warps = 2
    if num_stages is None:
        num_stages = _num_stages(k_spec, v_spec, one_warp, short_affine3, split_keys)
    if keys_major is None:  # not where the caller set the row-major tile's row groups or sum tile
        keys_major = (one_warp and row_groups is None and query_sum_tile is None
                      and _keys_major_default(k_spec, v_spec, D)
                      and _keys_major(k_spec, v_spec, k_codes.shape[-1], v_codes.shape[-1]))
    elif keys_major and not _keys_major(k_spec, v_spec, k_codes.shape[-1], v_codes.shape[-1]):
        raise ValueError(f"keys_major=True takes keys and values of 2, 4 or 8 bits in 16-bit words (rows of more "
                         f"than 16 bytes); got {k_spec.method} {k_spec.bits}-bit keys and {v_spec.method} "
                         f"{v_spec.bits}-bit values of head_dim {D}")
    if keys_major:
        row_groups, query_sum_tile = 1, False
        if not (block_n_set or stages_set) and _wide_key_blocks(k_spec, v_spec, M, split_keys):
            block_n, num_stages = 128, 2
            split_blocks, split_keys, num_splits = _splits(S, split_keys, block_n, False)
    if row_groups is None:
        row_groups = (_row_groups(k_spec, v_spec, M, block_n, split_keys, D) if one_warp
                      else _four_warp_row_groups(k_spec, v_spec, M, num_warps, block_n))
    if row_groups != 1 and (row_groups not in (2, 4, 8, 16) or M * row_groups > 16 or block_n % (16 * row_groups)):
        raise ValueError(f"row_groups={row_groups} does not fit {M} query rows per tile and block_n={block_n}; "
                         f"allowed: 1, or a power of two with row_groups × rows ≤ 16 and 16 · row_groups dividing "
                         f"block_n")
    luts = [_lut_constexpr(s, D, one_warp, shuffle_lut, register_lut, polynomial_levels, linear_levels,
                           bool(keys_major)) for s in (k_spec, v_spec)]
    planes_h = [_plane_hadamard(s, split_keys) if plane_hadamard is None else bool(plane_hadamard)
                for s in (k_spec, v_spec)]
    v_fields = v_spec.method == "affine" or _lut_kind.fn(luts[1]) == "lin"
    if zero_drain and not (one_warp and row_groups == 1 and v_fields and not block_sums):
        raise ValueError(f"zero_drain={zero_drain} takes one-warp programs of one row group whose values are fields "
                         f"in place (affine, or turbo's uniform grids) without block sums; got {num_warps} "
                         f"warps, row_groups={row_groups}, {v_spec.method} {v_spec.bits}-bit values, "
                         f"block_sums={block_sums}")
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
        BLOCK_SUMS=(_block_sums(v_spec, row_groups, split_keys, v_fields) and not zero_drain if block_sums is None
                    else bool(block_sums)),
        SKIP_RESCALE=one_warp, NG=row_groups, ROTATE=one_warp if rotate_blocks is None else bool(rotate_blocks),
        # Triton 3.6's interpreter passes scalars as 1-element arrays, which numpy ≥ 2.4 will not
        # take as a loop bound: there the bound is a constant too
        FIXED_BLOCKS=split_blocks if fixed_blocks or interpreted(q) else 0,
        K_LUT=luts[0], V_LUT=luts[1],
        K_ALIGN=_code_alignment(kc_strides, k_word), V_ALIGN=_code_alignment(vc_strides, v_word),
        **_row_constants(k_codes, k_meta, v_codes, v_meta, k_word, v_word, k_meta_t, v_meta_t, k_spec, v_spec,
                         constant_rows is not False),
        Q_SUM_TILE=_query_sum_tile(k_spec, row_groups) if query_sum_tile is None else bool(query_sum_tile),
        KEYS_MAJOR=bool(keys_major),
        Q_ROW_LOAD=_query_row_load(one_warp, block_n) if query_row_load is None else bool(query_row_load),
        ZERO_DRAIN=int(zero_drain or 0),
        Q_WIDE=one_warp if wide_query_rotation is None else bool(wide_query_rotation),
        EARLY_ROWS=_early_rows(k_spec, v_spec, split_blocks, row_groups, programs, sms, early_rows))
    consts["V_WORDS3"] = _value_word_tiles(v_spec, luts[1], D, v_codes.shape[-1], (v_codes.data_ptr(), *vc_strides),
                                           block_n // row_groups, num_warps, bool(keys_major), consts["EARLY_ROWS"],
                                           value_words)
    names = _decode_split_kernel.arg_names
    tail = (S, n_parts, split_blocks, float(scale), float(softcap or 0.0), *strides,
            *(consts[n] for n in names[names.index("HKV"):]))
    assert len(names) == SPLIT_TENSORS + len(tail), "the split launch's arguments follow the kernel's signature"
    options = dict(num_warps=num_warps, num_stages=num_stages, **({} if maxnreg is None else {"maxnreg": maxnreg}))
    plan.split = _Launch(_decode_split_kernel, (B * HKV, num_splits, _cdiv(G * L, M)), tail, options,
                         _capped_shared(occupancy_cap))
    plan.merge = None if final else _Launch(
        _merge_splits_kernel, (B * HQ * L,),
        (n_parts, D, VP * VPW, max(16, _pow2(D)), max(2, _pow2(n_parts))), {})
    return plan


SPLIT_TENSORS = 13  # the split kernel's pointer arguments, before the launch's tail


def split_constants(plan: _Plan) -> dict:
    """The split kernel's constexprs as a plan launches it (tests and tools)."""
    return dict(zip(_decode_split_kernel.arg_names[SPLIT_TENSORS:], plan.split.tail))


def decode_attention(q: torch.Tensor, k_codes: torch.Tensor, k_meta: torch.Tensor, v_codes: torch.Tensor,
                     v_meta: torch.Tensor, k_spec: TensorQuantSpec, v_spec: TensorQuantSpec, head_dim: int,
                     attn_mask: Optional[torch.Tensor] = None, is_causal: bool = False, scale: Optional[float] = None,
                     softcap: float = 0.0, block_n: Optional[int] = None, num_splits: Optional[int] = None,
                     num_warps: Optional[int] = None, num_stages: Optional[int] = None,
                     programs_per_sm: Optional[int] = None, use_asm: Optional[bool] = None,
                     k_ring: Optional[torch.Tensor] = None, v_ring: Optional[torch.Tensor] = None,
                     ring_pos: Optional[torch.Tensor] = None,
                     min_tile_rows: Optional[int] = None, maxnreg: Optional[int] = None,
                     row_groups: Optional[int] = None, rotate_blocks: Optional[bool] = None,
                     register_lut: Optional[bool] = None, plane_hadamard: Optional[bool] = None,
                     block_sums: Optional[bool] = None, shuffle_lut: Optional[bool] = None,
                     polynomial_levels: Optional[bool] = None, constant_rows: Optional[bool] = None,
                     query_sum_tile: Optional[bool] = None, keys_major: Optional[bool] = None,
                     occupancy_cap: Optional[int] = None, query_row_load: Optional[bool] = None,
                     linear_levels: Optional[bool] = None, zero_drain: Optional[int] = None,
                     wide_query_rotation: Optional[bool] = None, early_rows: Optional[bool] = None,
                     value_words: Optional[bool] = None) -> torch.Tensor:
    """Attention of ``q [B, Hq, L ≤ 8, D]`` over packed caches ``[B, Hkv, S, ·]``; returns ``[B, Hq, L, D]``
    in ``q``'s dtype.

    ``k_ring``/``v_ring [B, Hkv, W, D]`` and ``ring_pos [W]``: a residual window. The kernel skips
    the positions the ring holds; their dense attention is one more partial, merged by the
    splits' merge (log-sum-exp), so the ring never widens the kernel. ``num_warps``: warps per
    program; by default one for caches of ``LONG_CACHE_KEYS`` keys or more (affine, turbo 2/3/4-bit;
    :func:`_one_warp_programs`), four otherwise. ``maxnreg``: a register cap for the split kernel
    (CUDA, for tuning: every cap tried ran slower than none, those of 168 and below spilling on the
    H200, and 224 / 200 with no spill 17–57% slower on the H100 at 32K). ``row_groups``: row groups
    of a row-major one-warp tile (:func:`_row_groups`; by default 4 or 2 for affine 2/3/4-bit, 2 for turbo
    4/8-bit, 4 for turbo 3-bit tiles of 4 rows, on splits of ``LONG_SPLIT_KEYS`` keys or more; else 1; setting
    it keeps the tile row-major, see ``keys_major``). ``programs_per_sm``: the programs per multiprocessor the
    splits fill one wave of (:func:`_programs_per_sm`: 16 for head_dim-64 2-bit affine one-warp programs, else 8).
    ``rotate_blocks``: whether each program walks its split from its own block, wrapping around (by
    default for one-warp programs). ``shuffle_lut``: turbo codes of ≤ 4 bits looked up by warp
    shuffles from a table held one entry per lane (GPU; the interpreter keeps the gather; by default
    for 3- and 4-bit codes where ``polynomial_levels`` is False, :func:`_shuffle_lut`). ``register_lut``: where
    the shuffles are off, by
    byte permutes in a table held in the instructions instead of by :func:`~.code_operands._lookup`'s
    gather (by default for 2-bit codes, and 3-bit ones in four-warp programs: :func:`_register_lut`).
    ``plane_hadamard``: turbo's rotation for a power-of-two head_dim made plane by plane from indices
    (:func:`~.query_planes._hadamard_q_planes`, :func:`~.query_planes._store_hadamard_back`) rather than
    read as the matrix ``√D · R`` (:func:`~.query_planes._q_plane`, :func:`~.query_planes._rotated_back`);
    by default for every width (:func:`_plane_hadamard`). ``block_sums``: each block's value dots start from
    zero and join the accumulators by fp32 adds (:func:`~.decode_kernel._plus_dot`; by default for affine values on long
    splits without row groups, :func:`_block_sums`).
    ``polynomial_levels``: False looks 3/4/8-bit turbo levels up in their table (3/4-bit: the shuffles or permutes
    above; 8-bit: :func:`~.code_operands._lookup`'s gather) where by default a GPU computes them from the code
    (:func:`~.code_operands._polynomial_asm`, :func:`_computed_levels`; the same fp16 numbers).
    ``constant_rows``: False reads every row by its run-time stride and affine metadata a half at a time,
    where by default rows back to back have their stride compiled in and (scale, zero) words are read
    one load a pair (:func:`_row_constants`; the same numbers). ``query_sum_tile``: the query's sums
    for affine keys' zero points held as a score tile made by MMAs rather than a vector
    (:func:`_query_sum_tile`; by default with row groups). ``keys_major``: a tile as scores ``[keys, rows]``
    and accumulators ``[dims, rows]``, for 2/4/8-bit rows in 16-bit words (:func:`_keys_major`; by default for
    affine and 2/4-bit turbo rows in one-warp programs from head_dim 96, where neither ``row_groups`` nor
    ``query_sum_tile`` is set: :func:`_keys_major_default`). ``block_n``, ``num_stages``: keys per block and
    pipeline stages (by default 64 and 3 in one-warp programs, 32 with 8-bit rows; 128 and 2 for long affine
    2-bit keys-major splits, :func:`_wide_key_blocks`, unless either is set). ``occupancy_cap``: at most this
    many split programs per multiprocessor (5–32), by launching each with padded shared memory (CUDA, torch's
    C++ launcher; for tuning: :func:`_capped_shared`). ``query_row_load``: affine keys' query planes from one
    load of the rows rather than a load a plane (:func:`_query_row_load`; turbo's rotation always loads the rows).
    ``linear_levels``: 2-bit turbo codes read as fields in place, their levels being linear in the code's bits
    (True), or looked up in their table (False); by default in keys-major tiles and four-warp programs
    (:func:`_linear_levels`; the same numbers up to fp16 roundings of the operands, as affine codes').
    ``zero_drain``: every this many blocks the values' zero-point sum leaves the MMA accumulators (in the
    one-warp loop's rescaling branch), which bounds the sums the MMAs' truncating adds work on as block sums do,
    with one add an element per ``zero_drain`` blocks instead of one per block (one-warp
    tiles of one row group whose values are fields in place, block sums off). ``wide_query_rotation``: the
    query's plane-by-plane Hadamard rotation (``plane_hadamard``) on parts of up to 64 columns rather than 32 (by
    default in one-warp programs: :func:`~.query_planes._rotation_width`). ``early_rows``: a split of one block
    (and one row group; elsewhere the option does nothing) loads its key and value rows before the query's
    prologue rather than where they are read, so that their latency passes under the prologue and the key dots, for
    more registers; by default for short affine 3-bit caches whose grid fits (:func:`_early_rows`). ``value_words``:
    3-bit values read as 16-bit word tiles rather than byte planes, where the tiles fit (:func:`_value_word_tiles`; by
    default for turbo values there).
    """
    if q.stride(-1) != 1:
        q = q.contiguous()  # turbo: the kernel rotates q (see _q_plane)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    ring_w = 0 if k_ring is None else k_ring.shape[-2]
    # in _TUNING_DEFAULTS' order; a literal, not _tuning(): this runs on every host-bound decode step
    tuning = (block_n, num_splits, num_warps, num_stages, programs_per_sm, use_asm, min_tile_rows, maxnreg, row_groups,
              rotate_blocks, register_lut, plane_hadamard, block_sums, shuffle_lut, polynomial_levels, constant_rows,
              query_sum_tile, keys_major, occupancy_cap, query_row_load, linear_levels, zero_drain, wide_query_rotation,
              early_rows, value_words)
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
