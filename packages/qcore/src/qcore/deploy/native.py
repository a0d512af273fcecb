"""Paddle's own float kernels (``paddle.inference`` with oneDNN off): the reference runtime.

Nothing runs in int8: every ``quantize_linear`` / ``dequantize_linear`` runs as the float
simulation the executor runs, so a model deploys exactly as simulated (only the weights are
smaller on disk). Useful to check a quantized model's accuracy where no int8 runtime is at
hand, and as the baseline the other targets are verified against.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..optable import OP_TABLE
from .base import DeployTarget

if TYPE_CHECKING:
    from paddle import inference


class NativeTarget(DeployTarget):
    """``paddle.inference`` on CPU with oneDNN disabled."""

    name = "native"
    aliases = ("paddle",)
    runtime = "Paddle Inference, Paddle's float kernels (CPU, oneDNN off)"
    int8_ops = frozenset(OP_TABLE)  # nothing runs int8, so every op's simulation is exact
    int8_families = ()
    residual_adds = "both"
    asymmetric_activations = True

    def configure(self, config: inference.Config, threads: int) -> None:
        config.disable_gpu()
        config.set_cpu_math_library_num_threads(threads)
        config.disable_onednn()


TARGET = NativeTarget()
