"""qqat: quantization-aware training for Paddle 3.

First slice of issue 3: differentiable fake quantization with a straight-through estimator
(:func:`fake_quantize_ste`) and the PACT learnable clip (:func:`pact_clip`). Dygraph QAT
layer wrapping, static ``quant_aware`` and ``convert`` are not yet implemented.
"""

from __future__ import annotations

from .fake_quant import fake_quantize_ste, pact_clip

__version__ = "0.1.0"

__all__ = ["__version__", "fake_quantize_ste", "pact_clip"]
