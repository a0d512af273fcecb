"""Deployment targets: one module per runtime a quantized model is made for and verified on.

================ ============================================== ==============================
name             runtime                                        int8 kernels for
================ ============================================== ==============================
onednn           Paddle Inference + oneDNN int8 passes (CPU)    legacy programs
openvino         Paddle Inference's bundled OpenVINO engine     legacy programs
tensorrt         Paddle Inference's TensorRT engine (GPU)       legacy and PIR (not run here)
native           Paddle's float kernels (reference)             nothing: exact simulation
onnxruntime      ONNX Runtime on the ONNX QDQ export (CPU)      legacy and PIR
openvino-runtime OpenVINO runtime on the ONNX QDQ export (CPU)  legacy and PIR
================ ============================================== ==============================

``get_target(None)`` is the default of every quantizer: oneDNN's rules, whose output is also
correct on every other runtime (it only keeps a few more layers float than OpenVINO needs).
"""

from __future__ import annotations

from .base import DeployTarget, ModelRules, OpTarget, find_targets
from .onnx_runtimes import OnnxPredictor, OnnxTarget
from .registry import BACKEND_NAMES, TARGETS, available_targets, get_target
from .session import Deployment, Targets

__all__ = [
    "BACKEND_NAMES", "TARGETS", "DeployTarget", "Deployment", "ModelRules", "OnnxPredictor", "OnnxTarget", "OpTarget",
    "Targets", "available_targets", "find_targets", "get_target",
]
