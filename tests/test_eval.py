"""``tq eval`` and the reference-model trainer, end to end on a tiny model (CPU, well under a minute)."""

import csv
import json
import os
import random

import pytest
import torch

from turboquant.cli import main
from turboquant.eval import corpus, needle, run
from turboquant.eval.configs import DEFAULT_CONFIGS, parse_config, parse_configs
from turboquant.eval.metrics import Reference, Runner, evaluate_windows, heldout_windows

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    """A 2-layer byte-level Llama trained for 20 steps by the reference trainer (seconds)."""
    from turboquant.eval import train

    out = str(tmp_path_factory.mktemp("tiny_reference"))
    assert train.main(["--device", "cpu", "--tiny", "--steps", "20", "--out", out, "--eval-windows", "4",
                       "--eval-needles", "4"]) == 0
    return out


@pytest.fixture(scope="module")
def loaded(tiny_model):
    model = run.load_model(tiny_model, torch.device("cpu"), torch.float32)
    tok = corpus.load_tokenizer(tiny_model, model.config.vocab_size)
    return model, tok


# ---- configurations ------------------------------------------------------------------------------

def test_config_specs():
    c = parse_config("turbo-k4v3")
    assert c.kwargs == {"method": "turbo", "k_bits": 4, "v_bits": 3, "bits": 4} and c.bits == (4, 3)
    assert parse_config("affine-8").bits == (8, 8)
    assert parse_config("affine-4-g32-c99.9").kwargs["group_size"] == 32
    assert not parse_config("none").quantized
    assert parse_config("turbo-3-p2-h8").kwargs == {"method": "turbo", "bits": 3, "protected_layers": (0, 1, -2, -1),
                                                    "protected_bits": 8}
    assert parse_config("turbo-4-n0").kwargs["rescale_norm"] is False
    assert [c.name for c in parse_configs(["affine-8", "AFFINE-8", "turbo-2"])] == ["affine-8", "turbo-2"]
    assert len(parse_configs(DEFAULT_CONFIGS)) == len(DEFAULT_CONFIGS)
    for bad, msg in [("foo-3", "not understood"), ("affine-5", "bits=5"), ("affine-3-x1", "allowed prefixes"),
                     ("turbo-3-g32", "affine"), ("affine-3-p0", "boundary layers must be"),
                     ("affine-3-h8", "needs protected_layers"), ("turbo-4-n2", "-n0 or -n1"),
                     ("affine-4-n0", "turbo' only")]:
        with pytest.raises(ValueError, match=msg):
            parse_config(bad)


# ---- corpus and needles --------------------------------------------------------------------------

def test_heldout_split_is_pinned_and_disjoint():
    held = {rel for rel, _ in corpus.HELDOUT_FILES}
    assert len(held) == len(corpus.HELDOUT_FILES) >= 20
    assert not held & set(corpus.train_files())
    stream = corpus.heldout_tokens()
    assert stream.dtype == torch.int64 and len(stream) > 250_000
    assert int((stream == corpus.ByteTokenizer.EOS).sum()) == len(held)
    # the files were identical in CPython 3.11.7, 3.12.1 and 3.13.0: the same bytes everywhere
    if not corpus._heldout(corpus.stdlib_root())[2]:  # every pinned file present and unchanged here
        assert corpus.heldout_digest() == "fbcb6fd6f4ccc200"


def test_needle_samples_are_deterministic_and_findable():
    tok = corpus.ByteTokenizer()
    stream = corpus.heldout_tokens()
    a = needle.needle_set(stream, 512, 5, tok, seed=3)
    b = needle.needle_set(stream, 512, 5, tok, seed=3)
    c = needle.needle_set(stream, 512, 5, tok, seed=4)
    assert all(torch.equal(x.ids, y.ids) and x.value == y.value for x, y in zip(a, b))
    assert any(not torch.equal(x.ids, y.ids) for x, y in zip(a, c))
    for s in a:
        ids = s.ids.tolist()
        assert len(ids) == 512 and ids[0] == tok.BOS
        assert len(s.value) == 6 and s.value.isdigit() and tok.decode(s.answer.tolist()) == s.value
        # the target line sits early, right after a KEY marker, and the query at the end asks for its key
        assert ids[s.position] == tok.KEY and 0.03 * 512 < s.position < 0.3 * 512
        line = tok.encode(f"{s.key}:{s.value}\n")
        assert ids[s.position + 1:s.position + 1 + len(line)] == line
        query = [tok.QUERY] + tok.encode(f"{s.key}:")
        assert s.prompt.tolist()[-len(query):] == query
        assert ids.count(tok.QUERY) == 1 and ids.count(tok.KEY) == 3  # target + 2 distractors
    # greedy exact match == every answer token is the argmax after the true prefix
    logits = torch.zeros(1, 10, 20)
    answer = torch.tensor([[3, 4]])
    logits[0, 6, 3] = logits[0, 7, 4] = 1.0
    assert needle.answer_is_argmax(logits, 7, answer).tolist() == [True]
    logits[0, 7, 5] = 2.0
    assert needle.answer_is_argmax(logits, 7, answer).tolist() == [False]


