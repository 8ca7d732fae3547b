"""Cached numeric tables (rotations, codebooks) as tensors on the caller's device."""

from __future__ import annotations

import functools
import threading
import weakref
from typing import Callable, Optional

import torch

from ..compat import current_proxy_mode, real_tolist, real_tensor_mode, tracing_with_fake_tensors

__all__ = ["as_constant"]


def as_constant(table_fn: Callable[..., torch.Tensor], *key, device=None, dtype=None) -> torch.Tensor:
    """The table ``table_fn(*key)`` on ``device``/``dtype``: built once on the CPU, copied once per
    device and dtype, the same tensor object for every call after the first (a kernel launch plan
    made while a CUDA graph is captured finds the copy made before; a copy or an allocation inside
    the capture would fail or land in the graph's memory pool).

    Under Dynamo the table is one constant of the graph: Dynamo must not trace ``table_fn``
    itself (it ignores ``lru_cache`` and would re-run the table's construction, seeded
    generators included, and break the graph). While AOTAutograd/Inductor trace with fake
    tensors (a tensor subclass's dispatch) a real tensor cannot be moved, so the table is
    rebuilt from Python numbers and becomes a constant of the compiled graph: one constant per table
    and graph, however many cache writes read it (:func:`_traced_table`).
    """
    if torch.compiler.is_dynamo_compiling():  # True only in Dynamo's symbolic trace
        # computed on (× 1, exact): two constant results used as they are make AOTAutograd see one
        # source ("_graph_constant") lifted twice
        return _graph_constant(table_fn, key, _device_name(device), dtype) * 1
    table = _cpu_table(table_fn, key)
    if tracing_with_fake_tensors():
        return _traced_table(table, (table_fn, key, _device_name(device), dtype), device, dtype or table.dtype)
    return _on_device(table, device, dtype)


def _device_name(device) -> Optional[str]:
    return None if device is None else str(torch.device(device))


def _traced_table(table: torch.Tensor, memo_key: tuple, device, dtype) -> torch.Tensor:
    """The table as a constant of the graph being traced, the same traced tensor for every read of it
    in that graph. Two reads of one table (K's and V's writes of a layer) then read one buffer, which
    Inductor's scheduler needs before it fuses two kernels that do not feed each other (it fuses such
    a pair only where they read common memory): a layer's K and V turbo rotations become one kernel
    and their stores another, as do 3-bit stores (decode step of an HF Llama, CPU Triton schedule:
    turbo-4 15 → 13 kernels, affine-3 13 → 12). Outside a graph's tracing (a fake-tensor pass that
    records nothing) each read makes its own."""
    mode = current_proxy_mode()
    memo = {} if mode is None else _TRACED.setdefault(mode, {})
    if memo_key not in memo:
        memo[memo_key] = torch.tensor(real_tolist(table), device=device, dtype=dtype)
    return memo[memo_key]


_TRACED: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # proxy mode → {table key: traced tensor}


@torch.compiler.assume_constant_result
def _graph_constant(table_fn, key: tuple, device: Optional[str], dtype) -> torch.Tensor:
    with real_tensor_mode():
        return _on_device(_cpu_table(table_fn, key), device, dtype)


@functools.lru_cache(maxsize=None)
def _cpu_table(table_fn, key: tuple) -> torch.Tensor:
    with real_tensor_mode():  # a table first built under fake tensors would be cached fake for good
        return table_fn(*key)


def _on_device(table: torch.Tensor, device, dtype) -> torch.Tensor:
    if device is None or torch.device(device).type == "cpu":
        return table.to(dtype=dtype)
    # one copy per device and dtype: a host-to-device copy per call would sync, and is not
    # allowed at all while a CUDA graph is being captured
    key = (id(table), str(torch.device(device)), dtype)
    hit = _ON_DEVICE.get(key)
    if hit is None or hit[0] is not table:
        hit = _ON_DEVICE[key] = (table, _copy_outside_graph_pools(table, device, dtype))
    return hit[1]


def _copy_outside_graph_pools(table: torch.Tensor, device, dtype) -> torch.Tensor:
    """``table.to(device, dtype)``, allocated from a helper thread. CUDA graph trees warm a graph up
    by running it eagerly with the running thread's allocations routed into the graph's private
    pool; a table first copied there would stay alive in the pool, which the trees then refuse
    ("tensor(s) in the cudagraph pool not tracked as outputs": turbo 4-bit, mode="reduce-overhead",
    H200). The pool takes only that thread's allocations, so the copy is made on another."""
    result = {}

    def copy():
        try:
            result["table"] = table.to(device=device, dtype=dtype)
        except Exception as e:  # raised again in the caller's thread
            result["error"] = e

    worker = threading.Thread(target=copy, name="turboquant-table-copy")
    worker.start()
    worker.join()
    if "error" in result:
        raise result["error"]
    return result["table"]


_ON_DEVICE: dict = {}
