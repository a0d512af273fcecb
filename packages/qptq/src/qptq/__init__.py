"""qptq: post-training quantization (dynamic weight-only and static calibrated) for Paddle 3."""

import qcore  # noqa: F401  (before Paddle: qcore hides the notice importing Paddle prints)

from .dygraph import PTQ
from .dynamic import quant_post_dynamic, quant_post_only_weight
from .static import PostTrainingQuantization, quant_post, quant_post_static

__version__ = "0.1.0"
__all__ = [
    "PTQ", "PostTrainingQuantization", "quant_post", "quant_post_dynamic", "quant_post_only_weight",
    "quant_post_static",
]
