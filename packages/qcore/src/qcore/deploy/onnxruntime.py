"""ONNX Runtime (CPU execution provider) running the exported QDQ model.

Facts (ONNX Runtime 1.32, measured here where the text says so):

* Int8 kernels run only for U8S8: uint8 activations, int8 weights; the export writes uint8
  activations (a symmetric int8 grid is uint8 with zero point 128, the same levels).
* A ``QuantizeLinear -> DequantizeLinear`` pair is fused into the int8 op it feeds only when it
  feeds that op alone: the export writes one pair per reader.
* A ``Relu`` between an op and its output's ``QuantizeLinear`` is dropped (so the op fuses) only
  when the zero point is the lowest code: relu outputs need their unsigned grid, which the
  asymmetric grids (the default for this target) give them (zero point 0 over ``[0, t]``).
* A ``MatMul`` whose weight is int8 and whose input carries no QDQ (``quant_post_dynamic``) quantizes
  its input at run time: ``DynamicQuantizeLinear -> MatMulInteger``, which it fuses into one
  int8 kernel (what its own ``quantize_dynamic`` writes).
* Its graph optimizer folds the rest at session creation (``ORT_ENABLE_ALL``).
"""

from __future__ import annotations

from pathlib import Path

from .onnx_runtimes import OnnxPredictor, OnnxTarget


class OnnxRuntimeTarget(OnnxTarget):
    """ONNX Runtime's CPU execution provider."""

    name = "onnxruntime"
    aliases = ("ort",)
    runtime = "ONNX Runtime, CPU execution provider (the exported ONNX QDQ file)"
    module = "onnxruntime"
    asymmetric_by_default = True
    dynamic_matmuls = True

    def load(self, onnx_file: Path, threads: int) -> OnnxPredictor:
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.log_severity_level = 3
        session = ort.InferenceSession(str(onnx_file), options, providers=["CPUExecutionProvider"])
        return OnnxPredictor([i.name for i in session.get_inputs()], lambda feed: session.run(None, dict(feed)),
                             onnx_file)


TARGET = OnnxRuntimeTarget()
