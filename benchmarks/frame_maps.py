"""Do full key maps beat diagonal ones, and by more than turbo's rotation seed moves? (a probe, CPU)

    python benchmarks/frame_maps.py                                       # turbo-4, seeds 0-3, 32 windows
    python benchmarks/frame_maps.py --configs turbo-4 turbo-3 --seeds 0 --chunk 1 --max-windows 24

Calibrated frames (``turboquant.calibrate``; docs/design.md "Calibrated K/V frames") map each
head's keys by F before quantizing: a per-channel scale (``key_map="diagonal"``) or the full
matrix that minimises the modelled score error (``"full"``). This probe measures both against no
frame on the reference model, over several rotation seeds of turbo (a seed changes which keys the
rotation happens to serve well, and moves a 32-window perplexity change by tenths of a point).

The reference model's perplexity (``tq eval`` protocol, held-out windows; one forward per window,
or decode steps with ``--chunk 1``) with transformers' ``DynamicLayer.update`` wrapped so that the
cache holds each write framed, quantized and decoded by the oracle (``quantize_kv`` →
``dequantize_kv``), then unframed. Frames come from 8 windows of training text (``--calibration``).
Prints a table of perplexity changes (one column per variant, a mean row per config) and writes CSV.
"""

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

VARIANTS = ("plain", "diagonal", "full")


def perplexity(model, config, frames, max_windows, chunk):
    """Held-out perplexity with every cache write passed through the oracle (in ``frames``' frame)."""
    from kv_smoothing import rewritten_perplexity  # this folder: the shared DynamicLayer.update wrapper

    from turboquant.calibration import frame_rows, unframe_rows
    from turboquant.quant import dequantize_kv, quantize_kv

    def fake(x, role, frame):
        y = x.float() if frame is None else frame_rows(x, frame)
        y = dequantize_kv(quantize_kv(y.contiguous(), config, role=role), torch.float32)
        return (y if frame is None else unframe_rows(y, frame)).to(x.dtype)

    def rewrite(layer, k, v):
        if config is None:
            return k, v
        return (fake(k, "k", None if frames is None else frames.frame(layer, "k")),
                fake(v, "v", None if frames is None else frames.frame(layer, "v")))

    return rewritten_perplexity(rewrite, max_windows, model=model, chunk=chunk, batch_size=8)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--configs", nargs="+", default=["turbo-4"], help="tq eval configuration names (no -f/-s)")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3], help="turbo rotation seeds")
    p.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    p.add_argument("--max-windows", type=int, default=32)
    p.add_argument("--chunk", type=int, default=0, help="0: one forward per window; 1: decode steps")
    p.add_argument("--calibration", type=int, default=8, help="windows of training text the frames come from")
    p.add_argument("--csv", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results",
                                                 "frame_maps.csv"))
    args = p.parse_args(argv)

    import turboquant
    from turboquant.eval.configs import parse_config
    from turboquant.eval.corpus import calibration_windows
    from turboquant.eval.run import REFERENCE_MODEL, load_model
    from turboquant.reporting import format_table, write_csv

    model = load_model(REFERENCE_MODEL, torch.device("cpu"), torch.float32)
    ids = calibration_windows(None, args.calibration, 1024)
    frames = {"plain": None}
    for key_map in ("diagonal", "full"):
        frames[key_map] = turboquant.calibrate(model, ids, key_map=key_map)
    base = perplexity(model, None, None, args.max_windows, args.chunk)
    rows = []
    for spec in args.configs:
        per_seed = []
        for seed in args.seeds:
            name = f"{spec}-s{seed}" if spec.startswith("turbo") else spec
            config = parse_config(name).kv_config()
            row = {"config": name}
            for variant in args.variants:
                ppl = perplexity(model, config, frames[variant], args.max_windows, args.chunk)
                row[variant] = round(100 * (ppl / base - 1), 3)
                print(f"{name} {variant}: {row[variant]:+.2f}%", file=sys.stderr, flush=True)
            per_seed.append(row)
            if not spec.startswith("turbo"):
                break  # affine has no rotation
        mean = {"config": f"{spec} mean"}
        mean.update({v: round(sum(r[v] for r in per_seed) / len(per_seed), 3) for v in args.variants})
        rows += per_seed + ([mean] if len(per_seed) > 1 else [])
    protocol = "decode steps" if args.chunk == 1 else "one forward" if not args.chunk else f"chunks of {args.chunk}"
    print(f"perplexity change in % against the unquantized model (ppl {base:.4f}); {args.max_windows} held-out "
          f"windows, {protocol}; frames from {args.calibration} windows of training text")
    print(format_table(rows, ["config", *args.variants]))
    if args.csv:
        print(f"wrote {write_csv(rows, args.csv, ['config', *args.variants])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
