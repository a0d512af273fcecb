"""The OpenVINO runtime from PyPI (``openvino``) running the exported QDQ model on its CPU plugin.

Facts (OpenVINO 2026.4, measured here where the text says so):

* It reads legacy ``.pdmodel`` programs itself (its Paddle frontend, our QDQ form with zero points
  included: about 1 s) but not PIR ``.json`` ("Cannot recognize input model"): legacy models run
  from their own files, PIR models through the ONNX export. Either way each QDQ pair becomes a
  FakeQuantize that its low-precision transformations run with int8 kernels. Reading the legacy
  program also covers models paddle2onnx 2.1 cannot convert (PP-OCRv4 det: "the 0th elementwise
  MUST be ir::FloatAttribute", float or quantized).
* Its int8 convs take unsigned activations natively (u8 x s8); a relu output on a symmetric grid
  runs signed, with a compensation term. Never-negative tensors therefore get unsigned grids by
  default (``default_grids = "unsigned"``); tensors reaching both signs stay symmetric, since a zero
  point there costs the compensation again (the engine target measured det slower with them).
* A squeeze-excited conv (``y + y * hardsigmoid(se(y))``) runs int8 as simulated only when every reader of
  ``y`` reads its one QDQ copy, as NNCF places it (:func:`qcore.deploy.openvino.excited_readers`, both IR
  families). With the product reading ``y`` in float, PP-OCRv4 det came out 100 % off its simulation
  (text-pixel IoU 0; the float rule missed PIR models: a tiny PIR net with the block 68 % off); with the
  shared copy its 62 convs run u8 and IoU with the simulation is 0.98, det 0.70-0.80x the bf16 float against
  0.90-0.99x with the 8 excited convs float (before) and 0.66-0.77x for NNCF's model (interleaved, shared
  2-core AVX-512 host).
* Its default CPU float precision is bf16 where the CPU has it (AVX-512 BF16 / AMX): the float
  to beat. :data:`FLOAT_PRECISION` names what a predictor runs; ``QCORE_OPENVINO_PRECISION``
  (``f32`` / ``bf16``) chooses.
* A matmul whose weight is int8 behind a ``DequantizeLinear`` and whose input is float (what weight-only
  PTQ exports for this target) runs as a compressed-weight FullyConnected, and the CPU plugin quantizes
  its input to int8 at run time in groups of ``DYNAMIC_QUANTIZATION_GROUP_SIZE`` input channels (default
  32). all-mpnet-base-v2 at batch 8 x 128 tokens, against its bf16 float (one interleaved run): group 0
  (off) 0.97x, 32 1.24x, 128 1.48x, 256 1.69x; sentence cosine to float 0.9994 / 0.9992 / 0.9989 /
  0.9985 mean (an NNCF-compressed copy at group 768: 1.65x but 0.9961). A group that does not divide the
  input widths is slow: all-MiniLM-L6-v2 (widths 384 and 1536) at 256 1.10x, at 128
  1.38x (cosine 0.9989). Predictors take the largest of :data:`DYNAMIC_GROUPS` dividing every matmul's
  input width (:func:`dynamic_group`; ``QCORE_OPENVINO_DQ_GROUP`` overrides); the static QDQ models' int8
  matmuls do not take this path. The plugin quantizes inputs at run time only on CPUs with VNNI
  (``avx2_vnni`` / ``avx512_core_vnni``, :func:`qcore.deploy.host.has_vnni`); on AVX2-only CPUs the
  matmuls keep their float inputs (measured: 5.6e-7 off the simulation at group 64), and predictors say
  group 0 there.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError
from . import host
from .base import ModelRules, OpTarget, OutputReaderRules
from .onnx_runtimes import ONNX_INT8_OPS, OnnxPredictor, OnnxTarget
from .openvino import OPENVINO_ATTENTION, SMALL_MODEL, excited_readers

if TYPE_CHECKING:
    from ..graph import Graph

#: Set to f32 or bf16 to choose OpenVINO's inference precision (unset: the runtime's default for this CPU).
PRECISION_ENV = "QCORE_OPENVINO_PRECISION"
#: Input channels per run-time int8 group of a compressed-weight matmul, largest (fastest) first (module doc).
DYNAMIC_GROUPS = (256, 128, 64, 32)
#: Set to an int to choose the group for every model (0 turns run-time int8 inputs off).
DYNAMIC_GROUP_ENV = "QCORE_OPENVINO_DQ_GROUP"


def dynamic_group(widths: Iterable[int]) -> int:
    """The largest of :data:`DYNAMIC_GROUPS` dividing every width in ``widths`` (the smallest when none does)."""
    found = set(widths)
    return next((g for g in DYNAMIC_GROUPS if all(w % g == 0 for w in found)), DYNAMIC_GROUPS[-1])


def matmul_widths(model: Any) -> list[int]:
    """The input width of every ``MatMul`` of an ``openvino.Model`` whose second operand has a static 2-D shape
    (a weight)."""
    widths = []
    for op in model.get_ordered_ops():
        if op.get_type_name() != "MatMul":
            continue
        shape = op.input(1).get_partial_shape()
        if shape.is_static and len(shape) == 2:
            dims = shape.to_shape()
            widths.append(int(dims[1] if op.get_transpose_b() else dims[0]))
    return widths


class OpenVinoRuntimeTarget(OnnxTarget):
    """OpenVINO's CPU plugin (``openvino`` package) on the exported ONNX file."""

    name = "openvino-runtime"
    aliases = ("ov", "openvino_runtime")
    runtime = "OpenVINO runtime (openvino package), CPU plugin (the exported ONNX QDQ file)"
    module = "openvino"
    reads_paddle = ("legacy",)
    default_grids = "unsigned"
    # transposed convs run int8 (a u8 Deconvolution, measured) from both families: legacy programs, read by its
    # Paddle frontend, read the int8 weight through cast -> multiply (as for the bundled engine); PIR programs
    # through the export (DequantizeLinear per output channel, the weight's axis 1)
    int8_ops = ONNX_INT8_OPS | {"conv2d_transpose"}
    activation_matmuls = OPENVINO_ATTENTION
    float_dequant_weights = frozenset({"conv2d_transpose"})
    min_int8_work = SMALL_MODEL  # measured on both OpenVINO targets (:mod:`qcore.deploy.openvino`)

    def plan(self, graph: Graph, targets: list[OpTarget], skip_patterns: Iterable[str] = (), *,
             residual_add: bool = True, calibrated: bool = True) -> tuple[list[OpTarget], set[str]]:
        """Residual joins, and every reader of a quantized conv's output that a product of two activations
        scales (squeeze-excite): all of them read its one quantized copy, as NNCF places it (module doc)."""
        extra, float_inputs = super().plan(graph, targets, skip_patterns, residual_add=residual_add,
                                           calibrated=calibrated)
        if not calibrated:
            return extra, float_inputs
        planned = {t.op.key for t in [*targets, *extra]}
        return extra + excited_readers(graph, targets, planned, self.int8_ops), float_inputs

    def rules(self, graph: Graph, targets: list[OpTarget], float_inputs: Iterable[str] = ()) -> ModelRules:
        return OutputReaderRules(self, graph, targets)

    def compile_config(self, threads: int, precision: str | None = None, widths: Iterable[int] = ()
                       ) -> dict[str, Any]:
        """The CPU plugin's settings a predictor compiles with (``precision``: f32 / bf16, default the
        environment's or the runtime's; ``widths``: the model's matmul input widths, :func:`dynamic_group`;
        0 on a CPU without VNNI, where the plugin keeps float inputs)."""
        group = os.environ.get(DYNAMIC_GROUP_ENV, str(dynamic_group(widths) if host.has_vnni() else 0))
        if not group.isdigit():
            raise ConfigError(f"{DYNAMIC_GROUP_ENV}={group!r} is not valid; valid choices: an int >= 0 "
                              "(input channels per run-time int8 group; 0 turns it off)")
        config: dict[str, Any] = {"INFERENCE_NUM_THREADS": threads, "PERFORMANCE_HINT": "LATENCY",
                                  "DYNAMIC_QUANTIZATION_GROUP_SIZE": group}
        precision = precision or os.environ.get(PRECISION_ENV) or None
        if precision:
            config["INFERENCE_PRECISION_HINT"] = precision
        return config

    def load(self, model_file: Path, threads: int, precision: str | None = None) -> OnnxPredictor:
        import openvino as ov

        core = ov.Core()
        model = core.read_model(str(model_file))
        compiled = core.compile_model(model, "CPU", self.compile_config(threads, precision, matmul_widths(model)))
        request = compiled.create_infer_request()
        outputs = list(compiled.outputs)

        def run(feed: Any) -> list[Any]:
            result = request.infer(dict(feed))
            return [result[o].copy() for o in outputs]

        return OnnxPredictor([i.get_any_name() for i in compiled.inputs], run, model_file)

    def describe(self) -> dict[str, Any]:
        import openvino as ov

        precision = ov.Core().get_property("CPU", "INFERENCE_PRECISION_HINT")
        return {"runtime": self.runtime, "version": ov.get_version(), "float_precision": str(precision),
                "dynamic_quantization_groups": os.environ.get(
                    DYNAMIC_GROUP_ENV, "per model" if host.has_vnni() else "off (this CPU has no VNNI)")}


TARGET = OpenVinoRuntimeTarget()