# ---- trainer -------------------------------------------------------------------------------------

def test_trainer_saves_a_transformers_checkpoint(tiny_model, loaded):
    files = set(os.listdir(tiny_model))
    assert {"config.json", "model.safetensors", "training_summary.json", corpus.TOKENIZER_FILE} <= files
    summary = json.load(open(os.path.join(tiny_model, "training_summary.json")))
    for key in ("command", "seed", "steps", "tokens", "final_train_loss", "heldout_ppl", "needle_accuracy", "torch",
                "device", "wall_seconds", "log"):
        assert key in summary, key
    assert summary["steps"] == 20 and summary["tokens"] > 0 and "--tiny" in summary["command"]
    assert 1.0 < summary["heldout_ppl"] < 264 and summary["log"][0]["loss"] > summary["log"][-1]["loss"]
    model, tok = loaded
    cfg = model.config
    assert isinstance(tok, corpus.ByteTokenizer) and cfg.vocab_size == 264
    assert cfg.num_key_value_heads < cfg.num_attention_heads  # GQA


# ---- metrics -------------------------------------------------------------------------------------

def _windows(tok, n=4, window=128):
    return heldout_windows(corpus.heldout_tokens(tok), window, n, tok.bos_id)


def test_metrics_sanity(loaded):
    model, tok = loaded
    ref = Reference(Runner(model, parse_config("none"), "eager"), _windows(tok), 2, "cpu")
    same = evaluate_windows(ref.runner, ref)
    other = evaluate_windows(Runner(model, parse_config("none"), "eager"), ref)  # a real second forward
    assert other["kl"] == 0.0 and other["top1_agree"] == 1.0 and other["ppl"] == pytest.approx(same["ppl"], rel=1e-6)
    kl = {b: evaluate_windows(Runner(model, parse_config(f"affine-{b}"), "eager"), ref)["kl"] for b in (8, 2)}
    assert 0.0 < kl[8] < 1e-5 and kl[2] > 10 * kl[8]


def test_quantized_prefill_reads_quantized_kv(loaded):
    """One forward over a window == prefill chunk + continuation chunks: the prefill already
    attends to quantized K/V (so a single forward measures the quantized cache)."""
    model, tok = loaded
    ids = _windows(tok, n=2)
    q = Runner(model, parse_config("affine-2"), "eager")
    whole, chunked = q.logits(ids), q.logits(ids, chunk=32)
    torch.testing.assert_close(whole, chunked, atol=1e-5, rtol=1e-5)
    dense = Runner(model, parse_config("none"), "eager").logits(ids)
    assert (whole - dense).abs().max() > 1e-3  # the quantized cache did change the logits
    assert q.bits_per_element() == pytest.approx(2 + 32 / 32)  # 2-bit codes + fp16 scale/zero per 32 elements


def test_greedy_decode_agrees_with_teacher_forcing(loaded):
    model, tok = loaded
    samples = needle.needle_set(corpus.heldout_tokens(tok), 128, 3, tok, seed=1)
    prompts, _ = needle.stack(samples, with_answer=False)
    q = Runner(model, parse_config("turbo-4"), "eager")
    greedy = q.greedy(prompts, 6)
    forced = q.logits(torch.cat([prompts, greedy], 1))
    assert torch.equal(forced[:, prompts.shape[1] - 1:-1].argmax(-1), greedy)


