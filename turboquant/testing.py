"""Tiny random-weight transformers models of each supported family (tests, coverage benchmark), and
the kernels a compiled model's generated code launches.

Nothing is downloaded: every model is built from a small config.
"""

from __future__ import annotations

import re
from typing import Optional

import torch

__all__ = ["FAMILIES", "KERNEL_REL_TOL", "tiny_hf_model", "left_padded_batch", "launched_kernels",
           "decode_step_wrapper"]

# relative error a kernel may add against the float64 oracle on the same codes (bf16-class output;
# issue 4): the decode-kernel tests assert it, the generation tests build their noise floor on it
KERNEL_REL_TOL = 2e-3

# family -> (config class, model class) names in transformers
FAMILIES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM"),
    "mistral": ("MistralConfig", "MistralForCausalLM"),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM"),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM"),
    "phi3": ("Phi3Config", "Phi3ForCausalLM"),
    "gemma": ("GemmaConfig", "GemmaForCausalLM"),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM"),      # soft-capped eager attention by default
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM"),  # sliding-window layers
    "gpt2": ("GPT2Config", "GPT2LMHeadModel"),
}

_TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, head_dim=32, vocab_size=128, max_position_embeddings=256,
             pad_token_id=0, eos_token_id=1, bos_token_id=2)


def tiny_hf_model(family: str, attn: Optional[str] = None, seed: int = 0, **overrides):
    """A 2-layer model of ``family`` (GQA 4:2, head_dim 32, vocab 128) with random weights."""
    import transformers

    if family not in FAMILIES:
        raise ValueError(f"family={family!r} is not supported; allowed: {', '.join(FAMILIES)}")
    cfg_name, model_name = FAMILIES[family]
    if family == "gpt2":
        kw = dict(n_embd=64, n_layer=2, n_head=4, vocab_size=128, n_positions=256)
    else:
        kw = dict(_TINY)
        if family == "phi3":
            kw.pop("head_dim")  # derived from hidden_size / heads
        if family == "gemma3":
            kw["sliding_window"] = 4
    kw.update(overrides)
    cfg = getattr(transformers, cfg_name)(**kw)
    if attn is not None:
        cfg._attn_implementation = attn
    torch.manual_seed(seed)
    return getattr(transformers, model_name)(cfg).eval()


def left_padded_batch(batch: int = 3, length: int = 7, vocab: int = 128, seed: int = 0):
    """``(input_ids, attention_mask)`` with rows left-padded by 0, 1, 3, … tokens (pad id 0)."""
    ids = torch.randint(1, vocab, (batch, length), generator=torch.Generator().manual_seed(seed))
    mask = torch.ones(batch, length, dtype=torch.long)
    for row in range(batch):
        mask[row, :min(length - 1, [0, 1, 3, 2, 4][row % 5])] = 0
    ids[mask == 0] = 0
    return ids, mask


def launched_kernels(wrapper: str) -> list:
    """The Triton kernels an Inductor wrapper source launches, in order (a kernel launched twice appears twice)."""
    names = re.findall(r"(triton_\w+) = async_compile", wrapper)
    return re.findall(r"\b(" + "|".join(names) + r")\.run\(", wrapper) if names else []


def decode_step_wrapper(model, cache_len: int, quantized=None) -> str:
    """The generated wrapper source of a compiled transformers ``model``'s decode step: a static cache
    of ``cache_len`` keys (quantized with the ``KVQuantConfig`` ``quantized`` where given), 9 tokens
    prefilled, one more. On CUDA the code Inductor compiles and runs; on the CPU its Triton schedule
    (:func:`turboquant.compat.triton_wrapper_code_on_cpu`, no kernel compiled)."""
    import transformers

    from .compat import run_and_get_code, triton_wrapper_code_on_cpu
    from .integrations.transformers import cache_kwarg, quantize_cache

    device = next(model.parameters()).device
    cache = transformers.StaticCache(config=model.config, max_cache_len=cache_len)
    if quantized is not None:
        quantize_cache(cache, lambda i: quantized)
    kw = {cache_kwarg(model.forward): cache}
    ids = torch.randint(0, model.config.vocab_size, (1, 10), generator=torch.Generator().manual_seed(0)).to(device)
    step = ids[:, 9:], torch.tensor([9], device=device)
    with torch.no_grad():
        model(ids[:, :9], cache_position=torch.arange(9, device=device), **kw)
        if device.type == "cpu":
            return triton_wrapper_code_on_cpu(model, step[0], cache_position=step[1], **kw)
        return run_and_get_code(model, step[0], cache_position=step[1], **kw)[1][-1]
