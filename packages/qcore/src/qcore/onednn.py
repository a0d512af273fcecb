"""What Paddle Inference's oneDNN int8 path (Paddle 3.3.1, CPU) does to a legacy QDQ model,
reproduced here so quantizers can check a layer, or match the deployed scales, before shipping.

Activation scales: ``compute_propagate_scales_onednn_pass`` passes scales through "scale
immutable" ops (:data:`SCALE_SHARING_OPS`) and concat, so a QDQ'd tensor can end up running
with another tensor's scale. :func:`deployed_thresholds` mirrors that propagation and
:func:`clipping_avg_pools` finds the average pools it breaks (an int8 average pool quantizes its
input with the narrower scale of its output and clips it: PP-OCR's MobileNetV3 classifier,
whose squeeze-excitation convs read a global average pool, drops from 94 % to chance).

Fully connected weights (measured and traced to the passes; numbers in
``benchmarks/results/ptq_real_ocr.md``):

* ``compute_propagate_scales_onednn_pass`` recomputes the per-output-channel scales of an
  ``fc`` weight ``W[K, N]`` as the abs max of contiguous ``K``-element runs of the row-major
  buffer (run ``i`` = flat elements ``i*K .. i*K+K-1``), not of column ``i``. The int8 kernel
  then re-quantizes column ``i`` with that scale: columns whose abs max exceeds their run's are
  clipped, the others lose resolution.
* When ``K == N``, ``quant_dequant_onednn_pass`` applies per-channel weight scales along the
  input axis instead of the output axis while turning the stored int8 weight back into float.

Convolution weights (``[C_out, ...]``, runs = rows) are not affected.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from .quant import abs_max, fake_quantize

if TYPE_CHECKING:
    from .graph import Graph, OpRef


def deployed_fc_weight(weight: np.ndarray) -> np.ndarray:
    """The ``[K, N]`` weight oneDNN's int8 fc effectively multiplies by, given the float weight
    it sees after dequantizing the stored codes (for ``K != N``)."""
    k, n = weight.shape
    runs = np.abs(weight.reshape(-1)[: k * n].reshape(n, k)).max(1)  # run i -> "scale" of column i
    runs = np.where(runs > 0, runs, 1.0)
    codes = np.clip(np.round(weight / runs * 127.0), -127, 127)
    return (codes * runs / 127.0).astype(np.float32)


def fc_int8_error(weight: np.ndarray, dequantized: np.ndarray, per_channel: bool = True) -> tuple[float, float]:
    """(relative error of our int8 weight, relative error of what oneDNN will run) vs ``weight``.

    ``dequantized`` is the weight our stored codes represent. A square weight with per-channel
    scales gets an infinite deployed error: its scales are applied along the wrong axis.
    """
    norm = float(np.linalg.norm(weight)) or 1.0
    ours = float(np.linalg.norm(dequantized - weight)) / norm
    if weight.ndim != 2:
        return ours, ours
    if per_channel and weight.shape[0] == weight.shape[1]:
        return ours, float("inf")
    return ours, float(np.linalg.norm(deployed_fc_weight(dequantized) - weight)) / norm


#: Seed op types whose int8-stored weight Paddle Inference cannot run on CPU with the int8
#: switch on: ``quant_dequant_onednn_pass`` drops the weight's dequantize op but only turns
#: conv2d / depthwise_conv2d / mul / matmul weights back into float, so the op reads int8 data
#: and fails ("float32 ... does not match ... int8", measured on PP-OCRv4 det).
INT8_WEIGHT_UNSUPPORTED = {
    "conv2d_transpose": "Paddle Inference 3.3.1 has no int8 conv2d_transpose on CPU and fails on its int8 weight",
}

#: A legacy fc stays float when oneDNN's effective weight error exceeds ours by more than this
#: (relative Frobenius error; the demo's fc: 2.0 % vs 0.5 %, PP-OCRv4 rec's: 6-20 % vs 0.7 %).
FC_TOLERANCE = 0.02
_FC_KINDS = ("mul", "matmul", "matmul_v2")


def int8_weight_problem(
    graph: Graph, op: OpRef, bits: int = 8, per_channel: bool = True, tolerance: float = FC_TOLERANCE
) -> str | None:
    """Why Paddle Inference's oneDNN int8 path would run ``op``'s int8 weight wrongly or fail,
    or None when it is fine. Only legacy graphs are affected (PIR output runs float kernels)."""
    weight = graph.weight_operand(op)
    if graph.family != "legacy" or weight is None:
        return None
    if op.seed_type in INT8_WEIGHT_UNSUPPORTED:
        return INT8_WEIGHT_UNSUPPORTED[op.seed_type]
    axis = graph.weight_channel_axis(op)
    if op.seed_type not in _FC_KINDS or axis != 1:
        return None
    w = graph.get_param(weight.name)
    ours = fake_quantize(w, abs_max(w, axis if per_channel else None), bits, axis if per_channel else None)
    own_error, deployed_error = fc_int8_error(w, ours, per_channel)
    if deployed_error <= own_error + tolerance:
        return None
    if deployed_error == float("inf"):
        return "oneDNN int8 fc applies per-channel scales of a square weight along the wrong axis (Paddle 3.3.1)"
    return (f"oneDNN int8 fc would run this [K, N] weight with {deployed_error:.1%} error vs our "
            f"{own_error:.1%} (Paddle 3.3.1 takes fc weight scales over K-element runs, not columns)")


#: Ops whose output oneDNN's int8 path gives the scale of their input (or, when only the
#: output has one, the input the output's): ``scale_immutable_ops`` of the propagation pass.
SCALE_SHARING_OPS = frozenset({
    "fused_transpose", "transpose2", "reshape2", "pool2d", "slice", "shape", "nearest_interp",
    "nearest_interp_v2", "split",
})


def _propagate(raw_ops: list[Any], scales: dict[str, float]) -> dict[str, Any]:
    """Run the pass's propagation over ``raw_ops`` in place; return the vars given a scale
    backwards (from a scale-sharing op's output to its input), with that op."""
    from_output: dict[str, Any] = {}
    previous: set[str] | None = None
    while True:
        waiting: set[str] = set()
        for raw in raw_ops:
            if raw.type in SCALE_SHARING_OPS:
                x = raw.input("Input" if raw.type in ("slice", "shape") else "X")[0]
                out = raw.output("Out")[0]
                if x in scales:
                    scales[out] = scales[x]
                elif out in scales:
                    scales[x] = scales[out]
                    from_output[x] = raw
                else:
                    waiting |= {x, out}
            elif raw.type == "concat" and raw.output("Out")[0] in scales:
                for x in raw.input("X"):
                    scales[x] = scales[raw.output("Out")[0]]
        if not waiting or waiting == previous:
            return from_output
        previous = waiting


def deployed_thresholds(graph: Graph, thresholds: Mapping[str, float]) -> dict[str, float]:
    """The threshold oneDNN's int8 path runs each var with, given ours for the QDQ'd vars.

    A var downstream of a QDQ'd var through scale-sharing ops takes that var's threshold, a
    concat's inputs take its output's. PIR graphs are returned unchanged (no int8 kernels).
    """
    scales = dict(thresholds)
    if graph.family == "legacy":
        _propagate([op.raw for op in graph.ops()], scales)
    return scales


#: Why an op reading a clipping average pool (:func:`clipping_avg_pools`) is left float.
POOL_READER_REASON = (
    "reads an average pool that Paddle Inference's int8 kernel would run with this op's input scale, clipping "
    "the pool's input (after a global pool the op sees one value per channel: int8 gains nothing there)"
)


@dataclass(frozen=True)
class ClippingPool:
    """An average ``pool2d`` oneDNN would run in int8 with its input clipped to its output's scale."""

    op: OpRef
    input: str
    output: str
    is_global: bool  # pools each channel to one value (global or adaptive 1x1)


def clipping_avg_pools(graph: Graph, quantized: Iterable[str]) -> list[ClippingPool]:
    """Average pools whose input only gets a scale backwards from the QDQ'd vars ``quantized``.

    oneDNN then quantizes the (wider) pool input with the output's scale. Quantizing the pool
    input too gives the pool, and everything sharing its scale, the input's range instead; the
    ops reading a global pool can simply stay float (they run on one value per channel).
    """
    if graph.family != "legacy":
        return []
    quantized = set(quantized)
    ops = graph.ops()
    from_output = _propagate([op.raw for op in ops], dict.fromkeys(quantized, 1.0))
    found = []
    for op in ops:
        if op.type != "pool2d" or op.raw.attr("pooling_type") != "avg":
            continue
        x, out = op.raw.input("X")[0], op.raw.output("Out")[0]
        if from_output.get(x) is op.raw and x not in quantized:
            one_value = op.raw.attr("global_pooling") or (
                op.raw.attr("adaptive") and list(op.raw.attr("ksize")) == [1, 1]
            )
            found.append(ClippingPool(op, x, out, bool(one_value)))
    return found


def int8_problem(
    graph: Graph, op: OpRef, bits: int = 8, per_channel: bool = True, float_inputs: Iterable[str] = ()
) -> str | None:
    """Why ``op`` should stay float in a model for Paddle Inference's int8 path, or None.

    Its weight would run wrongly (:func:`int8_weight_problem`), or it reads one of
    ``float_inputs``: outputs of average pools :func:`clipping_avg_pools` found.
    """
    reason = int8_weight_problem(graph, op, bits, per_channel)
    if reason is None and not {a.name for a in graph.activation_operands(op)}.isdisjoint(float_inputs):
        reason = POOL_READER_REASON
    return reason
