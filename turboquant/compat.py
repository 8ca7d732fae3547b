"""Every private torch / Inductor API turboquant uses, in one place (torch >= 2.11)."""

from __future__ import annotations

import contextlib
import functools

import torch

__all__ = ["inductor_compile", "exact_casts", "dynamo_counters", "run_and_get_code", "tracing_with_fake_tensors",
           "real_tolist", "real_tensor_mode", "mark_static_address", "triton_wrapper_code_on_cpu", "triton_schedule_runs_on_cpu",
           "schedules_with_triton",
           "current_raw_stream", "custom_graph_pass_base", "source_hash", "wrap_aot_subclass_unwrap",
           "call_directly_from_inductor", "dense_compile_context"]


def dynamo_counters():
    """``torch._dynamo.utils.counters``: a defaultdict of Counters, reset by ``torch._dynamo.reset``."""
    from torch._dynamo.utils import counters

    return counters


def inductor_compile(gm, example_inputs, mode=None, post_grad_pass=None):
    """Compile a Dynamo graph with Inductor as ``torch.compile(mode=...)`` would; ``post_grad_pass``
    (a :func:`custom_graph_pass_base` instance) runs first on the post-grad graph, unless the
    caller's configuration already names a pass there."""
    from torch._inductor.compile_fx import compile_fx

    patches = {}
    if mode not in (None, "default"):
        patches = dict(torch._inductor.list_mode_options(mode))
    patches.update(_eager_numerics())
    patches.update(_inlining())
    patches.update(_cpp_bounds_asserts({t.device.type for t in example_inputs if isinstance(t, torch.Tensor)}))
    if post_grad_pass is not None and torch._inductor.config.post_grad_custom_pre_pass is None:
        patches["post_grad_custom_pre_pass"] = post_grad_pass
    return compile_fx(gm, example_inputs, config_patches=patches)


def _eager_numerics() -> dict:
    """Inductor settings under which a compiled cache write encodes as eager does, bit for bit."""
    # keep the fp16 round trip of scales/zeros: without it compiled codes differ from the oracle's
    # by one step where a value sits on a rounding boundary (seen on torch 2.11)
    patches = {"emulate_precision_casts": True}
    _cpp_casts_round_under_emulation()
    # Triton's fp32 x / y is div.full (approximate): a value on a rounding boundary then takes
    # the other code; eager divides correctly rounded (div_rn)
    config = torch._inductor.config
    if hasattr(config, "eager_numerics") and hasattr(config.eager_numerics, "division_rounding"):
        patches["eager_numerics.division_rounding"] = True
    elif hasattr(config, "emulate_divison_rounding"):  # older spelling
        patches["emulate_divison_rounding"] = True
    return patches


def _cpp_casts_round_under_emulation() -> None:
    """torch < 2.13: the C++ codegen rounds a float32 -> fp16/bf16 -> float32 round trip under
    ``emulate_precision_casts``, as 2.13 does (pytorch#185337). Before 2.13 every such cast put the reverse
    conversion in the kernel's CSE cache, so the round trip gave back the unrounded float32 value even with the
    flag set: compiled CPU scales skipped their fp16 rounding (and ``to_metadata``'s round-up), and codes came out a
    step off the eager encoding's (seen on torch 2.11: affine codes of whole rows off by one). Graphs compiled
    without the flag keep the cache."""
    if torch.torch_version.TorchVersion(torch.__version__) >= (2, 13):
        return
    from torch._inductor.codegen.cpp import CppKernel

    cache = CppKernel.cache_dtype_convert
    if getattr(cache, "turboquant_backport", False):
        return

    @functools.wraps(cache)
    def cache_dtype_convert(self, *args, **kwargs):
        if not torch._inductor.config.emulate_precision_casts:
            cache(self, *args, **kwargs)

    cache_dtype_convert.turboquant_backport = True
    CppKernel.cache_dtype_convert = cache_dtype_convert


def _cpp_bounds_asserts(devices) -> dict:
    """Inductor's indirect-indexing bounds asserts turned off for a CPU graph on torch < 2.13. Before 2.13 the
    C++ codegen may put such an assert in a kernel's loads while the index it checks is a vector that the
    kernel's compute section declares below it (2.13's ``CppKernel.check_bounds`` falls back to compute), and
    g++ stops: "'tmp2' was not declared in this scope". Seen on torch 2.11 with transformers 5.17: the tiny
    Llama's generate, in the kernel that builds the attention mask (an arange over the KV positions, and the
    padding mask read at them). Plain torch.compile of that model built there, but not with the bench's
    20-token prompt (``tq bench --cache dynamic``, fifty-fifth session): the dense baseline compiles under the
    same rule (:func:`dense_compile_context`). Only the asserts go: an index out of range would read out of
    bounds rather than raise. ``devices``: the device types of the graph's tensors."""
    if torch.torch_version.TorchVersion(torch.__version__) >= (2, 13):
        return {}
    return {"assert_indirect_indexing": False} if set(devices) == {"cpu"} else {}


