"""``tq demo``: generate with a bf16/fp32 cache and with turboquant at 8/4/3 bits, side by side.

The default model is the trained reference model committed in ``turboquant/eval/reference_model``
(a byte-level Llama, prompts from held-out Python source); without it, a random-weight Llama.
"""

from __future__ import annotations

import copy
import functools
import time
from typing import List, Optional

import torch

__all__ = ["default_model", "run_demo", "compiled_baseline", "timed_generate"]


def default_model(seed: int = 0):
    """A small Llama-architecture model with random weights, built locally (no download)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(hidden_size=256, intermediate_size=512, num_hidden_layers=4, num_attention_heads=8,
                      num_key_value_heads=2, head_dim=64, vocab_size=1024, max_position_embeddings=2048)
    return LlamaForCausalLM(cfg).eval()


def compiled_baseline(base, mode: Optional[str] = None):
    """The same model compiled with the default backend and its dense cache: the fair comparison.

    As ``turboquant.compile`` does, a transformers cache is allocated before the compiled region
    (see :func:`turboquant.integrations.transformers.initialize_cache`): allocated inside a
    compiled prefill, a static cache is CUDA-graph memory that the next replay overwrites. Its calls run
    under :func:`turboquant.compat.dense_compile_context` (on torch < 2.13 a CPU model compiles without
    Inductor's indirect-indexing asserts, as turboquant's own graphs do, where 2.11's C++ codegen could not
    build them).
    """
    from . import compat
    from .integrations import transformers as hf

    model = copy.deepcopy(base)
    original = model.forward
    compiled = torch.compile(original, mode=mode)
    cache_arg = hf.cache_kwarg(original)
    # decided once: the baseline's decode loop calls forward every step
    compile_context = compat.dense_compile_context(next(model.parameters(), torch.empty(0)).device)

    @functools.wraps(original)
    def forward(*args, **kwargs):
        cache = kwargs.get(cache_arg)
        if cache is not None and hf.is_hf_cache(cache):
            hf.initialize_cache(cache, model, hf.call_batch_size(args, kwargs))
        with compile_context:  # Dynamo compiles inside the call
            return compiled(*args, **kwargs)

    model.forward = forward
    model.generation_config.disable_compile = True
    return model


def timed_generate(model, ids, new_tokens, **kwargs):
    """Greedy ``new_tokens`` tokens: ``(tokens, cache, seconds)`` (device work included)."""
    with torch.no_grad():
        t0 = time.perf_counter()
        out = model.generate(ids, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
                             return_dict_in_generate=True, **kwargs)
        if ids.is_cuda:
            torch.cuda.synchronize(ids.device)
        dt = time.perf_counter() - t0
    from .integrations import transformers as hf

    cache = hf.output_cache(out)
    return out.sequences[:, ids.shape[1]:], cache, dt


def run_demo(model_path: Optional[str] = None, bits: List[int] = (8, 4, 3), method: str = "affine",
             prompt_len: int = 64, new_tokens: int = 32, batch: int = 1) -> List[dict]:
    import turboquant

    try:
        from tqdm.auto import tqdm
    except ImportError:  # progress bar is a nicety
        tqdm = lambda it, **kw: it  # noqa: E731
    ids = None
    if model_path:
        from transformers import AutoModelForCausalLM

        base = AutoModelForCausalLM.from_pretrained(model_path).eval()
    else:
        base, ids = _reference_model_and_prompts(batch, prompt_len)
    if ids is None:
        vocab = base.config.get_text_config().vocab_size
        ids = torch.randint(0, vocab, (batch, prompt_len), generator=torch.Generator().manual_seed(0))
    rows = []
    settings = [None] + list(bits)
    ref_tokens = None
    for b in tqdm(settings, desc="tq demo", unit="setting"):
        torch._dynamo.reset()  # every setting compiles the same forward code afresh
        if b is None:
            model = compiled_baseline(base)
            name = f"unquantized ({base.dtype}), compiled"
        else:
            model = turboquant.compile(copy.deepcopy(base), bits=b, method=method)
            name = f"turboquant {method} {b}-bit"
        timed_generate(model, ids, 4)  # prefill, first and steady decode graphs compile outside the timed run
        tokens, cache, dt = timed_generate(model, ids, new_tokens)
        if ref_tokens is None:
            ref_tokens = tokens
        nb = turboquant.cache_nbytes(cache, with_dense=True)
        held, dense = nb["quantized"], nb["dense"]
        rows.append({"setting": name, "cache_bytes": held, "ratio_vs_dense": held / dense,
                     "tokens_per_s": batch * new_tokens / dt,
                     "token_agreement": float((tokens == ref_tokens).float().mean()),
                     "sample": _as_text(tokens[0], vocab=base.config.get_text_config().vocab_size)})
    return rows


def _reference_model_and_prompts(batch: int, prompt_len: int):
    """The committed reference model and held-out source prompts, or a random model and ``None``."""
    import os

    from .eval.run import REFERENCE_MODEL, load_model

    if not os.path.exists(os.path.join(REFERENCE_MODEL, "config.json")):
        return default_model(), None
    from .eval.corpus import heldout_tokens

    text = heldout_tokens()
    ids = torch.stack([text[20_000 + 50_021 * r:20_000 + 50_021 * r + prompt_len] for r in range(batch)])
    return load_model(REFERENCE_MODEL, torch.device("cpu"), torch.float32), ids


def _as_text(tokens: torch.Tensor, vocab: int, width: int = 40) -> str:
    """The first generated bytes as printable text (byte-level models); ``""`` for other vocabularies."""
    from .eval.corpus import ByteTokenizer

    if vocab != ByteTokenizer().vocab_size:
        return ""
    raw = bytes(t for t in tokens.tolist() if t < 256).decode("utf-8", "replace")
    return repr(raw[:width])
