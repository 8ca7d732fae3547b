"""``tq bench`` end to end on a tiny model (CPU): every column, exact cache bytes, CSV."""

import csv

import pytest

from turboquant.cli import main

pytest.importorskip("transformers")


def test_tq_bench_tiny_end_to_end(tmp_path, capsys):
    out = tmp_path / "bench"
    # --shapes picks (batch, context) pairs; here the same single pair --contexts 24 --batches 2 gives
    assert main(["bench", "--tiny", "--device", "cpu", "--shapes", "2x24", "--new-tokens", "4",
                 "--settings", "bf16", "affine-4", "--out", str(out), "--no-progress"]) == 0
    captured = capsys.readouterr()
    text = captured.out
    assert "decode_tok_s" in text and "budget_vs_bf16" in text
    assert captured.err.count("tq bench row: ") == 2
    rows = {r["setting"]: r for r in csv.DictReader(open(out / "e2e_generate.csv"))}
    assert set(rows) == {"bf16", "affine-4"}
    # fp32 tiny model, head_dim 32: 16 bytes of 4-bit codes + fp16 (scale, zero) per 128-byte vector
    assert float(rows["affine-4"]["cache_ratio"]) == pytest.approx(20 / 128)
    assert float(rows["affine-4"]["budget_vs_bf16"]) == pytest.approx(128 / 20, rel=1e-6)
    assert float(rows["bf16"]["speedup"]) == 1.0 and float(rows["affine-4"]["decode_tok_s"]) > 0
    assert rows["affine-4"]["device"] and rows["affine-4"]["torch"]
    assert rows["affine-4"]["batch"] == "2" and rows["affine-4"]["context"] == "24"
    # issue 5's plots: tokens/s and cache bytes against context, one line per setting and batch
    for png in ("tokens_per_s.png", "cache_bytes.png"):
        assert (out / png).stat().st_size > 1000 and png in text


def test_tq_bench_with_a_dynamic_cache(tmp_path, capsys):
    # issue 5: DynamicCache generation is reported too (on the CPU: the cache grows by concatenation)
    out = tmp_path / "bench"
    assert main(["bench", "--tiny", "--device", "cpu", "--shapes", "1x20", "--new-tokens", "3", "--cache", "dynamic",
                 "--settings", "bf16", "affine-4", "--out", str(out), "--no-progress"]) == 0
    assert "3 new tokens, dynamic cache" in capsys.readouterr().out
    rows = {r["setting"]: r for r in csv.DictReader(open(out / "e2e_generate.csv"))}
    assert {r["cache"] for r in rows.values()} == {"dynamic"}
    # the grown cache holds the prompt and the tokens fed back (20 + 3 - 1 positions): 2 layers × K, V ×
    # 2 heads × 22 rows × (16 bytes of 4-bit codes + a 4-byte (scale, zero) word)
    assert int(rows["affine-4"]["cache_bytes"]) == 2 * 2 * 2 * 22 * 20
    assert float(rows["affine-4"]["cache_ratio"]) == pytest.approx(20 / 128)
    assert float(rows["affine-4"]["decode_tok_s"]) > 0


def test_tq_bench_names_a_bad_cache():
    with pytest.raises(ValueError, match=r"cache='paged' is not supported; allowed: static, dynamic"):
        from turboquant.bench.e2e import run_bench

        run_bench(shapes=[(1, 8)], settings=["bf16"], tiny=True, device="cpu", cache="paged")


def test_tq_bench_names_a_bad_shape():
    with pytest.raises(SystemExit, match="BATCHxCONTEXT"):
        main(["bench", "--tiny", "--device", "cpu", "--shapes", "8by32768", "--out", ""])


def test_tq_bench_modes_are_the_ones_its_help_lists():
    import argparse

    from turboquant.bench.e2e import add_arguments

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    mode = next(a for a in parser._actions if a.dest == "mode")
    assert mode.choices == ["default", "reduce-overhead", "max-autotune"]  # each one parses as listed
    assert parser.parse_args([]).mode == "default"
    with pytest.raises(SystemExit):
        parser.parse_args(["--mode", "None"])


def test_tq_bench_rejects_an_unknown_setting_before_running():
    with pytest.raises(ValueError, match="not understood"):
        main(["bench", "--tiny", "--device", "cpu", "--settings", "affine-4", "nonsense-3", "--out", ""])