# ---- tq eval end to end --------------------------------------------------------------------------

def _read_csv(path):
    with open(path) as f:
        return list(csv.DictReader(f))


def test_tq_eval_end_to_end(tiny_model, tmp_path, capsys):
    out = tmp_path / "eval.csv"
    rc = main(["eval", "--model", tiny_model, "--configs", "affine-8", "affine-2", "turbo-k4v3", "--contexts", "128",
               "256", "--needles", "3", "--max-windows", "3", "--window", "128", "--backend", "eager",
               "--csv", str(out), "--png", str(tmp_path / "eval.png"), "--no-progress"])
    assert rc == 0
    captured = capsys.readouterr()
    text = captured.out
    assert "config | method" in text and "turbo-k4v3" in text and "needle_256" in text
    rows = _read_csv(out)
    assert [r["config"] for r in rows] == ["none", "affine-8", "affine-2", "turbo-k4v3"]
    # every row is also printed the moment it is measured, so a run cut short keeps its rows
    assert captured.err.count("tq eval row: ") == len(rows)
    none, a8, a2, t43 = rows
    assert float(none["kl"]) == 0.0 and float(none["ppl_change_pct"]) == 0.0
    assert float(a8["kl"]) < float(a2["kl"]) and float(a8["bits_per_element"]) == 9.0
    assert float(t43["bits_per_element"]) == pytest.approx((4 + 3) / 2 + 16 / 32)
    assert all(0.0 <= float(r["needle_128"]) <= 1.0 for r in rows)
    assert rows[0]["heldout_digest"] == corpus.heldout_digest() and "tq eval" in rows[0]["command"]


def test_tq_eval_compiled_path(tiny_model, tmp_path):
    """The product path: turboquant.compile, one configuration (CPU compile dominates the time)."""
    res = run.run_eval(tiny_model, configs=["affine-4"], contexts=[128], needles=2, max_windows=2, window=128,
                       batch_size=2, device="cpu", backend="compile", needle_mode="forced", progress=False)
    eager = run.run_eval(tiny_model, configs=["affine-4"], contexts=[], needles=0, max_windows=2, window=128,
                         batch_size=2, device="cpu", backend="eager", progress=False)
    row, erow = res["rows"][1], eager["rows"][1]
    assert row["config"] == "affine-4" and row["bits_per_element"] == 5.0
    assert 0.0 < row["kl"] < 1e-3 and row["kl"] == pytest.approx(erow["kl"], rel=0.5)
    assert abs(row["ppl_change_pct"] - erow["ppl_change_pct"]) < 0.5


def test_tq_eval_without_reference_model_says_how_to_train(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(run, "REFERENCE_MODEL", str(tmp_path / "missing"))
    assert main(["eval", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "train_reference.py" in err and "--model PATH" in err


def test_png(tmp_path):
    pytest.importorskip("matplotlib")
    rows = [{"config": "none", "method": "none", "bits_per_element": 16.0, "ppl_change_pct": 0.0}] + [
        {"config": f"{m}-{b}", "method": m, "bits_per_element": b + 0.5, "ppl_change_pct": random.random() * 10 / b}
        for m in ("affine", "turbo") for b in (2, 3, 4)]
    path = run.plot_ppl_vs_bits(rows, str(tmp_path / "p.png"))
    assert path and os.path.getsize(path) > 1000


def test_committed_reference_model_loads_and_predicts_heldout_text():
    """The weights in turboquant/eval/reference_model are the trained model: two held-out windows (4.9 for
    these two; 3.0 over 64) stay within 2x the summary's perplexity, where 40 training steps give 24 and
    random weights about 264."""
    import json
    import math

    from turboquant.eval.corpus import heldout_tokens
    from turboquant.eval.metrics import heldout_windows

    summary = json.load(open(os.path.join(run.REFERENCE_MODEL, "training_summary.json")))
    model = run.load_model(run.REFERENCE_MODEL, torch.device("cpu"), torch.float32)
    ids = heldout_windows(heldout_tokens(), 1024, 2, 257)
    with torch.no_grad():
        logits = model(ids).logits[:, :-1]
    ppl = math.exp(float(torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))))
    assert summary["heldout_ppl"] < 3.5 and ppl < 2 * summary["heldout_ppl"], ppl
