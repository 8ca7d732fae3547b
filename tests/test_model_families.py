"""turboquant.compile on transformers architectures beyond the Llama-like ones of test_compile_models: multi-query
caches, partial rotary, mixtures of experts, a model that reads its own value cache, a hybrid Mamba/attention cache;
and the transformers integration's handling of cache layers that hold no K/V."""

import copy
import warnings
from types import SimpleNamespace

import pytest
import torch

import turboquant
from turboquant.cache import QuantizedCacheTensor
from turboquant.compat import dynamo_counters
from turboquant.integrations import transformers as hf
from turboquant.testing import NEAR_TIE, greedy_generate, parting_margin, tiny_hf_model

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("fresh_dynamo")

NEW_TOKENS = 6


def _model(family):
    try:
        # init std 0.1: transformers' 0.02 gives near-uniform logits whose greedy path flips at any perturbation
        return tiny_hf_model(family, initializer_range=0.1)
    except ValueError as e:
        pytest.skip(str(e))  # an architecture this transformers does not have


def _generate(model, ids, cache):
    tokens, logits = greedy_generate(model, ids, cache=cache, new_tokens=NEW_TOKENS)
    return tokens[0], logits[0]


def _quantized_run(family, cache="dynamic", then=None, device="cpu") -> SimpleNamespace:
    """``family``'s tiny model on ``device`` generating unquantized (``ref_tokens``, ``ref_logits``) and under
    ``turboquant.compile(bits=8)`` (``model``, ``tokens``, ``logits``, turboquant's warnings ``said``), and
    ``then(model, ids)``'s result as ``out``, called where the warnings are recorded."""
    base = _model(family).to(device)
    ids = torch.randint(3, 128, (1, 9), generator=torch.Generator().manual_seed(1)).to(device)
    ref_tokens, ref_logits = _generate(base, ids, cache)
    model = turboquant.compile(copy.deepcopy(base), bits=8)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        tokens, logits = _generate(model, ids, cache)
        with torch.no_grad():
            out = then(model, ids) if then is not None else None
    said = [str(m.message) for m in w if "turboquant" in str(m.message)]
    return SimpleNamespace(ref_tokens=ref_tokens, ref_logits=ref_logits, model=model, tokens=tokens, logits=logits,
                           said=said, out=out)


def _forward(model, ids):
    return model(ids, use_cache=True)


def _follows(run) -> bool:
    """The same tokens, or the same up to a step where the reference was a near-tie."""
    margin = parting_margin(run.tokens, run.ref_tokens, run.ref_logits)
    return margin is None or margin < NEAR_TIE


@pytest.mark.parametrize("family, cache", [
    ("gpt_neox", "dynamic"), ("gpt_bigcode", "dynamic"), ("gpt_bigcode", "static"), ("falcon", "dynamic"),
    ("phi", "dynamic"), ("mixtral", "dynamic"), ("cohere", "dynamic"), ("olmo2", "dynamic"), ("doge", "dynamic"),
    # GPT-Neo's static cache is left out: transformers (5.25) slices its causal/local band at the static length,
    # and its unquantized tokens already differ from the dynamic cache's (logits 70-110% apart)
    ("gpt_neo", "dynamic")])
# on CUDA the steps' attention is the split Triton kernel, and GPT-Neo hands it a float32 `where`-folded mask
@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_generate_8bit_follows_unquantized_with_every_layer_quantized(family, cache, device):
    if family == "doge" and tuple(int(x) for x in transformers.__version__.split(".")[:2]) < (5, 25):
        # 5.17's Doge builds its dynamic mask without the causal part in an eager prefill (a compiled one has it):
        # its unquantized reference attends to later tokens
        pytest.skip("transformers < 5.25: Doge's eager prefill is not causal")
    run = _quantized_run(family, cache, device=device)
    assert _follows(run)
    # quantized (not bit-equal), and 8-bit close: these 2-layer random models amplify K/V noise (tiny Llama and
    # Mixtral: 0.6–1.3% per position at 8 bits); a wrong head or layout mapping is O(1)
    assert 0 < _logit_error(run) < 2e-2
    rows = turboquant.report(run.model)
    assert len(rows) == 2 and all(r.status == "quantized" for r in rows), rows
    assert not run.said


def _logit_error(run) -> float:
    return float((run.logits[0] - run.ref_logits[0]).norm() / run.ref_logits[0].norm())


@pytest.mark.parametrize("family, kv_layers", [("falcon_h1", [0, 1]), ("qwen3_next", [1]), ("deepseek_v3", [0, 1])])
def test_caches_of_other_shapes_store_quantized_kv_and_say_what_they_did(family, kv_layers):
    """Falcon-H1's cache layers hold Mamba states and attention K/V together (their lazy initialization is also
    called for the states, ``conv_states=…``, which the K/V conversion passes through); Qwen3-Next's linear-attention
    layers hold states only (left alone); DeepSeek-V3 (MLA) caches its latents, single-head rows that its attention
    projects (reads decode them) and whose widths differ (no allocation ahead of the first call)."""
    run = _quantized_run(family, then=_forward)
    assert _follows(run)
    layers = hf.output_cache(run.out).layers
    assert [i for i, layer in enumerate(layers) if isinstance(getattr(layer, "keys", None), QuantizedCacheTensor)] \
        == kv_layers
    said, model = " ".join(run.said), run.model
    # where no rewritten attention reads the cache (MLA's), the warning says it is quantized all the same; where the
    # prefill's graphs break around the cache but the steps' do not (Falcon-H1), there is nothing to warn about
    assert "runs unchanged" not in said
    assert ("stores quantized K/V" in said) == (not turboquant.report(model))


