"""Where does a batch-1 decode step's time go on the host? (GPU)

    python benchmarks/decode_step_host.py                          # bf16, affine-4, turbo-4 at 1 x 1K
    python benchmarks/decode_step_host.py --settings bf16 affine-8 --context 4096
    python benchmarks/decode_step_host.py --tiny --device cpu --context 16 --new-tokens 5   # smoke
    python benchmarks/decode_step_host.py --settings bf16 affine-4 --profile   # + cProfile per setting
    python benchmarks/decode_step_host.py --settings bf16 turbo-3 turbo-3/splits   # + one split per call off
    # settings compiled in parallel processes, then timed one process at a time:
    for s in affine-8 turbo-8; do python benchmarks/decode_step_host.py --settings bf16 $s --turns /tmp/turns 2 & done; wait

The ~1B Llama of ``tq bench`` (random bf16 weights, static cache, torch.compile default mode),
batch 1: a step is bound by the host launching kernels, so turboquant's per-step Python work
shows up directly in tokens/s. Per setting: milliseconds per decode step (``(t(1+n) − t(1)) / n``
of two greedy generates, as ``tq bench``; each of the two the least of ``--repeats`` interleaved
rounds), and the part of it spent in the model's forward, in AOTAutograd's unwrapping of the quantized cache's tensor
subclasses, and in the attention op's launcher (``templates.decode_attention.decode_attention``),
each timed with ``perf_counter`` around the call, and in Python's garbage collections.
``SETTING/splits``: SETTING's compiled model again, timed with the attention kernel's host-bound
plan off (``HOST_BOUND_KEY_ROWS = 0``: calls split as inside a CUDA graph, a merge launch more).
``vs_bf16`` compares those least times; ``vs_bf16_paired`` is the median over rounds of the two
settings' ratio within a round (robust to the host's speed drifting between rounds). ``kernel_launch_ms``:
the part of the launcher in the compiled kernel's launch call; ``--diagnose`` adds ``gpu_busy_calls``
(attention calls per step that found the GPU still busy); ``--trace`` writes a torch.profiler trace per
setting. Prints a table and writes CSV.
"""

import argparse
import collections
import contextlib
import fcntl
import functools
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import turboquant.templates.decode_attention as kernel  # noqa: E402
from turboquant.bench.e2e import E2E_ARCH, TINY_ARCH, build_model, compiled_setting  # noqa: E402
from turboquant.compat import dynamo_counters, wrap_aot_subclass_unwrap  # noqa: E402
from turboquant.demo import timed_generate  # noqa: E402
from turboquant.reporting import format_table, write_csv  # noqa: E402

COLUMNS = ["setting", "mode", "context", "ms_per_step", "vs_bf16", "vs_bf16_paired", "forward_ms", "aot_unwrap_ms",
           "attention_launch_ms", "kernel_launch_ms", "gc_ms", "gpu_busy_calls"]


def _timer(acc, name):
    def wrap(fn):
        @functools.wraps(fn)
        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                acc[name] += time.perf_counter() - t0
        return timed
    return wrap


PARTS = ("forward", "aot_unwrap", "attention_launch", "kernel_launch", "gc")


def _count_busy(acc, fn):
    """``fn`` that first counts, in ``acc["gpu_busy"]``, the calls that find the GPU still running earlier work
    (a stream query, ~1–2 µs: only with ``--diagnose``). A host-bound step finds it idle; a launcher
    whose time grows with its kernel's GPU time would find it busy."""
    @functools.wraps(fn)
    def counted(*args, **kwargs):
        acc["gpu_busy"] += not torch.cuda.current_stream().query()
        return fn(*args, **kwargs)
    return counted


def _time_gc(acc):
    """Time Python's garbage collections (a collection runs inside whichever call allocated past the
    threshold, so it lands in the parts above too). Returns a function that removes the timer."""
    import gc

    started = []

    def callback(phase, info):
        if phase == "start":
            started.append(time.perf_counter())
        elif started:
            acc["gc"] += time.perf_counter() - started.pop()

    gc.callbacks.append(callback)
    return lambda: gc.callbacks.remove(callback)


SPLITS = "/splits"


