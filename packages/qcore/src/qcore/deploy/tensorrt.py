"""Paddle Inference's TensorRT subgraph engine in int8 (GPU). **Not run here: no GPU.**

The rules follow Paddle's TensorRT QDQ handling (facts from Paddle's passes, not measured):
``delete_quant_dequant_linear_op_pass`` removes each activation QDQ pair and records its scale
on the reading op, ``delete_weight_dequant_linear_op_pass`` turns int8-stored weights back into
float for TensorRT to re-quantize with the recorded per-channel scales, and the TensorRT
converters then build int8 layers for convs (transposed ones too), matmuls / fully connected
layers, elementwise adds and pools whose inputs carry scales. Per-channel weight scales must be
along the output channel, which is what every quantizer here writes. Residual joins get both
inputs quantized so the add runs int8 between int8 convs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import paddle

from .base import DeployTarget

if TYPE_CHECKING:
    from paddle import inference


class TensorRtTarget(DeployTarget):
    """TensorRT int8 through ``Config.enable_tensorrt_engine`` (needs a CUDA build and TensorRT)."""

    name = "tensorrt"
    aliases = ("trt",)
    runtime = "Paddle Inference's TensorRT engine, int8 (GPU)"
    int8_ops = frozenset({
        "conv2d", "depthwise_conv2d", "conv2d_transpose", "mul", "matmul", "matmul_v2", "elementwise_add", "pool2d",
    })
    int8_families = ("legacy", "pir")
    residual_adds = "both"

    def unavailable(self) -> str | None:
        if not paddle.is_compiled_with_cuda():
            return "this Paddle build has no CUDA (install paddlepaddle-gpu on a machine with a GPU and TensorRT)"
        from paddle import inference

        if inference.get_trt_compile_version() == (0, 0, 0):
            return "this Paddle build has no TensorRT support (use a paddlepaddle-gpu wheel built with TensorRT)"
        return None

    def configure(self, config: inference.Config, threads: int) -> None:
        from paddle import inference

        config.enable_use_gpu(256, 0)
        config.enable_tensorrt_engine(
            workspace_size=1 << 30, max_batch_size=1, min_subgraph_size=3,
            precision_mode=inference.PrecisionType.Int8, use_static=False, use_calib_mode=False,
        )  # fmt: skip


TARGET = TensorRtTarget()
