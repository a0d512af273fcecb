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

Activations: relu outputs run unsigned (:func:`unsigned_activations`); residual adds are computed
inside a conv (:func:`qcore.deploy.residual.residual_fusions`), which must see a residual of its output's sign
(:func:`align_residual_signs`) and scales on both (:func:`float_residual_convs`); an int8 conv's
output is rounded for every reader (:func:`share_int8_outputs`). :class:`OneDnnRules` bundles
these rules for a quantizer; :class:`OneDnnTarget` is the deployment target.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ..errors import GraphError
from ..graph import Dataflow
from ..optable import FC, backend_names_of, kind_of, seed_types
from ..quant import abs_max, fake_quantize
from . import host, residual
from .base import DeployTarget, ModelRules, OpTarget, residual_joins
from .residual import FUSED_ACTIVATIONS, FUSING_CONVS, ResidualFusion, adds_param, conv_behind

if TYPE_CHECKING:
    from paddle import inference

    from ..graph import Graph, OpRef


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
    if kind_of(op.seed_type) is not FC or axis != 1:
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


def _propagate(flow: Dataflow, scales: dict[str, float]) -> dict[str, OpRef]:
    """Run the pass's propagation over ``flow``'s ops, updating ``scales`` in place; return the vars given a
    scale backwards (from the output of a scale-sharing op or concat to its input), with that op."""
    from_output: dict[str, OpRef] = {}
    previous: set[str] | None = None
    while True:
        waiting: set[str] = set()
        for op in flow.ops:
            if op.type in SCALE_SHARING_OPS:
                x = flow.input(op, "Input" if op.type in ("slice", "shape") else "X")
                out = flow.output(op, "Out")
                if x in scales:
                    scales[out] = scales[x]
                elif out in scales:
                    scales[x] = scales[out]
                    from_output[x] = op
                else:
                    waiting |= {x, out}
            elif op.type == "concat" and flow.output(op, "Out") in scales:
                for x in flow.graph.input_names(op, "X"):
                    scales[x] = scales[flow.output(op, "Out")]
                    from_output[x] = op
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
        _propagate(Dataflow(graph), scales)
    return scales


_FC_OPS = backend_names_of(seed_types(FC), "legacy")


def int8_written(graph: Graph, quantized: Iterable[OpRef], activations: Iterable[str]) -> set[str]:
    """The QDQ'd ``activations`` oneDNN writes as int8 tensors: outputs of a ``quantized`` conv or fc,
    after what it fuses (bias, batch norm, an activation, a residual add).

    cpu_quantize_pass makes such an op output int8 at the var's scale and dequantizes it for float
    readers, so every reader sees the rounded values, not only the ops given the QDQ copy.
    Empty for PIR graphs.
    """
    if graph.family != "legacy":
        return set()
    flow = Dataflow(graph)
    keys = {op.key for op in quantized}
    residual_convs = {f.add.key: f.conv for f in residual.residual_fusions(graph)}
    found = set()
    for name in activations:
        op, var = flow.producer(name), name
        if op is not None and op.type in FUSED_ACTIVATIONS:
            var = flow.input(op, "X")
            op = flow.producer(var) if len(flow.readers(var)) == 1 else None
        if op is not None and op.key in residual_convs:
            op = residual_convs[op.key]
        elif op is not None and adds_param(flow, op):
            fc = flow.producer(flow.input(op, "X"))
            op = fc if fc is not None and fc.type in _FC_OPS else conv_behind(flow, var, read_once=True)
        elif op is not None and op.type not in FUSING_CONVS | _FC_OPS:
            op = conv_behind(flow, var, read_once=True)
        if op is not None and op.key in keys:
            found.add(name)
    return found