@contextlib.contextmanager
def _plans_of(setting: str, plan_caches: dict):
    """The attention kernel's plans as ``setting`` has them: for ``…/splits`` no host-bound single
    split, in a plan cache of its own (a plan holds its split count; the caches keep each variant's
    plans compiled across rounds)."""
    saved = kernel._PLANS, kernel.HOST_BOUND_KEY_ROWS
    kernel._PLANS = plan_caches.setdefault(setting.endswith(SPLITS), collections.OrderedDict())
    if setting.endswith(SPLITS):
        kernel.HOST_BOUND_KEY_ROWS = 0
    try:
        yield
    finally:
        kernel._PLANS, kernel.HOST_BOUND_KEY_ROWS = saved


def _per_step(prefill: dict, whole: dict, steps: int) -> dict:
    """Milliseconds per decode step: the whole generate's times less the prefill-only run's."""
    row = {"ms_per_step": 1e3 * (whole["wall"] - prefill["wall"]) / steps}
    for name in PARTS:
        row[f"{name}_ms"] = 1e3 * (whole.get(name, 0.0) - prefill.get(name, 0.0)) / steps
    row["gpu_busy_calls"] = (whole.get("gpu_busy", 0.0) - prefill.get("gpu_busy", 0.0)) / steps
    return row


def _time_triton_compiles(acc):
    """Time the Triton compiles made in this process: turboquant's kernels (Inductor compiles its
    own in worker processes). A kernel's binder picks up ``triton.compiler.compile`` on its first
    launch, so this must come before any. Returns a function that restores the original."""
    import triton.compiler

    original = triton.compiler.compile
    triton.compiler.compile = _timer(acc, "triton_jit")(original)

    def restore():
        triton.compiler.compile = original
    return restore


def _profile(model, ids, new_tokens, path, top=45, **kw):
    """cProfile of one whole generate, the functions by own time (the top ``top``, then turboquant's own),
    written to ``path``:
    where the host's time per step goes (cProfile slows Python calls, so only its proportions count)."""
    import cProfile
    import io
    import pstats

    prof = cProfile.Profile()
    prof.enable()
    timed_generate(model, ids, new_tokens, **kw)
    prof.disable()
    text = io.StringIO()
    stats = pstats.Stats(prof, stream=text).sort_stats("tottime")
    stats.print_stats(top)
    text.write("\nturboquant's functions:\n")
    stats.print_stats("turboquant", top)
    with open(path, "w") as f:
        f.write(text.getvalue())
    return path


@contextlib.contextmanager
def in_turn(turns):
    """With ``turns = (folder, n)``: wait until all ``n`` processes sharing ``folder`` have compiled,
    then hold the folder's lock while timing. Compiling is mostly the host's work and spreads over its
    cores, while the timings are host-bound and must run alone: so processes compile together and
    time in turn (device time is scarce; a 1B model compiles in 1–4 minutes per setting)."""
    if turns is None:
        yield
        return
    folder, n = turns[0], int(turns[1])
    os.makedirs(folder, exist_ok=True)
    open(os.path.join(folder, f"compiled-{os.getpid()}"), "w").close()
    while sum(name.startswith("compiled-") for name in os.listdir(folder)) < n:
        time.sleep(1.0)
    with open(os.path.join(folder, "lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def step_inputs(context: int, device: str, tiny: bool):
    """(the ~1B Llama of ``tq bench`` or the tiny test one, a batch-1 prompt of ``context`` tokens)."""
    arch = dict(TINY_ARCH if tiny else E2E_ARCH)
    base = build_model(arch, device, torch.bfloat16 if device == "cuda" else torch.float32)
    return base, torch.randint(0, arch["vocab_size"], (1, context), device=device)


def warm_up(model, ids, new_tokens: int, **kw) -> None:
    for n in (new_tokens, 1, new_tokens):  # compiles both cache lengths the measured calls use
        timed_generate(model, ids, n, **kw)


def add_step_arguments(p: argparse.ArgumentParser, settings: list, measured: str) -> None:
    """The options a batch-1 decode-step benchmark shares (``measured``: what processes do in turn)."""
    p.add_argument("--settings", nargs="+", default=settings)
    p.add_argument("--context", type=int, default=1024)
    p.add_argument("--new-tokens", type=int, default=33)
    p.add_argument("--device", default="cuda")
    p.add_argument("--tiny", action="store_true", help="the 2-layer test architecture (smoke runs)")
    p.add_argument("--turns", nargs=2, metavar=("FOLDER", "N"), default=None,
                   help=f"N processes sharing FOLDER (a new one per run: it counts the processes done "
                        f"compiling) compile together, then {measured} one at a time")
    p.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))


