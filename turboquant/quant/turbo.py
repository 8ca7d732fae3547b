"""TurboQuant (arXiv 2504.19874), the MSE variant: rotate, keep the norm, scalar-quantize.

For a head vector ``x`` of ``d`` elements:

* ``n = ||x||`` is stored in the metadata dtype (saturating at its largest finite value);
* ``z = (x / n) @ R.T · √d`` (``R`` from :mod:`.rotation`), whose coordinates are close to
  standard normal whatever ``x`` was;
* each coordinate is replaced by the index of its nearest Lloyd–Max centroid
  (:mod:`.codebooks`; ties go to the lower code);
* decode: ``x̂ = n · (centroid[codes] / √d) @ R``.

Non-finite elements are quantized as if they were 0 (before the norm and the rotation,
which would otherwise spread one NaN over the whole vector). They decode to whatever the
rest of the vector puts there — close to 0, within the vector's quantization error.
The paper's optional 1-bit QJL residual is not used: it adds variance through softmax.
"""

from __future__ import annotations

import torch

from .affine import _work_dtype, to_metadata
from .constants import as_constant
from .codebooks import codebook_boundaries, lloyd_max_codebook
from .rotation import rotation_matrix

__all__ = ["turbo_quantize", "turbo_dequantize", "turbo_rotate", "turbo_centroids"]


def turbo_rotate(x: torch.Tensor, seed: int, *, inverse: bool = False) -> torch.Tensor:
    """``x @ R.T`` (or ``x @ R`` with ``inverse=True``) along the last dim, in ``x``'s dtype."""
    r = rotation_matrix(x.shape[-1], seed, device=x.device, dtype=x.dtype)
    return x @ r if inverse else x @ r.T


def turbo_centroids(d: int, bits: int, *, device=None, dtype=torch.float64) -> torch.Tensor:
    """Centroids in units of the unit vector's coordinates (already divided by ``√d``)."""
    return as_constant(lloyd_max_codebook, d, bits, device=device, dtype=dtype) / d ** 0.5


def turbo_quantize(x: torch.Tensor, bits: int, seed: int, metadata_dtype, rescale_norm: bool = True):
    """Quantize ``x [..., D]``; returns ``codes uint8 [..., D]`` and ``meta [..., 1]``: the norm, divided
    by the decoded unit vector's norm when ``rescale_norm`` (the decoded vector keeps ``‖x‖``)."""
    d = x.shape[-1]
    xw = x.to(_work_dtype(x))
    xw = torch.where(torch.isfinite(xw), xw, torch.zeros((), dtype=xw.dtype, device=xw.device))
    norm = torch.linalg.vector_norm(xw, dim=-1, keepdim=True)
    unit = xw / torch.where(norm > 0, norm, torch.ones_like(norm))
    z = turbo_rotate(unit, seed) * d ** 0.5
    bounds = as_constant(codebook_boundaries, d, bits, device=x.device, dtype=xw.dtype)
    codes = torch.bucketize(z, bounds).to(torch.uint8)
    if rescale_norm:  # ‖ŷ‖ is the rotation-free norm of the centroids the codes pick
        y = turbo_centroids(d, bits, device=x.device, dtype=xw.dtype)[codes.long()]
        y_norm = torch.linalg.vector_norm(y, dim=-1, keepdim=True)
        norm = norm / torch.where(y_norm > 0, y_norm, torch.ones_like(y_norm))
    return codes, to_metadata(norm, metadata_dtype)


def turbo_dequantize(codes: torch.Tensor, meta: torch.Tensor, bits: int, seed: int,
                     dtype: torch.dtype) -> torch.Tensor:
    """Decode ``codes [..., D]`` with norms ``meta [..., 1]`` to ``dtype``."""
    work = torch.float64 if dtype == torch.float64 else torch.float32
    d = codes.shape[-1]
    y = turbo_centroids(d, bits, device=codes.device, dtype=work)[codes.long()]
    return (turbo_rotate(y, seed, inverse=True) * meta.to(work)).to(dtype)