def unsigned_activations(graph: Graph) -> set[str]:
    """Vars oneDNN's int8 path quantizes as unsigned (``u8``, 255 levels over ``[0, t]``).

    ``compute_propagate_scales_onednn_pass`` marks a QDQ'd var unsigned when a ``relu`` op made
    it, or a conv or fc the relu was fused into. A relu ``batch_norm_act_fuse_pass`` folds into
    a batch norm (one no conv absorbed first) or that follows a ``conv2d_transpose`` makes a
    signed var. Such a var runs with twice the resolution of the signed QDQ in the model;
    :meth:`Graph.insert_act_qdq` can simulate that. The pass also names a fused ``relu6``, but
    Paddle 3.3.1 runs conv + bias + relu6 outputs signed (measured: simulating them unsigned
    moves the simulation 1 % away from what deploys; relu outputs then match to 1e-6).
    Empty for PIR graphs.
    """
    if graph.family != "legacy":
        return set()
    flow = Dataflow(graph)
    found = set()
    for op in flow.ops:
        if op.type != "relu":
            continue
        x = flow.input(op, "X")
        source = flow.producer(x)
        if source is not None and source.type == "batch_norm" and conv_behind(flow, x) is None:
            continue  # relu fused into the batch norm
        if source is not None and adds_param(flow, source):
            source = flow.producer(flow.input(source, "X"))
        if source is not None and source.type == "conv2d_transpose":
            continue
        found.add(flow.output(op, "Out"))
    return found


def share_int8_outputs(graph: Graph, quantized: Iterable[OpRef], activations: Iterable[str]) -> set[str]:
    """Make every reader of the :func:`int8_written` ``activations`` read their QDQ copy, as deployed."""
    names = int8_written(graph, quantized, activations)
    for name in sorted(names):
        read_qdq_everywhere(graph, name)
    return names


def read_qdq_everywhere(graph: Graph, name: str) -> None:
    """Make every op reading activation ``name`` (model outputs aside) read its QDQ copy.

    Paddle Inference does this when an int8 op writes ``name`` (:func:`int8_written`): its float
    readers get the dequantized int8 values too.
    """
    copy = graph.act_qdq_copy(name)
    _legacy_only(graph, "read_qdq_everywhere")
    for op in graph.ops():
        if op.type not in ("quantize_linear", "fetch") and name in graph.input_names(op):
            graph.rename_input(op, name, copy)


def write_relu_as_leaky(graph: Graph, op: OpRef) -> None:
    """Make ``relu`` op ``op`` a ``leaky_relu`` with ``alpha=0``: the same values, written signed by oneDNN
    (:func:`align_residual_signs`)."""
    _legacy_only(graph, "write_relu_as_leaky")
    if op.type != "relu":
        raise GraphError(f"{op!r} is not a relu; only relu ops can be written as leaky_relu(alpha=0)")
    graph.retype(op, "leaky_relu")
    graph.set_attr(op, "alpha", 0.0)


def keep_float_in_onednn(graph: Graph, op: OpRef) -> None:
    """Mark ``op`` (``skip_quant=1``) so Paddle Inference's oneDNN int8 placement leaves it float.

    ``cpu_quantize_placement_pass`` reads the mark as an int; the executor and other backends ignore it.
    """
    _legacy_only(graph, "keep_float_in_onednn")
    graph.set_attr(op, "skip_quant", 1)


def _legacy_only(graph: Graph, what: str) -> None:
    if graph.family != "legacy":
        raise GraphError(f"{what} rewrites legacy programs only (PIR output runs float kernels)")


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
    scale_from: str  # the QDQ'd var whose threshold it gets: its output or one further down scale-sharing ops


def clipping_avg_pools(graph: Graph, quantized: Iterable[str]) -> list[ClippingPool]:
    """Average pools whose input only gets a scale backwards from the QDQ'd vars ``quantized``.

    oneDNN then quantizes the (wider) pool input with the output's scale. Quantizing the pool
    input too gives the pool, and everything sharing its scale, the input's range instead; the
    ops reading a global pool (``scale_from``, possibly through a reshape) can simply stay
    float (they run on one value per channel).
    """
    if graph.family != "legacy":
        return []
    quantized = set(quantized)
    flow = Dataflow(graph)
    from_output = _propagate(flow, dict.fromkeys(quantized, 1.0))
    found = []
    for op in flow.ops:
        if op.type != "pool2d" or graph.attr(op, "pooling_type") != "avg":
            continue
        x, out = flow.input(op, "X"), flow.output(op, "Out")
        if from_output.get(x) is op and x not in quantized:
            one_value = graph.attr(op, "global_pooling") or (
                graph.attr(op, "adaptive") and list(graph.attr(op, "ksize")) == [1, 1]
            )
            source = out
            while source not in quantized and source in from_output:
                source = flow.output(from_output[source], "Out")
            found.append(ClippingPool(op, x, out, bool(one_value), source))
    return found


