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

import torch

__all__ = ["CODES_PER_BLOCK", "BYTES_PER_BLOCK", "packed_size", "pack_codes", "unpack_codes"]

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
