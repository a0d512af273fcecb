"""Weight-only quantization of matmul weights for LLMs: one module per algorithm choosing group-wise codes
(:mod:`qcore.groupwise`). Round to nearest is :func:`qcore.groupwise.quantize_groups` itself; :mod:`.gptq`
corrects each input channel's rounding error on the channels not yet quantized; :mod:`.awq` scales input
channels by their activations before rounding; :mod:`.clip_search` shrinks each group's range. All score
candidates by the layer output error on calibration inputs, through the input Hessian
(:class:`.hessian.HessianAccumulator`)."""

from .config import WeightOnlyConfig
from .layer import quantize_

__all__ = ["WeightOnlyConfig", "quantize_"]
