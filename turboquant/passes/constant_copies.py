"""Inductor post-grad pass: a copy of a graph constant that is only a matmul operand is the constant.

A quantized cache's numeric tables (turbo's dense rotation, for a head_dim that is not a power of
two; a power of two rotates without a table) enter a compiled graph while AOTAutograd traces the
cache's writes with fake tensors, as ``torch.tensor(...)``: a constant behind ``lift_fresh_copy``.
Inductor lowers that to a copy, so every call of the compiled step launched one kernel per cache
write only to copy its rotation (measured when every head_dim rotated by a matmul: a turbo decode
step of the gpt-fast-style test model, 16 Triton launches, 12 without the copies). When no user of
the copy (or of a view of it) does more than read it as a matmul operand, the copy is the constant.
"""

from __future__ import annotations

import torch
import torch.fx as fx

from .. import compat
from ..compat import custom_graph_pass_base, dynamo_counters, source_hash

__all__ = ["FoldConstantCopies"]

aten = torch.ops.aten
_VIEWS = {aten.permute.default, aten.t.default, aten.transpose.int, aten.view.default, aten.expand.default,
          aten.unsqueeze.default, aten.reshape.default, aten._unsafe_view.default, aten.slice.Tensor,
          aten.select.int}
_MATMULS = {aten.mm.default, aten.bmm.default, aten.addmm.default}


def _only_read(node: fx.Node) -> bool:
    """Whether every use of ``node`` (through views) is a matmul operand: read, never written, not
    returned. Matmuls only: Inductor lowers them as library calls that take a constant buffer as
    it is, where some lowerings of other ops (``bucketize``, seen) evaluate their inputs with fake
    tensors and fail on a real constant."""
    for user in node.users:
        if user.op != "call_function" or not isinstance(user.target, torch._ops.OpOverload):
            return False  # the graph's output, or something this pass cannot see into
        if user.target in _VIEWS:
            if not _only_read(user):
                return False
        elif user.target not in _MATMULS:
            return False
    return True


class FoldConstantCopies(custom_graph_pass_base()):
    """Replace ``lift_fresh_copy(constant)`` by ``constant`` where the copy is only a matmul
    operand (counter: ``dynamo_counters()["turboquant"]["constant_copies_folded"]``)."""

    def __call__(self, graph: fx.Graph) -> None:
        for node in list(graph.nodes):
            if (node.op == "call_function" and node.target is aten.lift_fresh_copy.default
                    and isinstance(node.args[0], fx.Node) and node.args[0].op == "get_attr" and _only_read(node)):
                node.replace_all_uses_with(node.args[0])
                graph.erase_node(node)
                dynamo_counters()["turboquant"]["constant_copies_folded"] += 1

    def uuid(self) -> bytes:
        # with compat's: its patches change the code Inductor generates (torch < 2.13's C++ casts) and not the
        # config Inductor's graph cache keys, so a graph cached before a change there must not be reused
        return source_hash(__file__, compat.__file__)