def dense_compile_context(device):
    """The Inductor settings a dense baseline (``turboquant.demo.compiled_baseline``) runs its compiled calls
    under, as a context manager: :func:`_cpp_bounds_asserts` for a model on ``device``, so that the baseline
    builds wherever turboquant's own graphs of the model do. A no-op on torch >= 2.13 and off the CPU. The
    context may be entered again after each exit (one per model, entered every call)."""
    patches = _cpp_bounds_asserts({torch.device(device).type})
    return torch._inductor.config.patch(patches) if patches else contextlib.nullcontext()


# Ops a pointwise expression may hold and still be inlined into its users (Inductor's GPU default: 30)
INLINE_OPCOUNT = 64


def _inlining() -> dict:
    """Inductor's op count past which a pointwise value is stored rather than inlined, raised for the graphs
    turboquant compiles. A K cache write's expression holds the model's RoPE, and with :func:`_eager_numerics`'
    emulated casts and the write's finiteness test that is some 35 ops: past the GPU's 30, so Inductor
    stored pieces of it (RoPE's rotate-half term, the finiteness mask) with a pointwise kernel of its own,
    which K's write read back. H200, 1B Llama decode step, Triton launches per layer, 30 → 64: turbo-4 and
    turbo-3 13 → 12, affine-4 and affine-3 12 → 11 (bf16 13; benchmarks/RESULTS.md, thirty-fifth session).
    An option set by the caller wins."""
    cfg = torch._inductor.config
    name, default = _REALIZE_THRESHOLDS[0]
    if not hasattr(cfg, name):
        return {}
    # None: per device (newer torch); torch 2.11 holds the GPU's 30 itself, with no default beside it
    if getattr(cfg, name) in (None, getattr(cfg, default, 30)):
        return {name: INLINE_OPCOUNT}
    return {}


def exact_casts():
    """Context in which plain ``torch.compile`` encodes as turboquant's backend does (eager numerics)."""
    return torch._inductor.config.patch(_eager_numerics())


def run_and_get_code(fn, *args, **kwargs):
    """(result, [generated source, ...]) of a compiled call (Inductor's test utility)."""
    from torch._inductor.utils import run_and_get_code as _run

    return _run(fn, *args, **kwargs)


def tracing_with_fake_tensors() -> bool:
    """True while AOTAutograd/Inductor trace with fake tensors (real constants must be rebuilt)."""
    from torch._guards import detect_fake_mode

    return detect_fake_mode() is not None


def current_proxy_mode():
    """The proxy mode recording the graph being traced (make_fx, AOTAutograd), or None."""
    from torch.fx.experimental.proxy_tensor import get_proxy_mode

    return get_proxy_mode()


def real_tolist(t):
    """``t.tolist()`` for a real tensor, also while a fake-tensor mode is active."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    with unset_fake_temporarily():
        return t.tolist()


def real_tensor_mode():
    """A context in which tensors are real even while a fake-tensor mode is active."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    return unset_fake_temporarily()


def mark_static_address(t: torch.Tensor) -> None:
    """Tell Dynamo (and CUDA graph trees) that ``t`` keeps its address across calls, as
    transformers does for a static cache's tensors: a graph that writes it in place is then
    recorded instead of skipped."""
    torch._dynamo.mark_static_address(t)


