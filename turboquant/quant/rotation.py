"""The fixed random orthogonal rotation of TurboQuant.

* head_dim a power of two: a randomized Hadamard transform ``R = H · diag(σ) / √d`` with
  ``H`` the Sylvester Hadamard matrix and ``σ`` random signs — O(d log d) in a kernel.
* any other head_dim (80, 96, …): a Haar-random orthogonal matrix (QR of a Gaussian
  matrix with the signs of ``diag(R)`` folded in), a dense d×d product, still cheap at
  these sizes.

Both are pure functions of ``(head_dim, seed)``, drawn from a CPU generator in float64,
so codes written on one device decode identically on another. Rows are the rotated
basis: ``y = x @ R.T`` rotates, ``x = y @ R`` rotates back.
"""

from __future__ import annotations

import functools

import torch

from .constants import as_constant

__all__ = ["rotation_matrix", "is_power_of_two", "signed_hadamard", "hadamard_rotation"]


def is_power_of_two(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def _sylvester(d: int) -> torch.Tensor:
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.shape[0] < d:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h


@functools.lru_cache(maxsize=None)
def _rotation_cpu(d: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed * 1_000_003 + d)
    if is_power_of_two(d):
        signs = torch.randint(0, 2, (d,), generator=gen, dtype=torch.int64).to(torch.float64) * 2 - 1
        return _sylvester(d) * signs / d ** 0.5
    g = torch.randn(d, d, generator=gen, dtype=torch.float64)
    q, r = torch.linalg.qr(g)
    # row-major like the Hadamard branch (QR returns column-major): kernels index rows
    return (q * torch.sign(torch.diagonal(r))).contiguous()


def rotation_matrix(head_dim: int, seed: int = 0, *, device=None, dtype=torch.float64) -> torch.Tensor:
    """The ``[head_dim, head_dim]`` orthogonal rotation for ``seed`` (see module doc)."""
    return as_constant(_rotation_cpu, int(head_dim), int(seed), device=device, dtype=dtype)


def _signed_hadamard_cpu(d: int, seed: int) -> torch.Tensor:
    # R = H·diag(σ)/√d, so √d·Rᵀ = diag(σ)·H exactly: ±1 entries (H's first row is all ones)
    return torch.sign(_rotation_cpu(d, seed)[0])[:, None] * _sylvester(d)


def signed_hadamard(head_dim: int, seed: int = 0, *, device=None, dtype=torch.float64) -> torch.Tensor:
    """``M = √d · Rᵀ = diag(σ) · H`` (entries ±1, exact in any float dtype) for a power-of-two
    ``head_dim``: ``x @ M`` is the rotation ``x @ Rᵀ`` times ``√d`` with no rounding in the matrix."""
    return as_constant(_signed_hadamard_cpu, int(head_dim), int(seed), device=device, dtype=dtype)


def _hadamard_rotation_cpu(d: int, seed: int) -> torch.Tensor:
    return _signed_hadamard_cpu(d, seed).T.contiguous()


def hadamard_rotation(head_dim: int, seed: int = 0, *, device=None, dtype=torch.float64) -> torch.Tensor:
    """``√d · R = H · diag(σ)`` for a power-of-two ``head_dim``: :func:`signed_hadamard` transposed,
    stored row-major like :func:`rotation_matrix`, so a kernel reads its rows (or a row's strided
    columns) as contiguous runs, as it reads ``R``'s; entries ±1, exact in fp16."""
    return as_constant(_hadamard_rotation_cpu, int(head_dim), int(seed), device=device, dtype=dtype)
