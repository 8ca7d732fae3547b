"""Plain-PyTorch numerics of the quantized KV cache: the oracle every op and kernel is tested against."""

from .affine import affine_dequantize, affine_quantize
from .codebooks import codebook_mse, lloyd_max_codebook
from .packed import QuantizedKV, decode, dequantize_kv, encode, quantize_kv
from .packing import pack_codes, packed_size, unpack_codes
from .reference import folded_attention, masked_softmax, reference_attention
from .rotation import rotation_matrix
from .turbo import turbo_dequantize, turbo_quantize

__all__ = [
    "QuantizedKV", "quantize_kv", "dequantize_kv", "encode", "decode",
    "affine_quantize", "affine_dequantize", "turbo_quantize", "turbo_dequantize",
    "lloyd_max_codebook", "codebook_mse", "rotation_matrix",
    "pack_codes", "unpack_codes", "packed_size",
    "reference_attention", "folded_attention", "masked_softmax",
]
