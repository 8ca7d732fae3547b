"""How long does Inductor take to generate a quantized model's code? (CPU, no GPU needed)

    python benchmarks/compile_codegen.py                                # bf16, affine-4, turbo-4, turbo-3; 16 layers
    python benchmarks/compile_codegen.py --settings turbo-4 --layers 4

A cold compile of the ~1B Llama of ``tq bench`` took bf16 46 s and turbo 173–259 s on the H200's
host, and the kernels' own compile (Triton to sm_90) is a few seconds of that: the rest is Dynamo,
AOTAutograd and Inductor up to the generated code, which a CPU runs the same way. Per setting this
times a static-cache generate's prefill graph (``--context`` tokens, batch 1) from the first call to
the moment Inductor's Triton backend hands over its wrapper source
(``compat.triton_wrapper_code_on_cpu``: Triton scheduling on CPU tensors, no kernel compiled or
run), in a fresh process each, so no compile is cached. The E2E model's architecture with a smaller
vocabulary and MLP (codegen time does not depend on their sizes) and random bf16 weights.
Prints a table and writes CSV.
"""

import argparse
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from turboquant.reporting import format_table, write_csv  # noqa: E402

COLUMNS = ["setting", "layers", "context", "codegen_s", "vs_bf16", "triton_kernels"]


def _one(setting: str, layers: int, context: int) -> dict:
    """Time one setting's codegen (run in a child process: nothing cached, nothing shared)."""
    import torch

    import turboquant
    from turboquant.bench.e2e import E2E_ARCH, build_model
    from turboquant.compat import triton_wrapper_code_on_cpu
    from turboquant.eval.configs import parse_config

    arch = dict(E2E_ARCH, num_hidden_layers=layers, vocab_size=1024, intermediate_size=2048)
    base = build_model(arch, "cpu", torch.bfloat16)
    ids = torch.randint(0, arch["vocab_size"], (1, context), generator=torch.Generator().manual_seed(0))
    if setting == "bf16":
        model, model.forward = base, torch.compile(base.forward)
    else:
        model = turboquant.compile(base, **parse_config(setting).kwargs)
    t0 = time.perf_counter()
    src = triton_wrapper_code_on_cpu(
        lambda: model.generate(ids, max_new_tokens=2, do_sample=False, cache_implementation="static"))
    return dict(setting=setting, layers=layers, context=context, codegen_s=time.perf_counter() - t0,
                triton_kernels=src.count("async_compile.triton("))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--settings", nargs="+", default=["bf16", "affine-4", "turbo-4", "turbo-3"])
    p.add_argument("--layers", type=int, default=16)
    p.add_argument("--context", type=int, default=256)
    p.add_argument("--out", default="benchmarks/results/compile_codegen.csv")
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        row = _one(args.child, args.layers, args.context)
        print(f"ROW {row['setting']} {row['codegen_s']:.3f} {row['triton_kernels']}", flush=True)
        return 0
    rows = []
    for setting in args.settings:
        out = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", setting, "--layers",
                              str(args.layers), "--context", str(args.context)], capture_output=True, text=True)
        line = [ln for ln in out.stdout.splitlines() if ln.startswith("ROW ")]
        if out.returncode or not line:
            sys.stderr.write(out.stderr[-4000:])
            raise SystemExit(f"{setting}: the child process failed (rc {out.returncode})")
        _, name, seconds, kernels = line[-1].split()
        rows.append(dict(setting=name, layers=args.layers, context=args.context, codegen_s=float(seconds),
                         triton_kernels=int(kernels)))
        print(f"{name}: {float(seconds):.1f} s", flush=True)
    base = next((r["codegen_s"] for r in rows if r["setting"] == "bf16"), None)
    for r in rows:
        r["vs_bf16"] = r["codegen_s"] / base if base else float("nan")
    print(format_table(rows, COLUMNS))
    if args.out:
        os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
        print(f"wrote {write_csv(rows, args.out, COLUMNS)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
