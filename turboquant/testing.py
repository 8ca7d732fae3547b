"""Tiny random-weight transformers models of each supported family (tests, coverage benchmark), and
the kernels a compiled model's generated code launches.

Nothing is downloaded: every model is built from a small config.
"""

from __future__ import annotations

import re
from typing import Optional

import torch

__all__ = ["FAMILIES", "KERNEL_REL_TOL", "NEAR_TIE", "tiny_hf_model", "left_padded_batch", "greedy_generate",
           "parting_margin", "launched_kernels", "decode_step_wrapper"]

# relative error a kernel may add against the float64 oracle on the same codes (bf16-class output;
# issue 4): the decode-kernel tests assert it, the generation tests build their noise floor on it
KERNEL_REL_TOL = 2e-3

# logits: a greedy token may flip where the reference's top-2 are this close (8-bit K/V noise, an Inductor rounding)
NEAR_TIE = 0.05

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
    "gpt_neox": ("GPTNeoXConfig", "GPTNeoXForCausalLM"),          # Pythia: rotary on a quarter of head_dim
    "gpt_bigcode": ("GPTBigCodeConfig", "GPTBigCodeForCausalLM"),  # StarCoder: one KV head (multi-query)
    "falcon": ("FalconConfig", "FalconForCausalLM"),               # multi-query, attention and MLP in parallel
    "phi": ("PhiConfig", "PhiForCausalLM"),                        # Phi-2: rotary on half of head_dim
    "mixtral": ("MixtralConfig", "MixtralForCausalLM"),            # mixture of experts
    "cohere": ("CohereConfig", "CohereForCausalLM"),               # Command-R: interleaved rotary, parallel block
    "olmo2": ("Olmo2Config", "Olmo2ForCausalLM"),                  # norms over the whole q and k projections
    "doge": ("DogeConfig", "DogeForCausalLM"),                     # reads its value cache for a dynamic mask
    "falcon_h1": ("FalconH1Config", "FalconH1ForCausalLM"),        # Mamba and attention layers in one cache
    "qwen3_next": ("Qwen3NextConfig", "Qwen3NextForCausalLM"),     # linear-attention layers with states, no K/V
    "deepseek_v3": ("DeepseekV3Config", "DeepseekV3ForCausalLM"),  # MLA: caches its latents, attends over projections
    "gemma3n": ("Gemma3nTextConfig", "Gemma3nForCausalLM"),        # its last layers read earlier layers' K/V
    "gpt_neo": ("GPTNeoConfig", "GPTNeoForCausalLM"),              # eager only: float32 scores, a where-mask
    "minimax": ("MiniMaxConfig", "MiniMaxForCausalLM"),            # lightning attention; a cache class of its own
}

# per family: _TINY entries its config has no field for (derived there: Falcon's and GPTBigCode's one KV head
# comes from multi_query, most head dims from hidden_size / heads), and entries of its own
_TINY_DROP = {"phi3": ("head_dim",), "gpt_neox": ("num_key_value_heads", "head_dim"),
              "falcon": ("num_key_value_heads", "head_dim"), "phi": ("head_dim",), "cohere": ("head_dim",),
              "olmo2": ("head_dim",), "doge": ("head_dim",), "falcon_h1": ("head_dim",)}
_TINY_EXTRA = {"gemma3": dict(sliding_window=4),
               "gemma3n": dict(num_hidden_layers=4, layer_types=["sliding_attention", "full_attention"] * 2,
                               num_kv_shared_layers=2, sliding_window=4, vocab_size_per_layer_input=128,
                               hidden_size_per_layer_input=16, laurel_rank=8),
               "mixtral": dict(num_local_experts=4, num_experts_per_tok=2),
               "minimax": dict(num_local_experts=4, num_experts_per_tok=2, block_size=16,
                               layer_types=["full_attention", "linear_attention"]),
               "falcon_h1": dict(mamba_d_ssm=64, mamba_n_heads=8, mamba_d_head=8, mamba_d_state=16,
                                 mamba_chunk_size=16),
               "qwen3_next": dict(layer_types=["linear_attention", "full_attention"], num_experts=4,
                                  num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=32),
               "deepseek_v3": dict(head_dim=8, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16,
                                   kv_lora_rank=32, q_lora_rank=32, num_key_value_heads=4, n_routed_experts=4,
                                   num_experts_per_tok=2, moe_intermediate_size=32, n_group=1, topk_group=1,
                                   first_k_dense_replace=1, n_shared_experts=1)}
_GPT2_STYLE = dict(n_embd=64, n_layer=2, n_head=4, vocab_size=128, n_positions=256)
# sizes under the family's own field names (a global and a local layer for GPT-Neo)
_OWN_SIZES = {"gpt2": _GPT2_STYLE, "gpt_bigcode": _GPT2_STYLE,
              "gpt_neo": dict(hidden_size=64, num_layers=2, num_heads=4, intermediate_size=128, vocab_size=128,
                              max_position_embeddings=256, attention_types=[[["global", "local"], 1]], window_size=4,
                              pad_token_id=0, eos_token_id=1, bos_token_id=2)}

_TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, head_dim=32, vocab_size=128, max_position_embeddings=256,
             pad_token_id=0, eos_token_id=1, bos_token_id=2)


def tiny_hf_model(family: str, attn: Optional[str] = None, seed: int = 0, **overrides):
    """A 2-layer model of ``family`` (GQA 4:2, head_dim 32, vocab 128, or its own family's nearest) with random
    weights; Gemma 3n's has 4 layers, the last two reading the first two's K/V."""
    import transformers

    if family not in FAMILIES:
        raise ValueError(f"family={family!r} is not supported; allowed: {', '.join(FAMILIES)}")
    cfg_name, model_name = FAMILIES[family]
    if family in _OWN_SIZES:
        kw = dict(_OWN_SIZES[family])
    else:
        kw = {k: v for k, v in _TINY.items() if k not in _TINY_DROP.get(family, ())}
        kw.update(_TINY_EXTRA.get(family, {}))
    kw.update(overrides)
    if not hasattr(transformers, cfg_name):
        raise ValueError(f"family={family!r} needs {cfg_name}, which transformers {transformers.__version__} lacks")
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


def greedy_generate(model, ids, mask=None, cache: str = "dynamic", new_tokens: int = 6) -> tuple:
    """``(tokens [B, new_tokens], logits [B, new_tokens, vocab])`` of a transformers model's greedy generation after
    ``ids`` (``mask``: its attention mask, all ones by default; ``cache="static"``: a static cache)."""
    kw = {"cache_implementation": "static"} if cache == "static" else {}
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids) if mask is None else mask,
                             max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
                             output_logits=True, return_dict_in_generate=True, **kw)
    return out.sequences[:, ids.shape[1]:], torch.stack(out.logits, 1)


def parting_margin(tokens, ref_tokens, ref_logits) -> Optional[float]:
    """Where one sequence's ``tokens`` first part from the reference's: the reference's top-2 logit margin at that
    step (a near-tie, below ``NEAR_TIE``, flips under any perturbation); None where they never part."""
    parted = (tokens != ref_tokens).nonzero()
    if not len(parted):
        return None
    top2 = ref_logits[int(parted[0])].topk(2).values
    return float(top2[0] - top2[1])


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
