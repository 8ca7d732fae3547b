"""End-to-end benchmarks shipped with the package (``tq bench``)."""

from .e2e import run_bench

__all__ = ["run_bench"]
