"""ONNX Runtime (CPU execution provider) running the exported QDQ model.

Facts (ONNX Runtime 1.32, measured here where the text says so):

* Int8 kernels run only for U8S8: uint8 activations, int8 weights; the export writes uint8
  activations (a symmetric int8 grid is uint8 with zero point 128, the same levels).
* A ``QuantizeLinear -> DequantizeLinear`` pair is fused into the int8 op it feeds only when it
  feeds that op alone: the export writes one pair per reader.
* It fuses ``DequantizeLinear -> Conv -> QuantizeLinear`` into an int8 conv only when the conv's output
  (after its bias) is quantized: a conv followed by a float op (hardswish, a squeeze-excite pool)
  otherwise runs float between dequantize ops, with layout transposes around it (PP-OCR v2 cls:
  0.59x float speed). The same holds for ``QLinearAdd`` (a residual join) and ``QLinearGlobalAveragePool``
  / ``QLinearAveragePool``. :meth:`OnnxRuntimeTarget.plan` quantizes the input of every reader of a
  quantized conv's, join's or average pool's output for that reason (what ONNX Runtime's own quantizer
  does): before, ResNet18's last join and the demo CNN's last conv, read through a relu by a global pool,
  ran float between dequantize ops and layout transposes.
* It moves a ``QuantizeLinear`` ahead of a max pool (the pool then runs on uint8 codes), so a max pool's
  readers are quantized instead of its input (one grid, not two that would leave it float).
* A ``Relu`` between an op and its output's ``QuantizeLinear`` is dropped (so the op fuses) only
  when the zero point is the lowest code: relu outputs need their unsigned grid, which the
  asymmetric grids (the default for this target) give them (zero point 0 over ``[0, t]``); the
  asymmetric grids also won on accuracy here (all-MiniLM-L6-v2: cosine 0.941 against 0.842).
* A ``MatMul`` whose weight is int8 and whose input carries no QDQ (``quant_post_dynamic``) quantizes
  its input at run time: ``DynamicQuantizeLinear -> MatMulInteger``, which it fuses into one
  int8 kernel (what its own ``quantize_dynamic`` writes).
* Its graph optimizer folds the rest at session creation (``ORT_ENABLE_ALL``).
* Its intra-op threads spin after each run by default. With several sessions alive on few cores (the runs of an
  interleaved comparison, RapidOCR's det -> cls -> rec), one session's spinning threads hold the cores the next
  session needs, so a session's time depends on which ran before it. RapidOCR's float pipeline on 2 cores (AVX-512
  VNNI/BF16, 10 pages): 327 ms a page with spinning, 275 ms without; the int8 one 239 / 193 ms. A session alone
  loses a little without it (PP-OCR v2 cls at batch 1: 0.88 -> 1.12 ms; det 88 -> 96 ms), so
  :meth:`OnnxRuntimeTarget.load` turns spinning off: its predictors serve verification and interleaved timing.
* Its CPU execution provider has no int8 transposed conv: ``DequantizeLinear -> ConvTranspose -> QuantizeLinear``
  stays a float ``ConvTranspose`` between dequantize ops (measured, per-tensor and per-channel weights alike;
  its ``QLinearConvTranspose`` belongs to other execution providers), so transposed convs stay float here
  (:data:`TRANSPOSED_CONV_FLOAT`). The export writes them int8 for the targets that run them so
  (``openvino-runtime``).
* Cost rules (``algo="auto"``, :data:`SLOW_DEPTHWISE`, :data:`MIN_WORK`): a QDQ conv runs in NHWC between layout
  transposes, and each QDQ pair costs a pass over the tensor. Around a depthwise conv with few outputs (a few
  ten thousand values per sample) that costs more than its int8 kernel saves: PP-OCR v2 cls (depthwise outputs
  9-38 k values at 48 x 192) ran 1.00-1.56x float all int8 and 0.80-1.18x with its depthwise convs float (batch 1,
  2 threads, AVX-512 VNNI, two runs), while PP-OCRv4 det and rec (depthwise outputs 61 k-2.8 M) ran 0.66-0.74x
  float with or without theirs int8. A whole model of 16 M multiply-adds per sample (the same cls, about 1.5 ms)
  never ran measurably faster in int8 however placed; 700 M (rec) and 3.9 G (det) did.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from ..optable import CONV_KINDS, kind_of
from .base import MinInt8Work, ModelRules, OpTarget, OutputReaderRules, SlowInt8, output_readers
from .onnx_runtimes import OnnxPredictor, OnnxTarget

if TYPE_CHECKING:
    from ..graph import Graph, OpRef


#: Why a transposed conv stays float on ONNX Runtime (module doc).
TRANSPOSED_CONV_FLOAT = ("ONNX Runtime's CPU execution provider has no int8 transposed conv (its QDQ stays a float "
                         "ConvTranspose between dequantize ops, measured on 1.32): int8 would only add rounding")

#: Depthwise convs writing fewer values per sample than this run slower in int8 here (module doc).
SLOW_DEPTHWISE = SlowInt8("depthwise_conv2d", 50_000, "the quantize / dequantize pair and NHWC layout transposes "
                          "around a small depthwise conv cost more than its int8 kernel saves (measured, ONNX "
                          "Runtime 1.32, batch 1)")
#: Models doing less work per sample than this stay float under ``algo="auto"`` (module doc).
MIN_WORK = MinInt8Work(50_000_000, "fixed per-op costs of the quantize / dequantize pairs and layout transposes "
                       "exceed what int8 kernels save (measured 1.0-1.6x float at 16 M, ONNX Runtime 1.32, batch 1)")

#: Activations ONNX Runtime fuses into the int8 op before them (relu; relu6 as Clip) when their output is quantized with
#: the zero point at the lowest code): their input needs no quantize of its own (op type without "pd_op.").
FUSED_ACTIVATIONS = frozenset({"relu", "relu6"})


def _passes_codes(graph: Graph, op: OpRef) -> bool:
    """True for an op ONNX Runtime runs on the codes of the tensor it reads once a quantize follows it: a fused
    activation (:data:`FUSED_ACTIVATIONS`) or a max pool (it moves that quantize ahead of the pool, same codes)."""
    kind = op.type.split(".")[-1]
    return kind in FUSED_ACTIVATIONS or (kind == "pool2d" and graph.attr(op, "pooling_type") == "max")


def _averaging_pool(graph: Graph, op: OpRef) -> bool:
    """An average pool: ONNX Runtime runs it int8 (``QLinearAveragePool`` / ``QLinearGlobalAveragePool``) only
    when its output is quantized too."""
    return op.type.split(".")[-1] == "pool2d" and graph.attr(op, "pooling_type") == "avg"


class OnnxRuntimeTarget(OnnxTarget):
    """ONNX Runtime's CPU execution provider."""

    name = "onnxruntime"
    aliases = ("ort",)
    runtime = "ONNX Runtime, CPU execution provider (the exported ONNX QDQ file)"
    module = "onnxruntime"
    default_grids = "asymmetric"
    dynamic_matmuls = True
    float_ops = {"conv2d_transpose": TRANSPOSED_CONV_FLOAT}
    slow_int8 = (SLOW_DEPTHWISE,)
    min_int8_work = MIN_WORK

    def plan(self, graph: Graph, targets: list[OpTarget], skip_patterns: Iterable[str] = (), *,
             residual_add: bool = True, calibrated: bool = True) -> tuple[list[OpTarget], set[str]]:
        """Residual joins, and the input of each op reading the output of a quantized conv (through its bias add),
        residual join or average pool, so that it runs int8 (``QLinearConv``, ``QLinearAdd``, ``QLinearAveragePool``:
        ONNX Runtime fuses an op only when its output is quantized). Readers are looked for behind relus and max
        pools (:func:`_passes_codes`); an average pool quantized that way is such an op itself. Matmuls run int8
        with a float output (their readers' QDQ would only cost accuracy: all-MiniLM-L6-v2 cosine 0.944 with
        them)."""
        extra, float_inputs = super().plan(graph, targets, skip_patterns, residual_add=residual_add,
                                           calibrated=calibrated)
        if not calibrated:
            return extra, float_inputs
        planned = {t.op.key for t in [*targets, *extra]}
        writers = [t.op for t in targets if t.weight is not None and kind_of(t.op.seed_type) in CONV_KINDS]
        writers += [t.op for t in [*targets, *extra] if _averaging_pool(graph, t.op) or (
            t.op.seed_type == "elementwise_add" and graph.added_param(t.op) is None)]
        while writers:
            found = output_readers(graph, writers, _passes_codes)
            writers = []
            for writer, operands in found:
                for operand in operands:
                    if operand.op.key in planned:
                        continue
                    planned.add(operand.op.key)
                    pool = _averaging_pool(graph, operand.op)
                    extra.append(OpTarget(operand.op, None, [operand], for_conv=writer, runs_float=not pool))
                    if pool:
                        writers.append(operand.op)
        return extra, float_inputs

    def rules(self, graph: Graph, targets: list[OpTarget], float_inputs: Iterable[str] = ()) -> ModelRules:
        return OutputReaderRules(self, graph, targets)

    def load(self, onnx_file: Path, threads: int) -> OnnxPredictor:
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.log_severity_level = 3
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")  # module doc
        session = ort.InferenceSession(str(onnx_file), options, providers=["CPUExecutionProvider"])
        return OnnxPredictor([i.name for i in session.get_inputs()], lambda feed: session.run(None, dict(feed)),
                             onnx_file)


TARGET = OnnxRuntimeTarget()
