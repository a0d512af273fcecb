"""Weight-only quantization of matmul weights for LLMs: one module per algorithm choosing group-wise codes
(:mod:`qcore.groupwise`): round to nearest is :func:`qcore.groupwise.quantize_groups` itself, GPTQ
(:mod:`.gptq`) corrects each input channel's rounding error on the channels not yet quantized."""