def align_residual_signs(graph: Graph) -> list[str]:
    """Write relus as ``leaky_relu(alpha=0)`` until each :func:`residual_fusions` conv reads a residual of its sign.

    Paddle 3.3.1's fused int8 conv misreads a residual whose sign differs from its output's
    (:func:`float_residual_convs`): every ResNet projection block adds a signed shortcut before
    a relu. oneDNN marks only ``relu`` outputs unsigned (:func:`unsigned_activations`); a
    ``leaky_relu`` with ``alpha=0`` computes the same values and fuses the same way, but is
    written signed. Rewriting the unsigned side of each mismatch can mismatch the next block
    (whose residual it is), so this repeats until none is left. The tensors rewritten then run
    signed, with half the resolution of u8, where the alternative was a float conv (measured on
    ResNet18 at batch 8: 2 of 29 layers float instead of 10, 3.96x float's speed instead of
    2.15x, output 2.0 % off float instead of 1.7 %). Returns the rewritten relus' outputs;
    empty for PIR graphs.
    """
    if graph.family != "legacy":
        return []
    rewritten: list[str] = []
    while True:
        unsigned = unsigned_activations(graph)
        flow = Dataflow(graph)
        relus = {}  # the unsigned side of every mismatch; unsigned vars are relu outputs
        for fusion in residual.residual_fusions(graph):
            if (fusion.output in unsigned) != (fusion.residual in unsigned):
                name = fusion.output if fusion.output in unsigned else fusion.residual
                relus[name] = flow.producer(name)
        if not relus:
            return rewritten
        for name, relu in sorted(relus.items()):
            write_relu_as_leaky(graph, relu)
            rewritten.append(name)


@dataclass(frozen=True)
class PooledResidualOutput:
    """A residual conv's unscaled output that only pools read (:func:`pooled_residual_outputs`)."""

    fusion: ResidualFusion
    pools: tuple[OpRef, ...]


def pooled_residual_outputs(graph: Graph, quantized_inputs: Iterable[str]) -> list[PooledResidualOutput]:
    """Fused residual convs that would run int8 if their pools' input were quantized.

    A :func:`residual_fusions` conv whose residual has a scale but whose output has none runs
    float (:func:`float_residual_convs`): in a ResNet only the final global pool reads the last
    block. When only pools read such an output and no scale reaches their outputs, quantizing
    their input gives the conv its output scale without changing any other tensor's. The pools
    should then stay float (:func:`keep_float_in_onednn`): an int8 pool writes its
    output at its input's scale, coarse for an average. Empty for PIR graphs.
    """
    if graph.family != "legacy":
        return []
    scaled = deployed_thresholds(graph, dict.fromkeys(quantized_inputs, 1.0))
    flow = Dataflow(graph)
    found = []
    for fusion in residual.residual_fusions(graph):
        readers = flow.readers(fusion.output)
        if fusion.residual not in scaled or fusion.output in scaled or not readers:
            continue
        if all(op.type == "pool2d" and flow.output(op, "Out") not in scaled for op in readers):
            found.append(PooledResidualOutput(fusion, tuple(readers)))
    return found


#: Why a conv fused with a residual add (:func:`float_residual_convs`) is left float.
RESIDUAL_CONV_REASON = (
    "Paddle Inference computes a residual add inside this conv and would run it in float (no scale for its "
    "output or residual) or wrongly in int8 (residual and output of different sign)"
)


def float_residual_convs(graph: Graph, quantized_inputs: Iterable[str]) -> list[OpRef]:
    """Convs :func:`residual_fusions` fuses that must stay float.

    Those whose output or residual gets no scale from the QDQ'd ``quantized_inputs`` (directly or
    propagated): cpu_quantize_pass leaves them float anyway (measured: a lone int8 residual conv
    deploys in float). And those whose residual and output differ in sign (:func:`unsigned_activations`),
    typically a projection shortcut (signed) added before a relu (unsigned): Paddle 3.3.1's int8
    kernel then misreads the residual (measured on a small ResNet: 10 % output error against
    float, 0.3 % simulated). :func:`align_residual_signs` removes the second kind.
    """
    scaled = deployed_thresholds(graph, dict.fromkeys(quantized_inputs, 1.0))  # with the scales oneDNN propagates
    unsigned = unsigned_activations(graph)
    return [
        f.conv for f in residual.residual_fusions(graph)
        if f.output not in scaled or f.residual not in scaled or (f.output in unsigned) != (f.residual in unsigned)
    ]


