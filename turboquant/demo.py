"""``tq demo``: generate with a bf16/fp32 cache and with turboquant at 8/4/3 bits, side by side."""

from __future__ import annotations

import copy
import time
from typing import List, Optional

import torch

__all__ = ["default_model", "run_demo"]


def default_model(seed: int = 0):
    """A small Llama-architecture model with random weights, built locally (no download)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(hidden_size=256, intermediate_size=512, num_hidden_layers=4, num_attention_heads=8,
                      num_key_value_heads=2, head_dim=64, vocab_size=1024, max_position_embeddings=2048)
    return LlamaForCausalLM(cfg).eval()


def _compiled_baseline(base):
    """The same model compiled with the default backend and its dense cache: the fair comparison."""
    model = copy.deepcopy(base)
    model.forward = torch.compile(model.forward)
    model.generation_config.disable_compile = True
    return model


def _generate(model, ids, new_tokens):
    with torch.no_grad():
        t0 = time.perf_counter()
        out = model.generate(ids, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
                             return_dict_in_generate=True)
        dt = time.perf_counter() - t0
    cache = getattr(out, "past_key_values", None) or getattr(out, "cache", None)
    return out.sequences[:, ids.shape[1]:], cache, dt


def run_demo(model_path: Optional[str] = None, bits: List[int] = (8, 4, 3), method: str = "affine",
             prompt_len: int = 64, new_tokens: int = 32, batch: int = 1) -> List[dict]:
    import turboquant

    try:
        from tqdm.auto import tqdm
    except ImportError:  # progress bar is a nicety
        tqdm = lambda it, **kw: it  # noqa: E731
    if model_path:
        from transformers import AutoModelForCausalLM

        base = AutoModelForCausalLM.from_pretrained(model_path).eval()
    else:
        base = default_model()
    vocab = base.config.get_text_config().vocab_size
    ids = torch.randint(0, vocab, (batch, prompt_len), generator=torch.Generator().manual_seed(0))
    rows = []
    settings = [None] + list(bits)
    ref_tokens = None
    for b in tqdm(settings, desc="tq demo", unit="setting"):
        torch._dynamo.reset()  # every setting compiles the same forward code afresh
        if b is None:
            model = _compiled_baseline(base)
            name = f"unquantized ({base.dtype}), compiled"
        else:
            model = turboquant.compile(copy.deepcopy(base), bits=b, method=method)
            name = f"turboquant {method} {b}-bit"
        _generate(model, ids, 4)  # prefill, first and steady decode graphs compile outside the timed run
        tokens, cache, dt = _generate(model, ids, new_tokens)
        if ref_tokens is None:
            ref_tokens = tokens
            dense = sum(t.numel() * t.element_size() for layer in cache.layers for t in (layer.keys, layer.values))
            held = dense
        else:
            nb = turboquant.cache_nbytes(cache)
            held, dense = nb["quantized"], nb["dense"]
        rows.append({"setting": name, "cache_bytes": held, "ratio_vs_dense": held / dense,
                     "tokens_per_s": batch * new_tokens / dt,
                     "token_agreement": float((tokens == ref_tokens).float().mean())})
    return rows
