"""Bit packing of integer codes along the last dimension (head_dim).

Layouts (code ``i`` of a row, little-endian within each byte block):

* 8 bits: one byte per code.
* 4 bits: two codes per byte; code ``2j`` in the low nibble of byte ``j``.
* 2 bits: four codes per byte; code ``4j + t`` in bits ``2t..2t+1`` of byte ``j``.
* 3 bits: eight codes in a 24-bit little-endian word ``w = b0 | b1 << 8 | b2 << 16``,
  code ``8j + t`` is ``(w >> 3t) & 7``. The row stores its words byte-planar: with
  ``W = n / 8`` words, byte ``k`` of word ``j`` sits at ``k·W + j``.

Every layout keeps a block of codes inside whole bytes, so a kernel can unpack any
block of ``8 / gcd(8, bits)`` codes without touching its neighbours. Byte-planar 3-bit rows
let a kernel fetch each byte of all words with one contiguous (vectorised) load instead of
three stride-3 loads.
"""

from __future__ import annotations

import functools

import torch


__all__ = ["CODES_PER_BLOCK", "BYTES_PER_BLOCK", "packed_size", "pack_codes", "unpack_codes", "byte_sources",
           "slot_owners", "pack_sources"]

# codes per byte block and bytes per block for each width
CODES_PER_BLOCK = {8: 1, 4: 2, 3: 8, 2: 4}
BYTES_PER_BLOCK = {8: 1, 4: 1, 3: 3, 2: 1}


def _check(bits: int, n: int) -> None:
    if bits not in CODES_PER_BLOCK:
        raise ValueError(f"bits={bits!r} is not supported; allowed: 2, 3, 4, 8")
    if n % CODES_PER_BLOCK[bits]:
        raise ValueError(f"a row of {n} codes cannot be packed at {bits} bits; "
                         f"it must be a multiple of {CODES_PER_BLOCK[bits]}")


def packed_size(n: int, bits: int) -> int:
    """Bytes that ``n`` codes of ``bits`` bits take."""
    _check(bits, n)
    return n // CODES_PER_BLOCK[bits] * BYTES_PER_BLOCK[bits]


