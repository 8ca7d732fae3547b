"""turboquant: KV-cache quantization for PyTorch models, as a torch.compile backend.

Public API::

    compile(model, bits=4, **options)   quantize a model's KV cache and compile it
    report(model) / cache_nbytes(obj)   what was rewritten; bytes held vs dense
    KVQuantConfig                       validated quantization settings (method, bits, k_bits/v_bits, ...)
    calibrate(model, input_ids)         per-layer K/V frames (KVFrames) for compile(..., frames=...)
    quantize_kv(x, config)              a K or V tensor -> QuantizedKV (packed codes + metadata)
    dequantize_kv(packed)               QuantizedKV -> tensor of the original shape and dtype
    reference_attention                 the float64 attention oracle over quantized K/V

``torch.compile(model, backend="turboquant", options={"bits": 3})`` works too (entry point).
"""

from . import ops  # noqa: F401  (registers torch.ops.turboquant.*)
from .calibration import KVFrames, calibrate
from .config import KVQuantConfig, TensorQuantSpec
from .quant import QuantizedKV, dequantize_kv, folded_attention, quantize_kv, reference_attention
from .tq_compile import cache_nbytes, compile, report

__version__ = "0.1.0"

__all__ = [
    "compile", "report", "cache_nbytes", "calibrate", "KVFrames",
    "KVQuantConfig", "TensorQuantSpec", "QuantizedKV",
    "quantize_kv", "dequantize_kv", "reference_attention", "folded_attention",
    "__version__",
]
