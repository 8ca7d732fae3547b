"""Which kernels does a compiled decode step launch, layer by layer, per setting? (GPU, or CPU)

    python benchmarks/decode_step_launches.py --settings bf16 turbo-4 turbo-3      # CUDA: the code Inductor compiles
    python benchmarks/decode_step_launches.py --device cpu --settings turbo-4 turbo-3   # its Triton schedule on CPU

At batch 1 a decode step is bound by the host launching kernels (``decode_step_host.py``): a kernel
more per layer costs a 16-layer step ~0.2–0.3 ms (H200 host). Per setting this compiles the layers of
``tq bench``'s ~1B Llama (``--layers`` of them, a small vocabulary and MLP: neither changes a layer's
kernels) with a static cache of ``--cache-len`` keys, prefills 9 tokens and captures the generated
wrapper of the decode step: on CUDA the one Inductor compiles and runs, on the CPU Inductor's Triton
schedule of CPU tensors (``compat.triton_wrapper_code_on_cpu``; device-specific heuristics may differ
from a GPU's). Counts the Triton kernels the step launches, the buffers it allocates and its
attention calls; writes each setting's kernels (``launches_<setting>.txt``) and wrapper
(``wrapper_<setting>.py``), prints a table and writes CSV. Minutes on the CPU, about a minute per
setting on a GPU.
"""

import argparse
import os
import re
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from turboquant.bench.e2e import E2E_ARCH, build_model, compiled_setting  # noqa: E402
from turboquant.reporting import format_table, write_csv  # noqa: E402
from turboquant.testing import decode_step_wrapper, launched_kernels  # noqa: E402

COLUMNS = ["setting", "device", "layers", "cache_len", "launches", "launches_per_layer", "allocations",
           "attention_calls"]


def run(settings, device="cuda", layers=1, cache_len=1057, out="."):
    arch = dict(E2E_ARCH, num_hidden_layers=layers, vocab_size=1024, intermediate_size=2048)
    base = build_model(arch, device, torch.bfloat16)
    rows = []
    for setting in settings:
        torch._dynamo.reset()
        src = decode_step_wrapper(compiled_setting(base, setting), cache_len)  # compiles a copy of base
        kernels = launched_kernels(src)
        allocations = len(re.findall(r"\bempty_strided_(?:cuda|cpu)\(", src))
        rows.append({"setting": setting, "device": device, "layers": layers, "cache_len": cache_len,
                     "launches": len(kernels), "launches_per_layer": len(kernels) / layers,
                     "allocations": allocations, "attention_calls": src.count("turboquant_attention(")})
        with open(os.path.join(out, f"wrapper_{setting}.py"), "w") as f:
            f.write(src)
        with open(os.path.join(out, f"launches_{setting}.txt"), "w") as f:
            f.write("\n".join(kernels) + "\n")
        print(f"{setting}: {len(kernels)} launches, {allocations} allocations", flush=True)
    torch._dynamo.reset()
    return rows


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--settings", nargs="+", default=["bf16", "turbo-4", "turbo-3"])
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--layers", type=int, default=1)
    p.add_argument("--cache-len", type=int, default=1057, help="static cache length (1K prompt + 33 new tokens)")
    p.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    args = p.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("needs a CUDA GPU (or --device cpu: Inductor's Triton schedule on CPU tensors)", file=sys.stderr)
        return 2
    os.makedirs(args.out, exist_ok=True)
    rows = run(args.settings, args.device, args.layers, args.cache_len, args.out)
    print(format_table(rows, COLUMNS))
    print(f"wrote {write_csv(rows, os.path.join(args.out, 'decode_step_launches.csv'), COLUMNS)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
