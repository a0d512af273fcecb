"""Residual adds a CPU runtime computes inside a conv, as Paddle Inference's oneDNN passes and OpenVINO both do.

``conv_elementwise_add_onednn_fuse_pass`` folds an ``elementwise_add`` into the conv that makes one of its
inputs; OpenVINO fuses the same adds (:mod:`qcore.deploy.openvino`). The fused conv's own output never exists
as a tensor and its other input (the residual) is read with its own scale, so a quantizer puts QDQ on the
residual input only (:func:`fused_residual_inputs`). The rules work on legacy programs (the form both run
with int8 kernels); they find nothing in PIR programs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..graph import Dataflow
from ..optable import CONV, DEPTHWISE, backend_names_of, seed_types
from .base import OpTarget, residual_joins

if TYPE_CHECKING:
    from collections.abc import Iterable

    from ..graph import Graph, OpRef

#: Legacy convs the fuse passes fold a bias, a batch norm, an activation or a residual add into.
FUSING_CONVS = backend_names_of(seed_types(CONV, DEPTHWISE), "legacy")
#: Activations ``conv_activation_onednn_fuse_pass`` / ``fc_act_onednn_fuse_pass`` fold into the op before.
FUSED_ACTIVATIONS = frozenset({
    "relu", "relu6", "hard_swish", "swish", "sigmoid", "tanh", "leaky_relu", "hard_sigmoid", "gelu", "mish", "abs",
    "sqrt", "clip",
})


def conv_behind(flow: Dataflow, name: str, read_once: bool = False) -> OpRef | None:
    """The conv oneDNN computes tensor ``name`` in: through a batch norm (``conv_bn_fuse_pass``) or a bias add
    ``conv_bias_onednn_fuse_pass`` takes (``axis=1``, a parameter: not Paddle 3's reshaped bias with
    ``axis=-1``). ``read_once``: every tensor on the way has one reader."""
    while (op := flow.producer(name)) is not None and not (read_once and len(flow.readers(name)) != 1):
        if op.type in FUSING_CONVS:
            return op
        bias = op.type == "elementwise_add" and flow.graph.attr(op, "axis") == 1 and flow.input(op, "Y") in flow.params
        if not (bias or op.type == "batch_norm"):
            return None
        name = flow.input(op, "X")
    return None


def adds_param(flow: Dataflow, op: OpRef) -> bool:
    """``op`` is an ``elementwise_add`` of a parameter (a bias) to an activation."""
    return op.type == "elementwise_add" and flow.reads_param(op, "Y")


@dataclass(frozen=True)
class ResidualFusion:
    """An ``elementwise_add`` the runtime computes inside the conv that makes one of its inputs."""

    add: OpRef
    conv: OpRef  # never writes its own output: the add's output is the fused conv's output
    residual: str  # the other input: the fused conv's ResidualData, quantized with its own scale
    output: str  # what the fused conv writes: the add's output, or the activation's fused after it


def residual_fusions(graph: Graph) -> list[ResidualFusion]:
    """The residual adds ``conv_elementwise_add_onednn_fuse_pass`` folds into a conv.

    An input qualifies when a conv made it (:func:`conv_behind`) and only the add reads it. With two
    such inputs, the conv fused is the one downstream of the other conv's input (a projection shortcut
    stays the residual); with one, the other input must reach it. The fused conv's output never exists as
    a tensor, so a QDQ on it simulates a rounding Paddle Inference does not do (PP-OCR cls: simulated and
    deployed outputs 1.5 % apart, 0.2 % without it). Empty for PIR graphs.
    """
    if graph.family != "legacy":
        return []
    flow = Dataflow(graph)
    found = []

    def fusion(add: OpRef, conv: OpRef, residual: str) -> ResidualFusion:
        out = flow.output(add, "Out")
        readers = flow.readers(out)
        if len(readers) == 1 and readers[0].type in FUSED_ACTIVATIONS:
            out = flow.output(readers[0], "Out")
        return ResidualFusion(add, conv, residual, out)

    for add in flow.ops:
        if add.type != "elementwise_add" or graph.added_param(add) is not None:
            continue
        x, y = flow.input(add, "X"), flow.input(add, "Y")
        if graph.shape(x) != graph.shape(y):
            continue  # the pass does not fuse broadcasting adds
        conv_x, conv_y = conv_behind(flow, x, read_once=True), conv_behind(flow, y, read_once=True)
        if conv_x and conv_y:
            if flow.reaches(flow.input(conv_x, "Input"), y):
                found.append(fusion(add, conv_y, x))
            elif flow.reaches(flow.input(conv_y, "Input"), x):
                found.append(fusion(add, conv_x, y))
        elif conv_x and flow.reaches(y, x):
            found.append(fusion(add, conv_x, y))
        elif conv_y and flow.reaches(x, y):
            found.append(fusion(add, conv_y, x))
    return found


def fused_residual_inputs(graph: Graph, targets: list[OpTarget], skip_patterns: Iterable[str]) -> list[OpTarget]:
    """The residual input of each add :func:`residual_fusions` computes inside a conv of ``targets``.

    The runtime never rounds the conv's own output and runs other adds in float, so quantizing more
    would only make the simulation differ from what deploys.
    """
    by_op = {t.op.key: t for t in residual_joins(graph, skip_patterns)}
    convs = {t.op.key for t in targets}
    return [
        OpTarget(fusion.add, None, [a for a in by_op[fusion.add.key].activations if a.name == fusion.residual],
                 for_conv=fusion.conv)
        for fusion in residual_fusions(graph)
        if fusion.add.key in by_op and fusion.conv.key in convs
    ]  # fmt: skip