def pack_codes(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """Pack integer codes in ``[0, 2**bits)`` along the last dim into ``uint8``."""
    n = codes.shape[-1]
    _check(bits, n)
    c = codes.to(torch.int32)
    per = CODES_PER_BLOCK[bits]
    blocks = c.reshape(*c.shape[:-1], n // per, per)
    shifts = torch.arange(per, device=c.device, dtype=torch.int32) * bits
    word = (blocks << shifts).sum(-1, dtype=torch.int32)  # disjoint bit fields: sum == or
    if bits == 3:
        byte_shifts = torch.tensor([0, 8, 16], device=c.device, dtype=torch.int32)
        word = ((word.unsqueeze(-2) >> byte_shifts.unsqueeze(-1)) & 0xFF)  # [..., 3, W]: byte-planar
    return word.to(torch.uint8).reshape(*c.shape[:-1], packed_size(n, bits))


def unpack_codes(packed: torch.Tensor, bits: int, n: int) -> torch.Tensor:
    """Inverse of :func:`pack_codes`: ``uint8 [..., packed_size(n)]`` to ``uint8 [..., n]``."""
    _check(bits, n)
    if packed.shape[-1] != packed_size(n, bits):
        raise ValueError(f"packed rows have {packed.shape[-1]} bytes; {n} codes at {bits} bits "
                         f"take {packed_size(n, bits)}")
    p = packed.to(torch.int32)
    per = CODES_PER_BLOCK[bits]
    if bits == 3:
        b = p.reshape(*p.shape[:-1], 3, n // 8)
        word = b[..., 0, :] | (b[..., 1, :] << 8) | (b[..., 2, :] << 16)
    else:
        word = p
    shifts = torch.arange(per, device=p.device, dtype=torch.int32) * bits
    codes = (word.unsqueeze(-1) >> shifts) & ((1 << bits) - 1)
    return codes.reshape(*p.shape[:-1], n).to(torch.uint8)


def _source_table(bits: int) -> tuple:
    """``table[k][i] = (t, shift)``: slot ``i`` of byte plane ``k`` is code ``t`` of its block,
    shifted by ``shift`` (negative: the high bits of a code that straddles into the byte; 8: none)."""
    if bits != 3:
        return (tuple((t, bits * t) for t in range(CODES_PER_BLOCK[bits])),)
    planes = [[(t, 3 * t - 8 * k) for t in range(8) if -3 < 3 * t - 8 * k < 8] for k in range(3)]
    slots = max(len(p) for p in planes)
    return tuple(tuple(p + [(p[-1][0], 8)] * (slots - len(p))) for p in planes)


# built at import, not behind an lru_cache: Dynamo traces the packing of a compiled cache write, and a call
# to an lru_cache-wrapped function there warns ("Silent incorrectness is only a potential risk") on every compile
_SOURCE_TABLES = {bits: _source_table(bits) for bits in CODES_PER_BLOCK}


def byte_sources(x: torch.Tensor, bits: int) -> list:
    """The elements of ``x [..., n]`` whose codes each packed byte holds, one tensor per slot.

    Slot ``i`` is ``[..., P, n / CODES_PER_BLOCK[bits]]``: at ``(k, j)`` the element that puts its
    code into byte plane ``k`` of block ``j`` (``P = 3`` byte planes for 3 bits, else 1). Every
    element of a row is some slot's, so a range reduction over the slots sees the whole row.

    :func:`pack_sources` combines the slots' codes into packed rows equal to :func:`pack_codes`.
    Together they express packing in one iteration space, ``[..., packed bytes]``: a compiler
    then fuses a row's reduction (its range), the codes and the packed store into one kernel
    (:func:`pack_codes` works per element and per block, which Inductor's Triton backend
    schedules as three kernels).
    """
    n = x.shape[-1]
    _check(bits, n)
    blocks = x.reshape(*x.shape[:-1], n // CODES_PER_BLOCK[bits], CODES_PER_BLOCK[bits])
    table = _SOURCE_TABLES[bits]
    plane = torch.arange(len(table), device=x.device)[:, None]
    slots = []
    for i in range(len(table[0])):
        src = None
        for k in reversed(range(len(table))):  # a select over planes, not a stack: one iteration space
            v = blocks[..., table[k][i][0]].unsqueeze(-2)
            src = v if src is None else torch.where(plane == k, v, src)
        slots.append(src)
    return slots


def slot_owners(bits: int, device=None) -> list:
    """Per slot of :func:`byte_sources`, a bool ``[P, 1]``: whether the slot's element puts its
    code's lowest bit into that byte plane. Each element owns exactly one slot entry (3-bit codes
    that straddle two bytes and the padding of short planes appear twice), so a sum over the
    slots masked by their owners visits every element once."""
    table = _SOURCE_TABLES[bits]
    plane = torch.arange(len(table), device=device)[:, None]  # a select over planes: no tensor constant
    owners = []
    for i in range(len(table[0])):
        own = None
        for k in range(len(table)):
            if 0 <= table[k][i][1] < 8:
                own = plane == k if own is None else own | (plane == k)
        owners.append(own)
    return owners


def pack_sources(codes: list, bits: int) -> torch.Tensor:
    """Packed rows (``uint8 [..., packed_size(n, bits)]``, as :func:`pack_codes`) from the int32
    codes of :func:`byte_sources`' slots.

    Slot ``i``'s code sits ``bits · i`` bits up; a 3-bit plane ``k``'s slots start at code ``t_k`` of the
    24-bit word, ``3 t_k − 8k`` bits from the byte's start (0, −2, −1: a right shift, the one select over
    the plane index), and a padding slot lands past the byte, where the final mask drops it. No table:
    with a shift table per slot, read for both directions, a row's packing read 12 buffers, past the 8
    after which Inductor stores a GPU node's value rather than inline it into its users (and 31 ops, past
    its 30), and the cache store became a kernel of its own (turbo-3 on an H100, 2026-12-05)."""
    table = _SOURCE_TABLES[bits]
    packed = functools.reduce(torch.bitwise_or, [c << (bits * i) if i else c for i, c in enumerate(codes)])
    if len(table) > 1:
        plane = torch.arange(len(table), device=packed.device, dtype=torch.int32)[:, None]
        right = torch.zeros_like(plane)
        for k in range(1, len(table)):
            right = torch.where(plane == k, -table[k][0][1], right)
        packed = packed >> right
    packed = packed & 0xFF
    # contiguous, as pack_codes' reduction output is: pointwise ops keep their input's layout
    # (a transposed K projection), and the cache mirrors its codes' strides in its own
    return packed.to(torch.uint8).reshape(*packed.shape[:-2], -1).contiguous()
