"""Would quantizing K and V minus their per-head means help? (a probe, CPU)

Built since as calibrated frames (``turboquant.calibrate``, ``tq eval … -f8``), which add a
per-channel key scale; this probe keeps the window-mean variants for comparison.

    python benchmarks/kv_smoothing.py                                    # turbo-4 turbo-3 affine-4, 32 windows
    python benchmarks/kv_smoothing.py --configs affine-3 --max-windows 8

Attention does not change when every key of a head moves by the same vector μ_k: ``q·(k − μ_k)``
differs from ``q·k`` by ``q·μ_k``, the same for every key, and softmax ignores it. Values may
move too if the mean comes back at the end: ``Σ p_j (v_j − μ_v) + μ_v = Σ p_j v_j`` (the
probabilities sum to 1). What gets quantized is then ``k − μ_k`` and ``v − μ_v``, which hold
less energy, so the same relative error costs less.

The probe runs the reference model's one-forward perplexity (``tq eval`` protocol, held-out
windows) with transformers' ``DynamicLayer.update`` wrapped so that the cache holds each write
quantized and decoded by the oracle (``quantize_kv`` → ``dequantize_kv``), with or without the
shifts. Variants: ``plain`` (no shift); ``k``, ``v``, ``kv`` (the mean over the whole window,
exact for this protocol, where a window is one write); ``kv-first64`` (the mean of the first 64
positions only, what a short first prefill would give a cache that fixes μ at its first write).
"""

import argparse
import sys

import torch


def _fake_quantized(x, config, role, shift):
    from turboquant.quant import dequantize_kv, quantize_kv

    mu = 0 if shift is None else shift(x)
    return (dequantize_kv(quantize_kv((x - mu).double(), config, role=role), torch.float64) + mu).to(x.dtype)


SHIFTS = {
    "plain": (None, None),
    "k": ("all", None),
    "v": (None, "all"),
    "kv": ("all", "all"),
    "kv-first64": ("first64", "first64"),
}
_MEANS = {"all": lambda x: x.mean(-2, keepdim=True), "first64": lambda x: x[..., :64, :].mean(-2, keepdim=True)}


def rewritten_perplexity(rewrite, max_windows: int, model=None, chunk: int = 0, batch_size: int = 4) -> float:
    """Held-out perplexity of the reference model (``tq eval`` protocol) with transformers'
    ``DynamicLayer.update`` wrapped: every write's K/V go through ``rewrite(layer, keys, values)``
    first (``layer``: the write's index in the model's layers), so the cache holds what it returns."""
    from transformers.cache_utils import DynamicLayer

    from turboquant.eval.run import run_eval

    original, calls = DynamicLayer.update, [0]

    def update(self, keys, values, *a, **kw):
        layer = calls[0]
        calls[0] += 1
        if model is not None:
            layer %= model.config.num_hidden_layers
        keys, values = rewrite(layer, keys, values)
        return original(self, keys, values, *a, **kw)

    DynamicLayer.update = update
    try:
        result = run_eval(configs=[], contexts=[], needles=0, max_windows=max_windows, device="cpu",
                          backend="eager", progress=False, model=model, chunk=chunk, batch_size=batch_size)
    finally:
        DynamicLayer.update = original
    return result["rows"][0]["ppl"]


def perplexity(config, k_shift, v_shift, max_windows: int) -> float:
    def rewrite(layer, keys, values):
        if config is None:
            return keys, values
        return (_fake_quantized(keys, config, "k", k_shift and _MEANS[k_shift]),
                _fake_quantized(values, config, "v", v_shift and _MEANS[v_shift]))

    return rewritten_perplexity(rewrite, max_windows)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--configs", nargs="+", default=["turbo-4", "turbo-3", "affine-4"])
    p.add_argument("--variants", nargs="+", default=list(SHIFTS), choices=list(SHIFTS))
    p.add_argument("--max-windows", type=int, default=32)
    args = p.parse_args(argv)

    from turboquant.eval.configs import parse_config
    from turboquant.reporting import format_table

    base = perplexity(None, None, None, args.max_windows)
    rows = []
    for spec in args.configs:
        config = parse_config(spec).kv_config()
        row = {"config": spec}
        for name in args.variants:
            ppl = perplexity(config, *SHIFTS[name], args.max_windows)
            row[name] = f"{100 * (ppl / base - 1):+.2f}%"
            print(f"{spec} {name}: {row[name]}", file=sys.stderr, flush=True)
        rows.append(row)
    print(f"perplexity change against the unquantized model (ppl {base:.4f}), {args.max_windows} windows, one forward")
    print(format_table(rows, ["config", *args.variants]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