def cuda_missing(args) -> bool:
    if args.device == "cuda" and not torch.cuda.is_available():
        print("needs a CUDA GPU (or --device cpu for a smoke run)", file=sys.stderr)
        return True
    return False


def _paired_ratio(base_rounds, rounds) -> float:
    """The median over rounds of bf16's step time over the setting's in the same round. The host's speed
    drifts within a call (bf16 6.8 to 11.9 ms per step on one H200 host, 2026-12-05), and ``vs_bf16``
    (each side's least over all rounds) then compares a fast phase of one with a slow phase of the
    other; a round's two timings are seconds apart."""
    if not base_rounds:
        return float("nan")
    return statistics.median(b / t for b, t in zip(base_rounds, rounds))


def _trace(model, ids, new_tokens, path, **kw):
    """torch.profiler's trace of one whole generate, host and GPU (Chrome trace JSON, gzipped, at ``path``):
    when each launch starts and ends on the host against when its kernel runs."""
    import gzip
    import shutil

    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        timed_generate(model, ids, new_tokens, **kw)
    raw = path[: -len(".gz")]
    prof.export_chrome_trace(raw)
    with open(raw, "rb") as f, gzip.open(path, "wb") as g:
        shutil.copyfileobj(f, g)
    os.remove(raw)
    return path


