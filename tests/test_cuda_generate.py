"""Compiled generation on CUDA with a quantized cache (the product path on a GPU).

Model: the trained reference model (turboquant/eval/reference_model, GQA 8:2, head_dim 64) in
float32: trained weights give confident next-token distributions, so greedy tokens compare
without the near-ties of random weights. Prompts are held-out text. Not bf16: there Inductor's
fused roundings moved logits by more than 0.1 against eager (affine-4, dynamic cache: paths
parted at step 10 with a top-2 margin above 0.1, H200, 2026-12-01), which says nothing about
the quantized cache; both paths call the same decode kernel.
"""

import copy

import pytest
import torch

import turboquant
from turboquant.compat import dynamo_counters
from turboquant.integrations.transformers import cache_kwarg, quantize_cache

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("fresh_dynamo")]
transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def model():
    from turboquant.eval.run import REFERENCE_MODEL, load_model

    return load_model(REFERENCE_MODEL, torch.device("cuda"), torch.float32)


def _prompts(batch=2, length=300):
    from turboquant.eval.corpus import heldout_tokens

    text = heldout_tokens()
    return torch.stack([text[5000 + 40_000 * r:5000 + 40_000 * r + length] for r in range(batch)]).cuda()


def _generate(m, ids, n, **kw):
    with torch.no_grad():
        out = m.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False, output_logits=True,
                         return_dict_in_generate=True, **kw)
    return out.sequences[:, ids.shape[1]:], torch.stack(out.logits, 1).float()


def _eager_quantized(model, ids, n, cfg):
    cache = transformers.DynamicCache(config=model.config)
    quantize_cache(cache, lambda i: cfg)
    return _generate(model, ids, n, past_key_values=cache)


def _diverges_only_at_near_ties(tokens, ref_tokens, ref_logits, margin=0.1):
    """Greedy paths may part where the reference's top-2 logits are within ``margin`` (bf16 Inductor
    fusions round differently from eager); anywhere else a different token is an error."""
    for row in range(tokens.shape[0]):
        diff = (tokens[row] != ref_tokens[row]).nonzero()
        if len(diff):
            top2 = ref_logits[row, int(diff[0])].topk(2).values
            if float(top2[0] - top2[1]) >= margin:
                return False
    return True


@pytest.mark.parametrize("method, bits", [("affine", 4), ("turbo", 3), ("affine", 8)])
@pytest.mark.parametrize("cache", ["dynamic", "static"])
def test_compiled_cuda_generation_matches_the_eager_quantized_path(model, method, bits, cache):
    ids, n = _prompts(), 24
    cfg = turboquant.KVQuantConfig(method=method, bits=bits)
    ref_tokens, ref_logits = _eager_quantized(model, ids, n, cfg)
    compiled = turboquant.compile(copy.deepcopy(model), method=method, bits=bits)
    kw = {"cache_implementation": "static"} if cache == "static" else {}
    tokens, logits = _generate(compiled, ids, n, **kw)
    assert _diverges_only_at_near_ties(tokens, ref_tokens, ref_logits)
    # teacher-forced over the eager path's tokens: the same logits up to bf16 rounding
    forced = torch.cat([ids, ref_tokens], 1)
    eager_cache = transformers.DynamicCache(config=model.config)
    quantize_cache(eager_cache, lambda i: cfg)
    with torch.no_grad():
        want = model(forced, **{cache_kwarg(model.forward): eager_cache}).logits.float()
        got = compiled(forced).logits.float()
    err = float((got - want).norm() / want.norm())
    assert err < 1e-2, err
    assert all(r.status == "quantized" for r in turboquant.report(compiled))


def test_decode_loop_does_not_recompile(model):
    compiled = turboquant.compile(copy.deepcopy(model), bits=4)
    ids = _prompts(1)
    _generate(compiled, ids, 4, cache_implementation="static")
    graphs = dynamo_counters()["stats"]["unique_graphs"]
    _generate(compiled, ids, 20, cache_implementation="static")
    assert dynamo_counters()["stats"]["unique_graphs"] == graphs


def test_reduce_overhead_replays_cuda_graphs(model):
    ids, n = _prompts(1), 24
    cfg = turboquant.KVQuantConfig(bits=4)
    ref_tokens, _ = _eager_quantized(model, ids, n, cfg)
    compiled = turboquant.compile(copy.deepcopy(model), bits=4, mode="reduce-overhead")
    _generate(compiled, ids, n, cache_implementation="static")  # warm-up and recording
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        tokens, _ = _generate(compiled, ids, n, cache_implementation="static")
    launches = sum(e.count for e in prof.key_averages() if e.key == "cudaGraphLaunch")
    assert _diverges_only_at_near_ties(tokens, ref_tokens, _eager_quantized(model, ids, n, cfg)[1])
    assert dynamo_counters()["inductor"]["cudagraph_skips"] == 0
    assert launches >= n - 2, launches
