"""qqat: quantization-aware training for Paddle 3.

* Dygraph: ``QAT(config).quantize(model)`` wraps Conv2D / Linear layers with straight-through
  fake quantization (optionally PACT), ``QAT.save_quantized_model`` exports the deployable
  QDQ model (PIR ``.json`` or legacy ``.pdmodel``) with the learned thresholds.
* Static: ``quant_aware(program, ...)`` adds fake-quant ops to a training or test program,
  ``convert(program, ...)`` freezes the learned scales into the deployable form.
* Paddle's ``QuantConfig`` flow (PaddleSlim 2.6's names): ``SlimQAT(SlimQuantConfig(...)).quantize(model)``
  with quanter factories per layer type (Paddle's or ``qqat.quanters``' PACT / LSQ+), ``convert`` to
  Paddle's ``LinearQuanter`` / ``LinearDequanter`` layers.
"""

from __future__ import annotations

import qcore  # noqa: F401  (before Paddle: qcore hides the notice importing Paddle prints)

from .dygraph import QAT
from .fake_quant import fake_quantize_ste, pact_clip
from .infermodel import export_quant_infermodel, quant_aware_with_infermodel
from .slim_qat import SlimQAT, SlimQuantConfig
from .static import convert, int8_values, quant_aware

__version__ = "0.1.0"

__all__ = [
    "QAT", "SlimQAT", "SlimQuantConfig", "__version__", "convert", "export_quant_infermodel", "fake_quantize_ste",
    "int8_values", "pact_clip", "quant_aware", "quant_aware_with_infermodel",
]
