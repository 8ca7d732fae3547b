"""turboquant: KV-cache quantization for PyTorch models, as a torch.compile backend.

Public API::

    KVQuantConfig            validated quantization settings (method, bits, k_bits/v_bits, ...)
    quantize_kv(x, config)   a K or V tensor -> QuantizedKV (packed codes + metadata)
    dequantize_kv(packed)    QuantizedKV -> tensor of the original shape and dtype
    reference_attention      the float64 attention oracle over quantized K/V
"""

from .config import KVQuantConfig, TensorQuantSpec
from .quant import QuantizedKV, dequantize_kv, folded_attention, quantize_kv, reference_attention

__version__ = "0.1.0"

__all__ = [
    "KVQuantConfig", "TensorQuantSpec", "QuantizedKV",
    "quantize_kv", "dequantize_kv", "reference_attention", "folded_attention",
    "__version__",
]