def run(settings, context, new_tokens, device="cuda", tiny=False, repeats=3, mode=None, profile_dir=None, turns=None,
        diagnose=False, trace_dir=None):
    acc = collections.defaultdict(float)
    restore = wrap_aot_subclass_unwrap(_timer(acc, "aot_unwrap"))
    restore_triton = _time_triton_compiles(acc)
    restore_gc = _time_gc(acc)
    launcher, kernel_call = kernel.decode_attention, kernel._Launch.__call__
    kernel.decode_attention = _timer(acc, "attention_launch")(launcher)
    if diagnose:
        kernel.decode_attention = _count_busy(acc, kernel.decode_attention)
    kernel._Launch.__call__ = _timer(acc, "kernel_launch")(kernel_call)  # the compiled kernel's launch alone
    base, ids = step_inputs(context, device, tiny)
    kw = dict(cache_implementation="static")
    steps = new_tokens - 1
    models, best, per_round = {}, {}, {}
    plan_caches = {False: kernel._PLANS}  # the compiles' warm-ups made the default plans
    try:
        # every setting compiled first, then timed in interleaved rounds: the machine's host speed
        # drifts over minutes (bf16 6.2–11.2 ms per step across calls), so settings timed one after
        # another minutes apart compare the drift as much as the settings
        with torch._dynamo.config.patch(recompile_limit=16 * len(settings)):
            for setting in settings:
                if setting.endswith(SPLITS):
                    continue
                t0, jit0 = time.perf_counter(), acc["triton_jit"]
                model = compiled_setting(base, setting, mode)
                model.forward = _timer(acc, "forward")(model.forward)
                warm_up(model, ids, new_tokens, **kw)
                models[setting] = model
                # the rest of a compile is Dynamo's and Inductor's (H200: bf16 46 s; affine-3 152 s, of
                # which turboquant's Triton kernels 2.4 s)
                print(f"{setting}: compiled and warmed up in {time.perf_counter() - t0:.0f} s "
                      f"(turboquant's Triton kernels {acc['triton_jit'] - jit0:.1f} s)", flush=True)
            for setting in settings:
                if setting.endswith(SPLITS):
                    models[setting] = models[setting[: -len(SPLITS)]]
                    with _plans_of(setting, plan_caches):
                        warm_up(models[setting], ids, new_tokens, **kw)
            # host-bound timings only ever get slower by noise: each quantity's least over the rounds
            # counts, the prefill-only run's and the whole generate's apart (the least of their
            # difference would favour rounds whose prefill-only run was slowed)
            with in_turn(turns):
                for _ in range(repeats):
                    for setting, model in models.items():
                        with _plans_of(setting, plan_caches):
                            timed_generate(model, ids, 1, **kw)  # its graphs back at the front of Dynamo's caches
                            acc.clear()
                            _, _, t1 = timed_generate(model, ids, 1, **kw)  # the prefill alone
                            prefill = {"wall": t1, **acc}
                            acc.clear()
                            _, _, tn = timed_generate(model, ids, new_tokens, **kw)
                            whole = {"wall": tn, **acc}
                        least = best.setdefault(setting, {"prefill": {}, "whole": {}})
                        for run, times in (("prefill", prefill), ("whole", whole)):
                            for name in ("wall", *PARTS):
                                t = times.get(name, 0.0)
                                least[run][name] = min(least[run].get(name, t), t)
                        step_ms = _per_step(prefill, whole, steps)
                        per_round.setdefault(setting, []).append(step_ms["ms_per_step"])
                        print(f"{setting}: " + ", ".join(f"{k} {v:.3f}" for k, v in step_ms.items()), flush=True)
                for folder, name, record in ((profile_dir, "profile_{}.txt", _profile),
                                             (trace_dir, "trace_{}.json.gz", _trace)):
                    if not folder:
                        continue
                    os.makedirs(folder, exist_ok=True)
                    for setting, model in models.items():
                        path = os.path.join(folder, name.format(setting.replace("/", "_")))
                        with _plans_of(setting, plan_caches):
                            if record is _trace:
                                timed_generate(model, ids, new_tokens, **kw)  # its graphs back at the front
                            print(f"wrote {record(model, ids, new_tokens, path, **kw)}")
        skips = dynamo_counters()["inductor"]["cudagraph_skips"]
        print(f"CUDA-graph skips: {skips}" + (" (mode reduce-overhead)" if mode == "reduce-overhead" else ""), flush=True)
    finally:
        restore()
        restore_triton()
        restore_gc()
        kernel.decode_attention, kernel._Launch.__call__ = launcher, kernel_call
        models.clear()
        torch._dynamo.reset()
    rows = [{"setting": setting, "mode": mode or "default", "context": context, **_per_step(least["prefill"], least["whole"], steps)}
            for setting, least in best.items()]
    base_ms = next((r["ms_per_step"] for r in rows if r["setting"] == "bf16"), None)
    for r in rows:
        r["vs_bf16"] = base_ms / r["ms_per_step"] if base_ms else float("nan")
        r["vs_bf16_paired"] = _paired_ratio(per_round.get("bf16"), per_round[r["setting"]])
    return rows


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_step_arguments(p, ["bf16", "affine-4", "turbo-4"], "time")
    p.add_argument("--mode", default=None, choices=["default", "reduce-overhead", "max-autotune-no-cudagraphs"],
                   help="torch.compile mode of every setting (reduce-overhead: CUDA graphs)")
    p.add_argument("--repeats", type=int, default=3, help="interleaved timing rounds (each time's least counts)")
    p.add_argument("--profile", action="store_true",
                   help="after the rounds, a cProfile of one generate per setting (profile_<setting>.txt in --out, "
                        "/ as _)")
    p.add_argument("--diagnose", action="store_true",
                   help="count the attention calls that find the GPU still busy (gpu_busy_calls per step; adds a "
                        "stream query to each call)")
    p.add_argument("--trace", action="store_true",
                   help="after the rounds, a torch.profiler trace of one generate per setting "
                        "(trace_<setting>.json.gz in --out, / as _)")
    args = p.parse_args(argv)
    if cuda_missing(args):
        return 2
    rows = run(args.settings, args.context, args.new_tokens, args.device, args.tiny, args.repeats, args.mode,
               profile_dir=args.out if args.profile else None, turns=args.turns, diagnose=args.diagnose,
               trace_dir=args.out if args.trace else None)
    print(format_table(rows, COLUMNS))
    print(f"wrote {write_csv(rows, os.path.join(args.out, 'decode_step_host.csv'), COLUMNS)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