def test_layers_reading_another_layers_kv_attend_over_its_quantized_cache():
    """Gemma 3n's last ``num_kv_shared_layers`` layers keep no cache of their own (a ``DummyLayer``: keys None, no
    ``lazy_initialization``, whose conversion failed with an AttributeError) and attend over the K/V of the last
    earlier layer of their kind. The producers hold codes, the sharers' layers are left alone, and all four
    attentions are rewritten to read the codes."""
    run = _quantized_run("gemma3n", then=_forward)
    assert _follows(run)
    assert 0 < _logit_error(run) < 2e-2
    layers = hf.output_cache(run.out).layers  # transformers 5.17 gives the sharers no cache layer at all
    assert [isinstance(layer.keys, QuantizedCacheTensor) for layer in layers[:2]] == [True, True]
    assert [layer.keys for layer in layers[2:]] in ([None, None], [])
    rows = turboquant.report(run.model)
    assert len(rows) == 2 and all(r.status == "quantized" for r in rows), rows
    counters = dynamo_counters()["turboquant"]
    assert counters["layers_quantized"] == 4 * counters["graphs"]
    assert not run.said


def test_a_cache_the_prefill_builds_is_quantized_at_the_first_step_without_a_warning():
    """MiniMax keeps its linear-attention states and attention K/V in a cache class of its own, which turboquant
    does not hand it: its prefill builds the cache inside the forward, where nothing is swapped, and each step
    receives it as an input that the backend moves to quantized storage. After the prefill the warning said the
    model ran unchanged; it now waits for a second call."""
    run = _quantized_run("minimax", then=lambda model, ids: model.generate(
        ids, max_new_tokens=2, do_sample=False, return_dict_in_generate=True))
    assert _follows(run)
    assert isinstance(hf.output_cache(run.out).layers[0].keys, QuantizedCacheTensor)
    assert [(r.layer, r.status) for r in turboquant.report(run.model)] == [(0, "quantized")]
    assert not run.said


class _StatesLayer:
    """A linear-attention cache layer: states of its own, no K/V."""

    def __init__(self):
        self.calls = []

    def lazy_initialization(self, conv_states=None, recurrent_states=None, state_idx=0):
        self.calls.append(("states", state_idx))


class _HybridLayer(_StatesLayer):
    """K/V and states in one layer; ``lazy_initialization`` takes either."""

    def __init__(self):
        super().__init__()
        self.keys = self.values = None
        self.is_initialized = False

    def lazy_initialization(self, *args, **kwargs):
        if len(args) == 2:
            self.keys, self.values = (torch.zeros(*a.shape[:-2], 0, a.shape[-1]) for a in args)
            self.is_initialized = True
        else:
            super().lazy_initialization(**kwargs)


def test_quantize_cache_skips_layers_without_kv_and_passes_state_calls_through():
    cache = type("Cache", (), {})()
    cache.layers = [_StatesLayer(), _HybridLayer()]
    config = turboquant.KVQuantConfig(bits=4)
    assert hf.quantize_cache(cache, lambda i: config) == 1
    states, hybrid = cache.layers
    assert getattr(states, "_turboquant_config", None) is None
    hybrid.lazy_initialization(conv_states=torch.zeros(1, 4, 3), state_idx=1)
    assert hybrid.calls == [("states", 1)] and hybrid.keys is None
    k = torch.randn(1, 2, 5, 32)
    hybrid.lazy_initialization(k, k.clone())
    assert isinstance(hybrid.keys, QuantizedCacheTensor) and isinstance(hybrid.values, QuantizedCacheTensor)
    assert hybrid.keys.shape == (1, 2, 0, 32)


def test_a_model_with_a_cache_class_of_its_own_is_not_given_a_dynamic_cache():
    own = type("OwnCacheLM", (), {"_supports_default_dynamic_cache": classmethod(lambda cls: False)})()
    assert hf.new_dynamic_cache(own) is None


@pytest.mark.parametrize("fields, kv_heads", [
    (dict(multi_query=True), 1),  # GPTBigCode as transformers 5.17 had it: no num_key_value_heads
    (dict(multi_query=True, new_decoder_architecture=False, num_kv_heads=None), 1),  # Falcon-7B on 5.17
    (dict(multi_query=True, new_decoder_architecture=True, num_kv_heads=2), 2),  # Falcon-40B's architecture
    (dict(num_key_value_heads=2), 2), (dict(), 4)])
def test_kv_shape_takes_one_head_for_multi_query_configs(fields, kv_heads):
    config = type("Config", (), dict(num_attention_heads=4, hidden_size=64, **fields))()
    model = type("Model", (), {"config": config})()
    assert hf.kv_shape(model) == (kv_heads, 16)
    # transformers' own allocation shape, as 5.17 gave it (num_key_value_heads, else every query head), yields
    model._get_static_cache_init_shape = lambda: (getattr(config, "num_key_value_heads", 4), 16)
    assert hf._initial_shape(model) == (kv_heads, 16)
    model._get_static_cache_init_shape = lambda: None  # MLA, or heads spread over devices
    assert hf._initial_shape(model) is None