def _triton_schedule_on_cpu(stack, kernel, wrapper) -> None:
    """Patches (entered on ``stack``) under which Inductor schedules CPU tensors with its Triton backend
    on a machine without a Triton device: ``cpu_backend="triton"``, no FX graph cache, Triton's backend
    queries answered. ``kernel(name, source)`` stands in for compiling a kernel; ``wrapper(source,
    path, attrs)`` for loading the wrapper module (the one with ``call``; ``attrs``: the graph's
    constants, which the loader sets on it)."""
    from unittest import mock

    import torch.utils._triton as triton_utils
    from torch._inductor import async_compile, codecache, scheduler

    load = codecache.PyCodeCache.load_by_key_path.__func__

    def load_hooked(cls, key, path, *args, **kwargs):
        with open(path) as f:
            src = f.read()
        if "def call(" not in src:
            return load(cls, key, path, *args, **kwargs)
        return wrapper(src, path, kwargs.get("attrs", args[1] if len(args) > 1 else None) or {})

    stack.enter_context(torch._inductor.config.patch(cpu_backend="triton", fx_graph_cache=False,
                                                     **_gpu_realize_thresholds()))
    stack.enter_context(mock.patch.object(triton_utils, "triton_hash_with_backend", lambda: "cpu-schedule"))
    stack.enter_context(mock.patch.object(triton_utils, "triton_backend", lambda: None))
    stack.enter_context(mock.patch.object(async_compile.AsyncCompile, "triton",
                                          lambda self, name, src, *a, **k: kernel(name, src)))
    stack.enter_context(mock.patch.object(codecache.PyCodeCache, "load_by_key_path", classmethod(load_hooked)))
    stack.enter_context(mock.patch.object(scheduler, "is_gpu", _gpu_scheduling_decisions(scheduler.is_gpu)))


# Inductor's scheduler functions that decide for GPU nodes otherwise than for CPU ones, in ways that
# change what fuses: a GPU node's dependencies stay unnormalised (loop ordering after fusion) and
# its loops merge after fusion. With CPU decisions, a 3-bit turbo cache's K and V stores fused on the
# CPU schedule and not on the H200, whose step launched a kernel per layer more (2026-12-05).
_GPU_DECIDERS = ("_compute_attrs", "merge_loops")


# (Inductor's realize threshold option, its GPU default): None in the option means per device
_REALIZE_THRESHOLDS = (("realize_opcount_threshold", "_realize_opcount_threshold_default"),
                       ("realize_acc_reads_threshold", "_realize_acc_reads_threshold_default"))


def _gpu_realize_thresholds() -> dict:
    """Inductor's thresholds for storing a pointwise value rather than inlining it into its users, at
    their GPU values for every device. Newer torch gives CPU nodes higher ones (more ops, more reads
    accumulated: ``realize_cpu_opcount_threshold``, ``realize_cpu_acc_reads_threshold``), and a value
    realized on the GPU but inlined on the CPU changes what fuses: turbo-3's packed bytes, reading 12
    buffers (four slot codes, a shift table twice per slot) past the GPU's 8, were a buffer of their own
    on an H100 and their store a kernel of its own, where the CPU schedule inlined them. An explicit
    threshold overrides the per-device ones."""
    cfg = torch._inductor.config
    return {name: getattr(cfg, default) for name, default in _REALIZE_THRESHOLDS
            if hasattr(cfg, name) and getattr(cfg, name) is None and hasattr(cfg, default)}


def _gpu_scheduling_decisions(is_gpu):
    """``is_gpu`` (the scheduler's) that answers True for the CPU where :data:`_GPU_DECIDERS` ask, as
    directly or through a node's ``is_gpu()``; elsewhere (which backend to create, runtime estimates)
    the CPU stays the CPU."""
    import sys

    def gpu_decisions(device_type) -> bool:
        if device_type == "cpu":
            frame = sys._getframe(1)
            if frame.f_code.co_name == "is_gpu":
                frame = frame.f_back
            if frame is not None and frame.f_code.co_name in _GPU_DECIDERS:
                return True
        return is_gpu(device_type)

    return gpu_decisions


def triton_wrapper_code_on_cpu(fn, *args, **kwargs) -> str:
    """The wrapper source that Inductor's Triton backend generates for ``fn(*args)`` on CPU tensors.

    No kernel is compiled or run (no GPU needed): Inductor schedules and fuses with its Triton
    rules (``cpu_backend="triton"``), kernel compilation is stubbed out and the call stops where
    the wrapper module would load. For tests of what a CUDA graph's kernels would be on a machine
    without one (the same scheduler and fusion rules; device-specific tuning aside).
    """
    import contextlib

    caught = []

    def catch(src, path, attrs):
        caught.append(src)
        raise RuntimeError("turboquant: wrapper source caught (codegen only)")

    with contextlib.ExitStack() as stack:
        _triton_schedule_on_cpu(stack, lambda name, src: None, catch)
        try:
            fn(*args, **kwargs)
        except Exception:
            if not caught:
                raise
    if not caught:
        raise RuntimeError("turboquant: the call compiled no new graph (it was cached or ran eagerly)")
    return caught[-1]


