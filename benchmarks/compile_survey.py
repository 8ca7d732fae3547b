"""Which transformers architectures does turboquant.compile handle, and how? (CPU is enough)

    python benchmarks/compile_survey.py                          # the SURVEY_TYPES below, dynamic and static caches
    python benchmarks/compile_survey.py --types falcon_h1 doge --caches dynamic

For each transformers model type: a 2-layer model with random weights (std 0.1) built from the type's own config
class with small sizes (hidden 64, 4 query heads, 2 KV heads where the config has such fields; the type's defaults
otherwise), SDPA attention where the model supports it, else eager; greedy generation of ``--new-tokens`` tokens
unquantized and with ``turboquant.compile(model, bits=8)``. A row says where a case stopped (``stage``:
``unquantized`` means this generic config or the model itself failed without turboquant, which says nothing about
turboquant), what ``turboquant.report`` lists (``status``), whether the tokens agree (a row may part where the
reference's top-2 logits are within ``NEAR_TIE``), and the warning turboquant gave, if any. The deeper fidelity
matrix of the supported families is ``benchmarks/compile_coverage.py``.
"""

import argparse
import copy
import os
import sys
import time
import warnings

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import turboquant  # noqa: E402
from turboquant.reporting import format_table, write_csv  # noqa: E402
from turboquant.testing import NEAR_TIE, greedy_generate, parting_margin  # noqa: E402

# decoder-only types of transformers 5.25 with a KV cache, beyond turboquant.testing.FAMILIES' Llama-like ones:
# multi-query, partial rotary, MoE, hybrid Mamba / linear-attention, MLA, custom caches
SURVEY_TYPES = ["olmo", "olmo2", "olmo3", "granite", "stablelm", "cohere", "cohere2", "starcoder2", "gpt_neox",
                "falcon", "opt", "mixtral", "qwen2_moe", "qwen3_moe", "glm", "glm4", "smollm3", "phi", "gptj",
                "codegen", "bloom", "gpt_bigcode", "exaone4", "ministral", "helium", "arcee", "hunyuan_v1_dense",
                "seed_oss", "apertus", "granitemoe", "nemotron", "persimmon", "jetmoe", "gpt_oss", "ernie4_5",
                "deepseek_v2", "deepseek_v3", "minimax", "llama4_text", "qwen3_next", "lfm2", "falcon_h1",
                "gemma3n_text", "doge", "bitnet", "xglm", "mpt", "gpt_neo", "dbrx", "ministral3", "olmoe", "zamba2",
                "recurrent_gemma"]
# small sizes, under each name configs use for them; a field goes in only where the type's config has it
SMALL = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             head_dim=16, max_position_embeddings=256, n_embd=64, n_layer=2, n_head=4, n_positions=256,
             num_layers=2, d_model=64, ffn_dim=128, n_inner=128, rotary_dim=8, num_kv_heads=2, kv_channels=16,
             num_local_experts=4, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
             shared_expert_intermediate_size=32, n_routed_experts=4, moe_num_experts=4)
# types whose small model needs more than SMALL: MLA latents (DeepSeek), an attention layer among the first two,
# layer patterns and sub-configs sized for two layers
_MLA = dict(qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16, kv_lora_rank=32, q_lora_rank=32, n_group=1,
            topk_group=1, first_k_dense_replace=1, n_shared_experts=1, head_dim=8, num_key_value_heads=4)
OWN = {"deepseek_v2": _MLA, "deepseek_v3": _MLA, "qwen3_next": dict(layer_types=["linear_attention", "full_attention"]),
       "recurrent_gemma": dict(block_types=["recurrent", "attention"]),
       "gpt_neo": dict(attention_types=[[["global", "local"], 1]], window_size=4),
       "dbrx": dict(attn_config=dict(kv_n_heads=2, rope_theta=10000.0, clip_qkv=8.0), n_heads=4, n_layers=2,
                    ffn_config=dict(ffn_hidden_size=128, moe_num_experts=4, moe_top_k=2), max_seq_len=256),
       "zamba2": dict(layers_block_type=["mamba", "hybrid"], mamba_d_state=8, mamba_headdim=16, n_mamba_heads=8,
                      attention_hidden_size=128, attention_head_dim=32),
       # four layers, the last two reading the first two's K/V (KV sharing)
       "gemma3n_text": dict(num_hidden_layers=4, layer_types=["sliding_attention", "full_attention"] * 2,
                            num_kv_shared_layers=2, sliding_window=4, vocab_size_per_layer_input=128,
                            hidden_size_per_layer_input=16, laurel_rank=8)}
