"""Numeric tables (rotations, codebooks) on a device: one tensor per device and dtype.

A kernel's launch plan made while a CUDA graph is captured looks its tables up again: a fresh
host-to-device copy there fails ("Cannot copy between CPU and CUDA tensors during CUDA graph
capture"), and a fresh allocation lands in the graph's memory pool. The ``meta`` device stands in
for a GPU here: it takes the same per-device path as CUDA.
"""

import pytest
import torch

from turboquant.config import KVQuantConfig
from turboquant.quant.codebooks import lloyd_max_codebook
from turboquant.quant.rotation import hadamard_rotation, rotation_matrix, signed_hadamard
from turboquant.quant.turbo import turbo_centroids
from turboquant.templates.decode_attention import _lut

TURBO_4 = KVQuantConfig(method="turbo", bits=4).spec("k")
TABLES = {
    "rotation": lambda dev: rotation_matrix(128, 3, device=dev, dtype=torch.float32),
    "rotation-80": lambda dev: rotation_matrix(80, 3, device=dev, dtype=torch.float32),
    "signed-hadamard": lambda dev: signed_hadamard(128, 3, device=dev, dtype=torch.float16),
    "hadamard-rotation": lambda dev: hadamard_rotation(128, 3, device=dev, dtype=torch.float16),
    "centroids": lambda dev: turbo_centroids(128, 4, device=dev, dtype=torch.float32),
    "kernel-centroids": lambda dev: _lut(TURBO_4, 128, torch.empty(0, device=dev)),
}


@pytest.mark.parametrize("name", sorted(TABLES))
def test_a_table_on_a_device_is_one_tensor_for_every_call(name):
    first = TABLES[name]("meta")
    assert first.device.type == "meta"
    assert TABLES[name]("meta") is first


def test_kernel_centroids_are_the_fp32_centroids_rounded_to_fp16():
    want = turbo_centroids(128, 4, dtype=torch.float32).to(torch.float16)
    got = _lut(TURBO_4, 128, torch.empty(0))
    assert got.dtype == torch.float16 and torch.equal(got, want)


def test_centroids_are_fp16_numbers_in_every_dtype():
    # the kernels' fp16 table and the float64 oracle hold the same numbers: the Lloyd–Max levels
    # rounded to fp16, or (POLYNOMIAL_LEVELS) the level polynomial's fp16 values (tests/test_turbo.py)
    from turboquant.quant.turbo import POLYNOMIAL_LEVELS

    for d, bits in ((128, 2), (80, 2), (128, 3), (80, 3), (96, 4), (128, 8), (80, 8)):
        levels = lloyd_max_codebook(d, bits).double() / d ** 0.5
        want = turbo_centroids(d, bits).to(torch.float16)
        if bits not in POLYNOMIAL_LEVELS:
            assert torch.equal(want, levels.to(torch.float16))
            assert 0 < float(((want.double() - levels) / levels).abs().max()) <= 2 ** -11
        for dtype in (torch.float16, torch.float32, torch.float64):
            assert torch.equal(turbo_centroids(d, bits, dtype=dtype).to(torch.float16), want)
            assert torch.equal(turbo_centroids(d, bits, dtype=dtype).double(), want.double())
        assert torch.equal(turbo_centroids(d, bits, dtype=torch.bfloat16), want.to(torch.bfloat16))



def test_a_tables_device_copy_is_made_outside_the_calling_thread(monkeypatch):
    """CUDA graph trees route the warming thread's allocations into the graph's pool, so the one
    copy of a table must be allocated by another thread (turbo under reduce-overhead, H200)."""
    import threading

    from turboquant.quant import constants

    copied_on, real_to = [], torch.Tensor.to

    def recording_to(self, *args, **kwargs):
        copied_on.append(threading.get_ident())
        return real_to(self, *args, **kwargs)

    monkeypatch.setattr(constants, "_ON_DEVICE", {})
    monkeypatch.setattr(torch.Tensor, "to", recording_to)
    got = constants._on_device(torch.arange(6.0), "meta", torch.float16)
    assert got.device.type == "meta" and got.dtype == torch.float16 and got.shape == (6,)
    assert copied_on and threading.get_ident() not in copied_on


def test_a_failed_device_copy_raises_in_the_caller():
    """Not lost in the helper thread (a CPU-only torch asserts; a GPU machine has no device 99)."""
    from turboquant.quant import constants

    with pytest.raises((RuntimeError, AssertionError), match="CUDA|device"):
        constants._copy_outside_graph_pools(torch.ones(3), "cuda:99" if torch.cuda.is_available() else "cuda",
                                            torch.float32)


def test_a_table_read_twice_in_one_traced_graph_is_one_constant():
    """While a graph is traced with fake tensors (AOTAutograd under Inductor), every read of a table
    is the same traced constant: a layer's K and V cache writes then read one buffer, which Inductor
    needs before it makes them one kernel (``test_a_turbo_write_is_its_rotation…``). Two traces keep
    their own; other tables stay apart."""
    from torch.fx.experimental.proxy_tensor import make_fx

    def f(x):
        a = signed_hadamard(8, 3, dtype=torch.float32)
        b = signed_hadamard(8, 3, dtype=torch.float32)
        c = signed_hadamard(8, 4, dtype=torch.float32)
        return x @ a, x @ b, x @ c

    x = torch.randn(2, 8)
    f(x)  # the tables built (cached) before the traces, as a model's eager calls build them
    for _ in range(2):
        g = make_fx(f, tracing_mode="fake")(x)
        assert len([n for n in g.graph.nodes if n.op == "get_attr"]) == 2, g.code
        assert all(torch.equal(o, w) for o, w in zip(g(x), f(x)))