def int8_problem(
    graph: Graph,
    op: OpRef,
    bits: int = 8,
    per_channel: bool = True,
    float_inputs: Iterable[str] = (),
    float_convs: Iterable[OpRef] = (),
) -> str | None:
    """Why ``op`` should stay float in a model for Paddle Inference's int8 path, or None.

    Its weight would run wrongly (:func:`int8_weight_problem`), it reads one of ``float_inputs``
    (the ``scale_from`` vars of average pools :func:`clipping_avg_pools` found), or it is one of
    ``float_convs`` (:func:`float_residual_convs`).
    """
    reason = int8_weight_problem(graph, op, bits, per_channel)
    if reason is None and not {a.name for a in graph.activation_operands(op)}.isdisjoint(float_inputs):
        reason = POOL_READER_REASON
    if reason is None and any(op.key == conv.key for conv in float_convs):
        reason = RESIDUAL_CONV_REASON
    return reason


class OneDnnScales(ModelRules):
    """What oneDNN's int8 path always does: run QDQ'd tensors with the scales it propagates
    (:func:`deployed_thresholds`). The rules with ``OneDnnTarget(fallback=False)``."""

    def thresholds(self, chosen: Mapping[str, float]) -> dict[str, float]:
        return deployed_thresholds(self.graph, chosen)


class OneDnnRules(OneDnnScales):
    """The oneDNN int8 rules for one graph about to be quantized, worked out once.

    :meth:`prepare` writes relus signed where residual convs need it (:func:`align_residual_signs`);
    then the rules know which activations run unsigned, which residual convs run float given the
    activations to be quantized (:func:`float_residual_convs`), and whose readers stay float
    (``float_inputs``: what global average pools take their scale from). Empty rules for PIR.
    """

    def __init__(self, target: OneDnnTarget, graph: Graph, quantized_inputs: Iterable[str],
                 float_inputs: Iterable[str] = ()) -> None:
        super().__init__(target, graph)
        self.quantized_inputs = list(quantized_inputs)
        self.float_inputs = set(float_inputs)
        self.float_convs: list[OpRef] = []

    def prepare(self) -> None:
        self.rewrites["relus_written_as_leaky"] = align_residual_signs(self.graph)
        self.unsigned = unsigned_activations(self.graph)
        self.float_convs = float_residual_convs(self.graph, self.quantized_inputs)

    def problem(self, op: OpRef, bits: int, per_channel: bool) -> str | None:
        reason = int8_problem(self.graph, op, bits, per_channel, self.float_inputs, self.float_convs)
        return None if reason is None else f"{self.target.name}: {reason}"

    def keep_float(self, op: OpRef) -> None:
        keep_float_in_onednn(self.graph, op)

    def finish(self, quantized: list[OpRef], activations: list[str]) -> None:
        share_int8_outputs(self.graph, quantized, activations)


#: What oneDNN's int8 kernels do on x86 CPUs without VNNI (:func:`qcore.deploy.host.int8_pairs_saturate`).
NO_VNNI_PROBLEM = (
    "this CPU has no VNNI: oneDNN's int8 kernels here run quantized models unlike their simulation "
    "(measured on an AVX2-only AMD EPYC, Paddle 3.3.1: 1-36 % off on small conv / residual / fc nets, "
    "with or without 7-bit weights); OpenVINO runs them as simulated: qcli ptq / demo --backend openvino, "
    "quant_post_static(..., deploy_backend='openvino'), create_predictor(..., backend='openvino')"
)


