"""Which kernels does a batch-1 decode step launch, and for how long? (GPU)

    python benchmarks/decode_step_kernels.py                                  # bf16, turbo-8 at 1 x 1K
    python benchmarks/decode_step_kernels.py --settings bf16 affine-4 turbo-4 --context 4096
    python benchmarks/decode_step_kernels.py --tiny --device cpu --context 16 --new-tokens 5   # smoke

The ~1B Llama of ``tq bench`` (random bf16 weights, static cache, torch.compile default mode), one
greedy generate per setting under ``torch.profiler``: the number of kernel launches and the GPU time
of the kernels, in all and per kernel (``kernels_<setting>.txt``: the top kernels by GPU time, then
the host's operators by own time). At batch 1 a step is bound by the host launching kernels
(``decode_step_host.py``), so the launch count is what a setting adds to a step's time; the kernel
times say whether the GPU could be the limit instead. Prints a table and writes CSV (on the CPU the
kernel columns are zero: a smoke run of the script).
``--turns FOLDER N``: as in ``decode_step_host.py`` (processes compile together, profile in turn).
"""

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from decode_step_host import add_step_arguments, cuda_missing, in_turn, step_inputs, warm_up  # noqa: E402
from turboquant.bench.e2e import compiled_setting  # noqa: E402
from turboquant.demo import timed_generate  # noqa: E402
from turboquant.reporting import format_table, write_csv  # noqa: E402

COLUMNS = ["setting", "context", "new_tokens", "launches", "launches_per_step", "kernel_ms", "kernel_ms_per_step"]


def _kernel_events(prof):
    return [e for e in prof.key_averages() if e.device_type != torch.autograd.DeviceType.CPU]


def run(settings, context, new_tokens, device="cuda", tiny=False, out=".", turns=None, top=40):
    from torch.profiler import ProfilerActivity, profile

    base, ids = step_inputs(context, device, tiny)
    kw = dict(cache_implementation="static")
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    models, rows = {}, []
    with torch._dynamo.config.patch(recompile_limit=16 * len(settings)):
        for setting in settings:
            model = compiled_setting(base, setting)
            warm_up(model, ids, new_tokens, **kw)
            models[setting] = model
            print(f"{setting}: compiled", flush=True)
        with in_turn(turns):
            for setting, model in models.items():
                counts = {}
                for n in (1, new_tokens):  # the prefill alone, then the whole generate: the steps are the difference
                    timed_generate(model, ids, n, **kw)  # its graphs back at the front of Dynamo's caches
                    with profile(activities=activities) as prof:
                        timed_generate(model, ids, n, **kw)
                    kernels = _kernel_events(prof)
                    counts[n] = (sum(e.count for e in kernels), sum(e.self_device_time_total for e in kernels) / 1e3)
                steps = new_tokens - 1
                launches, kernel_ms = counts[new_tokens]
                rows.append({"setting": setting, "context": context, "new_tokens": new_tokens, "launches": launches,
                             "launches_per_step": (launches - counts[1][0]) / steps, "kernel_ms": kernel_ms,
                             "kernel_ms_per_step": (kernel_ms - counts[1][1]) / steps})
                path = os.path.join(out, f"kernels_{setting}.txt")
                with open(path, "w") as f:
                    f.write(f"{setting}: {new_tokens}-token generate at 1 x {context}: {launches} launches, "
                            f"{kernel_ms:.2f} ms of kernels\n")
                    for e in sorted(kernels, key=lambda e: -e.self_device_time_total)[:top]:
                        f.write(f"{e.self_device_time_total / 1e3:9.3f} ms {e.count:6d}x {e.key[:160]}\n")
                    f.write("\nthe host's operators by own time:\n")
                    f.write(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=top,
                                                      max_name_column_width=90))
                print(f"{setting}: {launches} launches, {kernel_ms:.2f} ms of kernels; wrote {path}", flush=True)
    models.clear()
    torch._dynamo.reset()
    return rows


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_step_arguments(p, ["bf16", "turbo-8"], "profile")
    args = p.parse_args(argv)
    if cuda_missing(args):
        return 2
    os.makedirs(args.out, exist_ok=True)
    rows = run(args.settings, args.context, args.new_tokens, args.device, args.tiny, args.out, args.turns)
    print(format_table(rows, COLUMNS))
    print(f"wrote {write_csv(rows, os.path.join(args.out, 'decode_step_kernels.csv'), COLUMNS)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