class _InterpretedLaunch:
    """What Inductor's wrapper calls a Triton kernel through (``kernel.run(*args, stream=...)``), for a
    kernel the Triton interpreter runs: one config chosen here in place of autotuning (blocks as large
    as the interpreter runs fast: it runs a program's block as numpy arrays), the grid over x (and y)."""

    def __init__(self, fn):
        import inspect

        self.fn = fn
        params = inspect.signature(fn.fn).parameters
        self.runtime = [n for n, p in params.items() if "constexpr" not in str(p.annotation)]
        self.blocks = {n for n, p in params.items() if "constexpr" in str(p.annotation)}

    def run(self, *args, stream=None, **kwargs):
        import triton

        numel = {n: int(v) for n, v in zip(self.runtime, args) if n.endswith("numel")}
        pow2 = lambda n, cap: triton.next_power_of_2(max(1, min(n, cap)))  # noqa: E731
        cfg = {}
        if "R0_BLOCK" in self.blocks:  # a looped reduction
            cfg["R0_BLOCK"] = pow2(numel.get("r0_numel", 1), 256)
        if "YBLOCK" in self.blocks:  # a 2-D tiled pointwise kernel
            cfg["YBLOCK"] = pow2(numel.get("ynumel", 1), 32)
        if "XBLOCK" in self.blocks:  # rows of a 2-D block stay few; a 1-D block takes up to 1024
            cfg["XBLOCK"] = pow2(numel.get("xnumel", 1), 32 if cfg else 1024)
        grid = (triton.cdiv(numel.get("xnumel", 1), cfg.get("XBLOCK", 1)),
                triton.cdiv(numel.get("ynumel", 1), cfg.get("YBLOCK", 1)))
        self.fn[grid](*args, **cfg)