ALWAYS = dict(vocab_size=128, pad_token_id=0, eos_token_id=1, bos_token_id=2, initializer_range=0.1)
COLUMNS = ["type", "cache", "attn", "stage", "status", "same_tokens", "parting_margin", "warning", "error", "seconds"]


def tiny_model(model_type: str):
    """``(model, attn)``: a 2-layer random-weight model of ``model_type`` (see the module doc)."""
    import transformers

    cls = transformers.CONFIG_MAPPING[model_type]
    fields = cls().to_dict()
    kw = {k: v for k, v in {**SMALL, **OWN.get(model_type, {})}.items() if k in fields}
    if "multi_query" in fields:
        kw.pop("num_key_value_heads", None)  # derived from multi_query (one KV head)
    try:
        cfg = cls(**kw, **ALWAYS)
    except (TypeError, ValueError, AttributeError):
        kw.pop("head_dim", None)  # a property in some configs
        cfg = cls(**kw, **ALWAYS)
    model_cls = transformers.MODEL_FOR_CAUSAL_LM_MAPPING[type(cfg)]
    attn = "sdpa" if getattr(model_cls, "_supports_sdpa", False) else "eager"
    cfg._attn_implementation = attn
    torch.manual_seed(0)
    return model_cls(cfg).eval(), attn


def run_case(model_type: str, cache: str, n: int) -> dict:
    row = {"type": model_type, "cache": cache, "stage": "unquantized"}
    start = time.time()
    try:
        base, row["attn"] = tiny_model(model_type)
        ids = torch.randint(3, 128, (1, 9), generator=torch.Generator().manual_seed(1))
        ref_tokens, ref_logits = (x[0] for x in greedy_generate(base, ids, cache=cache, new_tokens=n))
        row["stage"] = "turboquant"
        torch._dynamo.reset()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            model = turboquant.compile(copy.deepcopy(base), bits=8)
            tokens = greedy_generate(model, ids, cache=cache, new_tokens=n)[0][0]
        row["stage"] = "done"
        row["same_tokens"] = bool(torch.equal(tokens, ref_tokens))
        margin = parting_margin(tokens, ref_tokens, ref_logits)
        if margin is not None:
            row["parting_margin"] = round(margin, 4)
        rows = turboquant.report(model)
        row["status"] = "/".join(sorted({r.status for r in rows})) or "none"
        said = [str(w.message) for w in caught if str(w.message).startswith("turboquant")]
        row["warning"] = said[0][:150] if said else ""
    except Exception as e:  # a case that fails is a row of the table
        row["error"] = f"{type(e).__name__}: {e}".splitlines()[0][:150]
    row["seconds"] = round(time.time() - start, 1)
    return row


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--types", nargs="+", default=SURVEY_TYPES, help="transformers model types (config.model_type)")
    p.add_argument("--caches", nargs="+", default=["dynamic", "static"], choices=["dynamic", "static"])
    p.add_argument("--new-tokens", type=int, default=6)
    p.add_argument("--csv", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results",
                                                 "compile_survey.csv"))
    args = p.parse_args(argv)
    from tqdm.auto import tqdm  # a dependency of the package

    rows = [run_case(t, c, args.new_tokens) for t, c in tqdm([(t, c) for t in args.types for c in args.caches],
                                                             desc="survey", unit="case")]
    print(format_table(rows, COLUMNS))
    done = [r for r in rows if r["stage"] == "done"]
    follows = [r for r in done if r["same_tokens"] or r.get("parting_margin", 1) < NEAR_TIE]
    print(f"{len(done)}/{len(rows)} cases ran; of those, {sum(r['status'] == 'quantized' for r in done)} quantized "
          f"every layer the graphs hold and {len(follows)} followed the unquantized tokens (up to a near-tie); "
          f"{sum(r['stage'] == 'turboquant' for r in rows)} failed under turboquant, "
          f"{sum(r['stage'] == 'unquantized' for r in rows)} without it")
    print(f"wrote {write_csv(rows, args.csv, COLUMNS)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
