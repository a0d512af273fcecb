"""Op-type tables and option sets of the ``paddleslim.quant`` API.

The three op-type tables keep the names and values given in the PaddleSlim documentation
(section "量化训练方法的参数配置"). The documentation prints them as lists; here every table
is a tuple so no caller can change a value another caller relies on. Copy with ``list(...)``
when a mutable list is needed.

Op names are those of the legacy ProgramDesc (``conv2d``, ``mul``, ...). The op-type tables
are read off :data:`qcore.optable.OP_TABLE` (by kind, in its order), which also translates
each name to the PIR names (``pd_op.conv2d``, ...); only ``TENSORRT_OP_TYPES``, a config
value of the seeds rather than a fact about ops, is written out.
The PTQ ``algo`` names are read off :mod:`qcore.thresholds`, where the algorithms are.
"""

from __future__ import annotations

from .optable import FC, LOOKUP, RECURRENT, activation_kinds, seed_types, weighted_kinds
from .thresholds import LAYERWISE_ALGOS, PTQ_ALGO_CHOICES

# Op types quantized when a model is meant for TensorRT (config key ``for_tensorrt``).
TENSORRT_OP_TYPES: tuple[str, ...] = (
    "mul",
    "conv2d",
    "pool2d",
    "depthwise_conv2d",
    "elementwise_add",
    "leaky_relu",
)

# Ops with a weight: the weight and the activation input are both quantized.
# Seed 000 (the current page) lists 'conv2d_transpose'; the older seed 001 has only
# ['conv2d', 'depthwise_conv2d', 'mul']. We follow 000.
TRANSFORM_PASS_OP_TYPES: tuple[str, ...] = seed_types(*weighted_kinds(), seed=True)

# Ops without a weight: only their activation inputs get a quantize/dequantize pair.
QUANT_DEQUANT_PASS_OP_TYPES: tuple[str, ...] = seed_types(*activation_kinds(), seed=True)

# Not in the seeds. Since Paddle 2, paddle.nn.Linear and fc are exported as 'matmul_v2'
# (older programs: 'matmul') instead of 'mul', so a Paddle 3 model often has no 'mul' op
# at all. Accepting these names lets users quantize their Linear layers.
MATMUL_OP_TYPES: tuple[str, ...] = seed_types(FC, seed=False)

# Every value accepted in the config key ``quantize_op_types``.
SUPPORTED_QUANTIZE_OP_TYPES: tuple[str, ...] = (
    TRANSFORM_PASS_OP_TYPES + QUANT_DEQUANT_PASS_OP_TYPES + MATMUL_OP_TYPES
)

# Values of the config keys ``weight_quantize_type`` and ``activation_quantize_type``.
WEIGHT_QUANTIZE_TYPES: tuple[str, ...] = (
    "abs_max",
    "channel_wise_abs_max",
    "range_abs_max",
    "moving_average_abs_max",
)
ACTIVATION_QUANTIZE_TYPES: tuple[str, ...] = ("abs_max", "range_abs_max", "moving_average_abs_max")

# Data types of quantized values (config key ``dtype``). The seeds support 'int8' and name
# 'uint8' as a possible value; uint8 activations are what ONNX Runtime's int8 kernels run.
QUANT_DTYPES: tuple[str, ...] = ("int8", "uint8")

# Dygraph QAT: values of ``weight_preprocess_type`` / ``activation_preprocess_type``.
PREPROCESS_TYPES: tuple[str | None, ...] = (None, "PACT")

# Dygraph QAT: class names of paddle.nn layers whose weight can be fake-quantized
# (config key ``quantizable_layer_type``; the seeds' default is ['Conv2D', 'Linear']).
QUANTIZABLE_LAYER_TYPES: tuple[str, ...] = ("Conv2D", "Linear", "Conv2DTranspose")

# Post-training quantization: the ``algo`` names of the seeds, as they spell them ('direct' is their older
# name of 'abs_max'), read off the one algo vocabulary, qcore.thresholds.PTQ_ALGO_CHOICES, which also
# holds q*'s layer-wise 'auto'.
PTQ_ALGOS: tuple[str, ...] = tuple({"kl": "KL"}.get(a, a) for a in PTQ_ALGO_CHOICES if a not in LAYERWISE_ALGOS)

# Not in the seeds: the op types whose weight a weight-only quantizer can store as int8 (quant_post_dynamic's
# ``quantizable_op_type``, quant_embedding's ``weights``): the weighted ones above and Paddle 1.x's ``gru``.
WEIGHT_ONLY_OP_TYPES: tuple[str, ...] = seed_types(*weighted_kinds(), RECURRENT)

# quant_embedding: op types whose table can be quantized, and the quantize types.
EMBEDDING_OP_TYPES: tuple[str, ...] = seed_types(LOOKUP, seed=True)
EMBEDDING_QUANTIZE_TYPES: tuple[str, ...] = ("abs_max", "log")

__all__ = [
    "ACTIVATION_QUANTIZE_TYPES",
    "EMBEDDING_OP_TYPES",
    "EMBEDDING_QUANTIZE_TYPES",
    "MATMUL_OP_TYPES",
    "PREPROCESS_TYPES",
    "PTQ_ALGOS",
    "QUANTIZABLE_LAYER_TYPES",
    "QUANT_DEQUANT_PASS_OP_TYPES",
    "QUANT_DTYPES",
    "SUPPORTED_QUANTIZE_OP_TYPES",
    "TENSORRT_OP_TYPES",
    "TRANSFORM_PASS_OP_TYPES",
    "WEIGHT_ONLY_OP_TYPES",
    "WEIGHT_QUANTIZE_TYPES",
]