class OneDnnTarget(DeployTarget):
    """Paddle Inference on CPU with ``enable_onednn()`` + ``enable_onednn_int8()`` (legacy programs).

    ``fallback=False`` skips the graph-dependent rules above (nothing left float, no relu
    rewritten): the output then shows what Paddle 3.3.1's passes do unaided. ``overflow_fix``: see
    :meth:`DeployTarget.weight_max_code`. ``int8_kernels=False``
    builds predictors with oneDNN's float kernels only (the float baseline; a QDQ model then runs
    its quantize ops in float and is slower than the float model).
    """

    name = "onednn"
    aliases = ("mkldnn",)
    runtime = "Paddle Inference, oneDNN int8 passes (CPU)"
    int8_ops = frozenset({
        "conv2d", "depthwise_conv2d", "mul", "matmul", "matmul_v2", "elementwise_add", "pool2d", "concat",
        "transpose", "reshape2", "slice", "nearest_interp", "bilinear_interp",
    })
    float_ops = INT8_WEIGHT_UNSUPPORTED
    int8_families = ("legacy",)  # Paddle 3.3.1 has no PIR oneDNN int8 pass
    residual_adds = "fused"
    cpu_int8 = True  # oneDNN drifts without VNNI either way; the fix keeps the output exact on OpenVINO there

    def __init__(self, fallback: bool = True, int8_kernels: bool = True, overflow_fix: bool | None = None) -> None:
        super().__init__(overflow_fix)
        self.fallback = fallback
        self.int8_kernels = int8_kernels

    def float_kernels(self) -> OneDnnTarget:
        return OneDnnTarget(self.fallback, int8_kernels=False, overflow_fix=self.overflow_fix)

    def without_fallback(self) -> OneDnnTarget:
        return OneDnnTarget(False, int8_kernels=self.int8_kernels, overflow_fix=self.overflow_fix)

    def made_for_problem(self, made_for: str | None) -> str | None:
        if made_for in (None, "onednn"):
            return None
        return (f"it was quantized for {made_for!r}: oneDNN's int8 passes run some of its layers wrongly or in "
                "float (quantize with deploy_backend=None or 'onednn' for this backend)")

    def op_problem(self, op: OpRef, family: str) -> str | None:
        return None  # the op-level rules depend on the graph: :class:`OneDnnRules`

    def plan(self, graph: Graph, targets: list[OpTarget], skip_patterns: Iterable[str] = (), *,
             residual_add: bool = True, calibrated: bool = True) -> tuple[list[OpTarget], set[str]]:
        """Legacy programs: the residual input of each add oneDNN fuses into a conv of ``targets``
        (its scale keeps the fused conv int8), the pools whose input gives the last residual conv its
        output scale, and the input of average pools that would clip (:func:`clipping_avg_pools`);
        the readers of global ones stay float instead. PIR: both inputs of every residual join."""
        if graph.family != "legacy":
            return (residual_joins(graph, skip_patterns) if residual_add and calibrated else []), set()
        read = [a.name for t in targets for a in t.activations]
        if not calibrated:
            return [], {pool.scale_from for pool in clipping_avg_pools(graph, read)}
        extra = residual.fused_residual_inputs(graph, targets, skip_patterns) if residual_add else []
        if self.fallback:
            extra += _residual_output_pools(graph, targets + extra)
        read = {a.name for t in targets + extra for a in t.activations}
        pools = clipping_avg_pools(graph, read)
        kept_float = [p for p in pools if p.is_global and self.fallback]
        extra += [OpTarget(p.op, None, graph.activation_operands(p.op)) for p in pools if p not in kept_float]
        return extra, {p.scale_from for p in kept_float}

    def rules(self, graph: Graph, targets: list[OpTarget], float_inputs: Iterable[str] = ()) -> ModelRules:
        if not self.fallback:
            return OneDnnScales(self, graph)
        return OneDnnRules(self, graph, [a.name for t in targets for a in t.activations], float_inputs)

    def host_problem(self) -> str | None:
        if self.int8_kernels and host.int8_pairs_saturate():
            return NO_VNNI_PROBLEM
        return None

    def configure(self, config: inference.Config, threads: int) -> None:
        config.disable_gpu()
        config.set_cpu_math_library_num_threads(threads)
        config.enable_onednn()
        if self.int8_kernels:
            config.enable_onednn_int8()


def _residual_output_pools(graph: Graph, targets: list[OpTarget]) -> list[OpTarget]:
    """The pools whose input to quantize so the fused residual convs of ``targets`` writing it run int8
    (:func:`pooled_residual_outputs`); the pools themselves run float."""
    convs = {t.op.key for t in targets}
    read = [a.name for t in targets for a in t.activations]
    return [
        OpTarget(pool, None, graph.activation_operands(pool), for_conv=found.fusion.conv, runs_float=True)
        for found in pooled_residual_outputs(graph, read)
        if found.fusion.conv.key in convs
        for pool in found.pools
    ]


TARGET = OneDnnTarget()
