"""The OpenVINO runtime from PyPI (``openvino``) running the exported QDQ model on its CPU plugin.

Facts (OpenVINO 2026.4, measured here where the text says so):

* It reads ONNX files, PIR exports included (its Paddle frontend reads legacy ``.pdmodel`` files but
  not PIR ``.json``), and turns each QDQ pair into a FakeQuantize that its low-precision
  transformations run with int8 kernels.
* Its default CPU float precision is bf16 where the CPU has it (AVX-512 BF16 / AMX): the float
  to beat. :data:`FLOAT_PRECISION` names what a predictor runs; ``QCORE_OPENVINO_PRECISION``
  (``f32`` / ``bf16``) chooses.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from .onnx_runtimes import OnnxPredictor, OnnxTarget

#: Set to f32 or bf16 to choose OpenVINO's inference precision (unset: the runtime's default for this CPU).
PRECISION_ENV = "QCORE_OPENVINO_PRECISION"


class OpenVinoRuntimeTarget(OnnxTarget):
    """OpenVINO's CPU plugin (``openvino`` package) on the exported ONNX file."""

    name = "openvino-runtime"
    aliases = ("ov", "openvino_runtime")
    runtime = "OpenVINO runtime (openvino package), CPU plugin (the exported ONNX QDQ file)"
    module = "openvino"

    def load(self, onnx_file: Path, threads: int, precision: str | None = None) -> OnnxPredictor:
        import openvino as ov

        core = ov.Core()
        config: dict[str, Any] = {"INFERENCE_NUM_THREADS": threads, "PERFORMANCE_HINT": "LATENCY"}
        precision = precision or os.environ.get(PRECISION_ENV) or None
        if precision:
            config["INFERENCE_PRECISION_HINT"] = precision
        compiled = core.compile_model(core.read_model(str(onnx_file)), "CPU", config)
        request = compiled.create_infer_request()
        outputs = list(compiled.outputs)

        def run(feed: Any) -> list[Any]:
            result = request.infer(dict(feed))
            return [result[o].copy() for o in outputs]

        return OnnxPredictor([i.get_any_name() for i in compiled.inputs], run, onnx_file)

    def describe(self) -> dict[str, Any]:
        import openvino as ov

        precision = ov.Core().get_property("CPU", "INFERENCE_PRECISION_HINT")
        return {"runtime": self.runtime, "version": ov.get_version(), "float_precision": str(precision)}


TARGET = OpenVinoRuntimeTarget()