def triton_schedule_runs_on_cpu():
    """Context in which ``torch.compile`` on CPU tensors runs Inductor's **Triton** kernels through the
    Triton interpreter (``TRITON_INTERPRET=1`` before Triton is first imported; no GPU needed).

    The scheduling, fusion and kernel source are what a GPU gets (the rules of
    :func:`triton_wrapper_code_on_cpu`); the kernels then run under the interpreter with one block
    configuration instead of autotuned ones. For tests of the numbers a CUDA graph's generated kernels
    compute (the cache writes' fused expressions), on a machine without a GPU. ``libdevice`` calls go
    to :mod:`turboquant.templates.interpreter_libdevice`. Not covered: looped reductions (a runtime
    bound of ``range``, which numpy 2.4 refuses as the interpreter hands it over; a cache write's
    reductions are over one row, persistent) and kernel kinds other than pointwise and reductions."""
    import contextlib
    import importlib.util
    import itertools
    import os
    import tempfile
    import types
    from unittest import mock

    from torch._inductor.runtime import triton_heuristics

    from .templates.interpreter_libdevice import InterpreterLibdevice

    if os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError("triton_schedule_runs_on_cpu needs TRITON_INTERPRET=1 set before Triton is imported")
    folder, numbers = tempfile.mkdtemp(prefix="tq_triton_on_cpu_"), itertools.count()

    def kernel(name, src):
        # from a file: Triton's JIT reads the kernel's source back through inspect
        path = os.path.join(folder, f"k{next(numbers)}.py")
        with open(path, "w") as f:
            f.write(src)
        spec = importlib.util.spec_from_file_location(f"tq_triton_on_cpu_{os.path.basename(path)[:-3]}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        if hasattr(module, "libdevice"):  # its functions resolve on GPU backends only
            module.libdevice = InterpreterLibdevice()
        return getattr(module, name)

    def wrapper(src, path, attrs):
        module = types.ModuleType(f"tq_triton_on_cpu_{os.path.basename(path)[:-3]}")
        module.__file__ = path
        exec(compile(src, path, "exec"), module.__dict__)
        for name, value in attrs.items():
            setattr(module, name, value)
        return module

    stack = contextlib.ExitStack()
    _triton_schedule_on_cpu(stack, kernel, wrapper)
    for kind in ("pointwise", "reduction", "persistent_reduction"):
        stack.enter_context(mock.patch.object(triton_heuristics, kind, lambda *a, **k: _InterpretedLaunch))
    return stack


def schedules_with_triton(t: torch.Tensor) -> bool:
    """Whether Inductor generates Triton kernels for tensors on ``t``'s device (every GPU; the CPU
    only with ``cpu_backend="triton"``)."""
    return t.device.type != "cpu" or torch._inductor.config.cpu_backend == "triton"


def current_raw_stream(device_index: int) -> int:
    """The current CUDA stream's handle on ``device_index`` (what Triton's launcher takes), without
    building a ``torch.cuda.Stream`` object: a batch-1 decode step asks once per layer."""
    return torch._C._cuda_getCurrentRawStream(device_index)


_EMPTY_STRIDED_CUDA = getattr(torch._C._dynamo.guards, "_empty_strided_cuda", None)  # None in CPU-only builds


def empty_cuda(size: tuple, stride: tuple, dtype: torch.dtype, device_index: int) -> torch.Tensor:
    """An uninitialised tensor of ``size``/``stride`` on CUDA device ``device_index`` (on the CPU for
    a negative index, as ``Tensor.get_device`` gives), allocated as Inductor's wrappers allocate their
    buffers: one C call to the caching allocator, no argument parser or dispatcher (``Tensor.new_empty``'s;
    a batch-1 decode step allocates once per layer). That call takes the current device, so another
    device goes the ordinary way."""
    if device_index < 0:
        return torch.empty_strided(size, stride, dtype=dtype)
    if _EMPTY_STRIDED_CUDA is not None and device_index == torch._C._cuda_getDevice():
        return _EMPTY_STRIDED_CUDA(size, stride, dtype)
    return torch.empty_strided(size, stride, dtype=dtype, device=torch.device("cuda", device_index))


# Triton's scalar types as torch's C++ launcher for Triton kernels spells them (fp16/bf16 scalars left
# out: the launcher passes every float as fp32)
_STATIC_ARG_TYPES = {"i1": "i", "i8": "b", "i16": "h", "i32": "i", "i64": "l", "u1": "I", "u8": "B", "u16": "H",
                     "u32": "I", "u64": "K", "fp32": "f", "f32": "f", "fp64": "d"}


def static_launch_signature(kernel, n_pointers: int):
    """``(tail_indices, arg_types)`` of Triton's compiled ``kernel`` for torch's C++ launcher of Triton
    kernels: the positions, among the arguments after the first ``n_pointers`` (pointers, all taken at
    run time), of the ones the compiled kernel takes at run time (constexprs and JIT-specialised values
    are compiled in), and the launcher's type string of the run-time arguments and the two scratch
    pointers Triton's kernels end with. None where a run-time argument has a type it does not pass."""
    names = kernel.src.fn.arg_names

    def index(key):  # Triton keys its signature by name, its constants by (index,) tuples
        return names.index(key) if isinstance(key, str) else key[0] if isinstance(key, tuple) else key

    signature = {index(k): t for k, t in kernel.src.signature.items()}
    constants = {index(k) for k in getattr(kernel.src, "constants", {})}
    runtime, types = [], []
    for i in sorted(signature):
        t = signature[i]
        if t == "constexpr" or i in constants:
            continue
        if not t.startswith("*") and t not in _STATIC_ARG_TYPES:
            return None
        runtime.append(i)
        types.append("O" if t.startswith("*") else _STATIC_ARG_TYPES[t])
    if runtime[:n_pointers] != list(range(n_pointers)) or any(t != "O" for t in types[:n_pointers]):
        return None
    scratch = sum(hasattr(kernel.metadata, n) for n in ("global_scratch_size", "profile_scratch_size"))
    return tuple(i - n_pointers for i in runtime[n_pointers:]), "".join(types) + "O" * scratch


def static_cuda_launch(kernel, n_pointers: int, min_shared: int = 0):
    """A launch of Triton's compiled ``kernel`` by torch's C++ launcher for Triton kernels (the one
    Inductor launches its own kernels with): one C call with the kernel's run-time arguments only, where
    Triton's launcher runs a Python frame and parses every argument, constexprs included (a batch-1
    decode step launches once per layer, host-bound).

    Returns ``(tail_indices, launch)`` (:func:`static_launch_signature`'s indices) with
    ``launch(grid, stream, args)``, ``args`` the pointers (integers) and the run-time values after them;
    or None where this torch has no such launcher (CPU builds) or the kernel needs what it does not do
    (clusters, cooperative or programmatic-dependent launches, scratch memory). ``min_shared``: launch with at
    least this many bytes of shared memory (fewer programs then fit a multiprocessor; at most 48 KB, past which
    the kernel's limit would have to be raised)."""
    launcher = getattr(torch._C, "_StaticCudaLauncher", None)
    md = kernel.metadata
    if (launcher is None or getattr(md, "num_ctas", 1) != 1 or getattr(md, "launch_cooperative_grid", False)
            or getattr(md, "launch_pdl", False) or getattr(md, "global_scratch_size", 0)
            or getattr(md, "profile_scratch_size", 0)):
        return None
    signature = static_launch_signature(kernel, n_pointers)
    if signature is None:
        return None
    tail_indices, arg_types = signature
    scratch = (None,) * (len(arg_types) - n_pointers - len(tail_indices))  # null scratch pointers
    kernel.run  # noqa: B018 -- loads the module: ``function`` is its handle
    function, warps, launch_kernel = kernel.function, md.num_warps, launcher._launch_kernel
    shared = max(md.shared, min_shared)

    def launch(grid, stream, args):
        launch_kernel(function, grid[0], grid[1], grid[2], warps, shared, arg_types, args + scratch, stream)

    return tail_indices, launch


def custom_graph_pass_base():
    """Inductor's ``CustomGraphPass`` (a pass with a ``uuid()``, so the FX graph cache can key on it)."""
    from torch._inductor.custom_graph_pass import CustomGraphPass

    return CustomGraphPass


def source_hash(*paths: str) -> bytes:
    """A hash of source files, as Inductor keys custom passes."""
    from torch._inductor.custom_graph_pass import get_hash_for_files

    return get_hash_for_files(paths)


def wrap_aot_subclass_unwrap(wrap):
    """Replace AOTAutograd's runtime unwrapping of tensor-subclass inputs by ``wrap(original)`` (for
    timing it: torch 2.11 unwraps in Python on every call; later versions generate the code and
    may not call it). Returns a function that restores the original."""
    from torch._functorch._aot_autograd import runtime_wrappers, subclass_utils

    original = subclass_utils.runtime_unwrap_tensor_subclasses
    wrapped = wrap(original)
    modules = [m for m in (subclass_utils, runtime_wrappers) if hasattr(m, "runtime_unwrap_tensor_subclasses")]
    for m in modules:
        m.runtime_unwrap_tensor_subclasses = wrapped

    def restore():
        for m in modules:
            m.runtime_unwrap_tensor_subclasses = original

    return restore


def call_directly_from_inductor(op, name: str, fn) -> bool:
    """Have Inductor's Python wrapper call ``fn`` where it would call the custom op ``op`` (an
    ``OpOverload``) through the dispatcher: ``name(...)`` with the arguments the op call would get,
    ``fn`` imported under ``name`` in the wrapper's header. The dispatcher's boxing of a Python
    kernel's ~20 arguments into IValues and back cost ~20 µs per call on the H200's host, and a
    batch-1 decode step outside a CUDA graph is host-bound and calls the op once per layer.

    The op keeps the fallback Inductor would have made for it (the same layout constraint from its
    tags); only the name the wrapper calls changes. The wrapper imports ``fn`` itself, so its source
    runs the same when it comes from the FX graph cache into a process that never called this. The
    C++ wrapper keeps the op. Idempotent; returns whether the lowering is in place (False where this
    torch's Inductor lacks a piece: the op is then called through the dispatcher as before)."""
    try:
        from torch._inductor import ir
        from torch._inductor.lowering import lowerings, make_fallback, tag_to_layout_constraint
        from torch._inductor.virtualized import V
        from torch._library.utils import get_layout_constraint_tag
    except ImportError:
        return False
    if getattr(lowerings.get(op), "_turboquant_direct", None) == name:
        return True
    make_fallback(op, layout_constraint=tag_to_layout_constraint(get_layout_constraint_tag(op, with_default=True)),
                  warn=False, override_decomp=True)
    fallback = lowerings[op]
    import_line = f"from {fn.__module__} import {fn.__qualname__} as {name}"

    def lower(*args, **kwargs):
        before = len(V.graph.operations)
        out = fallback(*args, **kwargs)
        if not V.graph.cpp_wrapper:
            for node in V.graph.operations[before:]:
                if isinstance(node, ir.FallbackKernel) and node.op_overload is op:
                    node.python_kernel_name = name
                    node.codegen = functools.partial(_codegen_with_import, node.codegen, import_line)
        return out

    lower.__dict__.update(fallback.__dict__)  # e.g. the flag that marks a fallback handler
    lower._turboquant_direct = name
    lowerings[op] = lower
    return True


def _codegen_with_import(codegen, import_line: str, wrapper):
    wrapper.add_import_once(import_line)
    return codegen(wrapper)