@pytest.mark.parametrize("setting", ["bf16", "affine-4"])
def test_static_caches_are_allocated_before_the_compiled_region(setting):
    """Both sides of the bench allocate a static cache outside the compiled graph, as static
    addresses: allocated inside a compiled prefill, it is CUDA-graph memory that the next replay
    overwrites (seen: `tq bench --mode reduce-overhead` failed in its bf16 row on the H200), and
    CUDA graph trees skip graphs that write an unmarked cache."""
    import torch

    import turboquant
    from turboquant.demo import compiled_baseline
    from turboquant.testing import tiny_hf_model

    base = tiny_hf_model("llama")  # 2 layers: where the cache is allocated does not depend on the size
    model = compiled_baseline(base) if setting == "bf16" else turboquant.compile(base, bits=4)
    ids = torch.randint(0, 128, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=3, do_sample=False,
                             cache_implementation="static", return_dict_in_generate=True)
    keys = out.past_key_values.layers[0].keys
    held = [keys.codes, keys.meta] if setting != "bf16" else [keys]
    assert all(getattr(t, "_dynamo_static_input_type", None) for t in held)


def test_decode_step_host_breakdown_smoke(tmp_path):
    """``benchmarks/decode_step_host.py`` on the tiny model (CPU): one row per setting, the parts
    of a step no larger than the step, the wrapped torch internals restored afterwards."""
    import importlib.util
    import pathlib

    import turboquant.templates.decode_attention as kernel
    from torch._functorch._aot_autograd import subclass_utils

    path = pathlib.Path(__file__).parent.parent / "benchmarks" / "decode_step_host.py"
    spec = importlib.util.spec_from_file_location("decode_step_host", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    unwrap, launcher = subclass_utils.runtime_unwrap_tensor_subclasses, kernel.decode_attention
    # 8 tokens (7 steps) and 5 rounds: the per-step figure is a difference of two timed generates, which a
    # busy machine (the other xdist worker compiling) must not shrink below the parts inside it
    plans, host_bound = kernel._PLANS, kernel.HOST_BOUND_KEY_ROWS
    assert bench.main(["--tiny", "--device", "cpu", "--context", "12", "--new-tokens", "8", "--repeats", "5",
                       "--settings", "bf16", "affine-4", "affine-4/splits", "--out", str(tmp_path), "--profile",
                       "--turns", str(tmp_path / "turns"), "1"]) == 0
    assert subclass_utils.runtime_unwrap_tensor_subclasses is unwrap and kernel.decode_attention is launcher
    assert kernel._PLANS is plans and kernel.HOST_BOUND_KEY_ROWS == host_bound
    rows = {r["setting"]: r for r in csv.DictReader(open(tmp_path / "decode_step_host.csv"))}
    # affine-4/splits: affine-4's compiled model again, its plans without the host-bound single split
    assert set(rows) == {"bf16", "affine-4", "affine-4/splits"} and float(rows["bf16"]["vs_bf16"]) == 1.0
    for r in rows.values():
        assert 0 < float(r["forward_ms"]) <= float(r["ms_per_step"]) * 1.5
        assert float(r["gc_ms"]) <= float(r["ms_per_step"])
    # the quantized step's profile reaches the attention op's kernel without the dispatcher
    assert "_attention_direct" in (tmp_path / "profile_affine-4.txt").read_text()
    assert "function calls" in (tmp_path / "profile_bf16.txt").read_text()


def test_prefill_attention_benchmark_smoke(tmp_path):
    """``benchmarks/prefill_attention.py`` on the CPU: both shapes, a bf16 row and a quantized row per
    shape, the quantized rows equal to attention over the dequantized cache."""
    import importlib.util
    import pathlib

    path = pathlib.Path(__file__).parent.parent / "benchmarks" / "prefill_attention.py"
    spec = importlib.util.spec_from_file_location("prefill_attention", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    assert bench.main(["--device", "cpu", "--prompts", "40", "--chunk", "8", "--methods", "affine", "--bits", "4",
                       "--out", str(tmp_path), "--no-progress"]) == 0
    rows = list(csv.DictReader(open(tmp_path / "prefill_attention.csv")))
    assert [(r["shape"], r["setting"]) for r in rows] == [
        ("whole prompt", "bf16 SDPA (dense)"), ("whole prompt", "turboquant affine 4-bit"),
        ("last chunk", "bf16 SDPA (dense)"), ("last chunk", "turboquant affine 4-bit")]
    for r in rows:
        assert float(r["us"]) > 0
        if r["setting"].startswith("turboquant"):
            assert float(r["rel_err"]) < 1e-2  # bf16 output against float32 over the same codes


def test_decode_step_kernels_smoke(tmp_path):
    """``benchmarks/decode_step_kernels.py`` on the tiny model (CPU): a row per setting with its launch
    and kernel-time columns (zero without a GPU), the per-setting kernel listing, the CSV."""
    import importlib.util
    import pathlib

    path = pathlib.Path(__file__).parent.parent / "benchmarks" / "decode_step_kernels.py"
    spec = importlib.util.spec_from_file_location("decode_step_kernels", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    assert bench.main(["--tiny", "--device", "cpu", "--context", "8", "--new-tokens", "3", "--settings", "bf16",
                       "--out", str(tmp_path)]) == 0
    (row,) = csv.DictReader(open(tmp_path / "decode_step_kernels.csv"))
    assert row["setting"] == "bf16" and int(row["launches"]) == 0 and float(row["kernel_ms_per_step"]) == 0
    assert (tmp_path / "kernels_bf16.txt").read_text().startswith("bf16: 3-token generate at 1 x 8")


def test_decode_step_launches_lists_a_layers_kernels(tmp_path):
    """``benchmarks/decode_step_launches.py`` on the CPU (Inductor's Triton schedule): one layer of the
    1B benchmark's architecture, the quantized step calling the attention op once and launching no more
    kernels than bf16's (the cache write fuses into the kernels that produce K and V), the listings."""
    import importlib.util
    import pathlib

    path = pathlib.Path(__file__).parent.parent / "benchmarks" / "decode_step_launches.py"
    spec = importlib.util.spec_from_file_location("decode_step_launches", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    assert bench.main(["--device", "cpu", "--settings", "bf16", "turbo-3", "--cache-len", "40",
                       "--out", str(tmp_path)]) == 0
    rows = {r["setting"]: r for r in csv.DictReader(open(tmp_path / "decode_step_launches.csv"))}
    assert rows["bf16"]["attention_calls"] == "0" and rows["turbo-3"]["attention_calls"] == "1"
    assert 0 < int(rows["turbo-3"]["launches"]) <= int(rows["bf16"]["launches"])
    listed = (tmp_path / "launches_turbo-3.txt").read_text().split()
    assert len(listed) == int(rows["turbo-3"]["launches"]) and all(k.startswith("triton_") for k in listed)
    assert "def call(" in (tmp_path / "wrapper_turbo-3.py").read_text()


def test_decode_sass_counts_the_loop_of_the_kernel_compiled_for_sm90(tmp_path):
    """``benchmarks/decode_sass.py`` on the CPU: the split kernel compiled for sm_90 with the plan a
    call would get, its main loop found and counted. With the register table, turbo 2-bit's loop
    has no shared-memory store of the gather (``STS``) and fewer instructions per key; read as fields (the default,
    no lookup) fewer still."""
    import os
    import pathlib
    import subprocess
    import sys

    pytest.importorskip("triton")
    path = pathlib.Path(__file__).parent.parent / "benchmarks" / "decode_sass.py"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # a real compile, not the interpreter
    rows = {}
    for lut in (False, True):
        subprocess.run([sys.executable, str(path), "turbo", "2", "--S", "32768", "--out", str(tmp_path),
                        "--no-linear-levels", "--no-polynomial-levels"]
                       + ["--register-lut" if lut else "--no-register-lut"], env=env,
                       check=True, capture_output=True)
        rows[lut] = next(csv.DictReader(open(tmp_path / "decode_sass.csv")))
    subprocess.run([sys.executable, str(path), "turbo", "2", "--S", "32768", "--out", str(tmp_path)], env=env,
                   check=True, capture_output=True)
    fields = next(csv.DictReader(open(tmp_path / "decode_sass.csv")))
    assert all(int(r["loop_instructions"]) > 0 and r["num_warps"] == "1" for r in (*rows.values(), fields))
    assert float(fields["per_key"]) < float(rows[True]["per_key"]) < float(rows[False]["per_key"])
    assert (fields["lookup"], rows[True]["lookup"], rows[False]["lookup"]) == ("lin", "prmt", "gather")
    sts = {lut: int(dict(x.split(":") for x in r["opcodes"].split()).get("STS", 0)) for lut, r in rows.items()}
    assert sts[True] < 8 < sts[False]
    # turbo 4-bit: its levels computed (the default) and, without them, its shuffle lookups: ptxas takes both
    # PTX, no shuffle is left in the computed loop, and either loop is shorter than the gather's (sm_90: 29.1
    # and 26.4 against 44.2 instructions per key)
    for name, flags in (("poly", []), ("shfl", ["--no-polynomial-levels"]),
                        ("gather", ["--no-polynomial-levels", "--no-shuffle-lut"])):
        subprocess.run([sys.executable, str(path), "turbo", "4", "--S", "32768", "--out", str(tmp_path)] + flags,
                       env=env, check=True, capture_output=True)
        rows[name] = next(csv.DictReader(open(tmp_path / "decode_sass.csv")))
    assert [rows[name]["lookup"] for name in ("poly", "shfl", "gather")] == ["poly", "shfl", "gather"]
    shfl = {name: int(dict(x.split(":") for x in rows[name]["opcodes"].split()).get("SHFL", 0))
            for name in ("poly", "shfl")}
    assert shfl["poly"] < 64 < 512 < shfl["shfl"]  # the softmax's few, against one a code
    for name in ("poly", "shfl"):
        assert float(rows[name]["per_key"]) < 0.8 * float(rows["gather"]["per_key"])


def _sass_row(tmp_path, *args):
    import os
    import pathlib
    import subprocess
    import sys

    path = pathlib.Path(__file__).parent.parent / "benchmarks" / "decode_sass.py"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # a real compile, not the interpreter
    subprocess.run([sys.executable, str(path), *args, "--out", str(tmp_path)], env=env, check=True,
                   capture_output=True)
    row = next(csv.DictReader(open(tmp_path / "decode_sass.csv")))
    return row, {k: int(v) for k, v in (x.split(":") for x in row["opcodes"].split())}


def test_decode_kernel_at_head_dim_64_compiled_for_sm90(tmp_path):
    """head_dim 64 on sm_90 (CPU compile). 2-bit rows are 8 words, a stride the JIT marks with no
    alignment: unless the kernel states one, each word was a scalar load in the loop (72 a block, no
    ``LDGSTS``), never staged through shared memory. Affine 4-bit values make 16-column planes there, and
    a short cache's four warps each computed the whole 16-row tile (the H200's plan at 1K: 8 splits of
    one block, 15.5 instructions per key of a split): such tiles take 4 rows (7.6)."""
    pytest.importorskip("triton")
    row, ops = _sass_row(tmp_path, "affine", "2", "--S", "32768", "--head-dim", "64")
    assert ops.get("LDGSTS", 0) >= 8 and ops.get("LDG", 0) <= 8, row["opcodes"]
    row, ops = _sass_row(tmp_path, "affine", "4", "--S", "1024", "--head-dim", "64")
    assert row["num_warps"] == "4" and row["num_splits"] == "8" and float(row["program_per_key"]) < 10, row


def _stream_ceiling_loop(*args) -> dict:
    """``benchmarks/decode_stream_ceiling.py --sm90-loop ARGS``' last JSON line, compiled for sm_90 in a child
    process (a real compile, not the interpreter this process runs under)."""
    import json
    import os
    import pathlib
    import subprocess
    import sys

    pytest.importorskip("triton")
    path = pathlib.Path(__file__).parent.parent / "benchmarks" / "decode_stream_ceiling.py"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, str(path), "--sm90-loop", *args], env=env, check=True, capture_output=True,
                         text=True).stdout
    return json.loads(out.splitlines()[-1])


@pytest.mark.parametrize("bits, meta", [(2, True), (4, True), (2, False), (3, True)])
def test_stream_ceiling_reads_as_the_split_kernel_does(bits, meta):
    """``benchmarks/decode_stream_ceiling.py``'s kernel compiled for sm_90 (CPU): its code tiles go through
    the pipeliner's shared-memory stages (``LDGSTS``) as the split kernel's do, its metadata words are
    plain loads a block ahead (``LDG``), and its loop computes next to nothing: a pattern, not a kernel."""
    loop = _stream_ceiling_loop("--bits", str(bits), *([] if meta else ["--no-meta"]))
    ops, row = loop["opcodes"], 128 * bits // 16
    cols = 1 << (row - 1).bit_length()  # 3-bit rows' 24 words read as 32 columns, the last 8 masked
    # a block's key and value tiles, 16 bytes a copy: 64 keys × 2 · cols words × 2 bytes / 32 lanes / 16
    assert ops["LDGSTS"] == 64 * 2 * cols * 2 // 32 // 16
    assert ops.get("LDG", 0) == (2 if meta else 0)  # a key's and a value's metadata, 8 bytes a lane each
    assert loop["loop_instructions"] < 12 * ops["LDGSTS"] + 60, ops
    # two of three stages' key and value tiles in shared memory (the split kernel's 2-bit: 8320 bytes)
    assert loop["shared"] == 2 * 64 * cols * 2 * 2


def test_stream_ceiling_reads_3bit_rows_as_byte_planes_as_the_split_kernel_does():
    """The 3-bit byte-plane variant compiled for sm_90 (CPU): three 16-byte planes a row through the
    pipeliner's stages, the values' bytes leaving shared memory a byte a load as the split kernel's do
    (3 planes × 64 keys × 16 bytes / 32 lanes = 96 ``LDS``; the split kernel's 3-bit loop holds 110)."""
    ops = _stream_ceiling_loop("--bits", "3", "--byte-planes", "3")["opcodes"]
    # per plane eight MMAs for the keys' 64 × 16-byte tile and eight for the values'
    assert ops["LDGSTS"] > 0 and ops["LDS"] >= 96 and ops["HMMA"] == 48, ops


def test_stream_ceiling_reads_2_plus_1_rows_with_a_third_of_the_byte_loads():
    """The "2+1" variant (16 words of low bits, one byte plane of high bits) compiled for sm_90 (CPU): the words
    leave shared memory as matrices (``LDSM``), only the byte plane's value bytes a byte a load (64 keys × 16
    bytes / 32 lanes = 32 ``LDS``; three byte planes take 96), and two tiles' MMAs where the byte planes take three."""
    ops = _stream_ceiling_loop("--bits", "3", "--byte-planes", "1")["opcodes"]
    assert ops["LDGSTS"] > 0 and ops.get("LDSM", 0) > 0 and 32 <= ops["LDS"] < 96 and ops["HMMA"] == 32, ops


def test_compile_codegen_benchmark_smoke(tmp_path):
    """``benchmarks/compile_codegen.py`` on one layer (CPU): a row per setting from a child process,
    the quantized model's schedule with no fewer Triton kernels than bf16's, and the CSV."""
    import importlib.util
    import pathlib

    path = pathlib.Path(__file__).parent.parent / "benchmarks" / "compile_codegen.py"
    spec = importlib.util.spec_from_file_location("compile_codegen", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out = tmp_path / "codegen.csv"
    assert bench.main(["--layers", "1", "--context", "16", "--settings", "bf16", "turbo-2", "--out", str(out)]) == 0
    rows = {r["setting"]: r for r in csv.DictReader(open(out))}
    assert set(rows) == {"bf16", "turbo-2"} and float(rows["bf16"]["vs_bf16"]) == 1.0
    assert all(float(r["codegen_s"]) > 0 for r in rows.values())
    assert int(rows["turbo-2"]["triton_kernels"]) >= int(rows["bf16"]["triton_kernels"]) > 0


def test_three_bit_value_words_compile_to_two_wide_fragments(tmp_path):
    """The word tiles' lanes are made for k-width 2 fragments (``_word3_lanes``), so the compiled kernel (sm_90,
    CPU compile) must give every pack-8 asm's operands that width, also with a bool mask, whose byte loads had made
    the value dots' operands k-width 4 (``_wide_origin``); and its loop is shorter than the byte planes'."""
    pytest.importorskip("triton")
    for method, mask in (("turbo", []), ("turbo", ["--bool-mask"]), ("affine", ["--bool-mask"])):
        per_key = {}
        for words in ("--value-words", "--no-value-words"):
            ttgir = tmp_path / "k.ttgir"
            row, _ = _sass_row(tmp_path, method, "3", *mask, words, "--dump-ttgir", str(ttgir))
            per_key[words] = float(row["per_key"])
            asm = [line for line in ttgir.read_text().splitlines() if "packed_element = 8" in line]
            assert (len(asm) > 0) == (words == "--value-words"), (method, mask)
            assert all("kWidth = 2" in line and "kWidth = 4" not in line for line in asm), (method, mask)
        assert per_key["--value-words"] < per_key["--no-value-words"], (method, mask)
