"""Differentiable fake quantization for dygraph quantization-aware training.

``fake_quantize_ste`` runs the same symmetric math as :func:`qcore.quant.fake_quantize`
(``scale = threshold / qmax``, ``q = clip(round(x / scale), -qmax, qmax)``, round half to even)
but as Paddle ops, with a straight-through estimator (STE) for the gradient.
``pact_clip`` is the PACT clip whose bound ``alpha`` is learnable.
"""

from __future__ import annotations

import paddle
import paddle.nn.functional as F

from qcore.quant import qmax as _qmax

__all__ = ["fake_quantize_ste", "pact_clip"]


def fake_quantize_ste(x: paddle.Tensor, threshold: paddle.Tensor | float, bits: int = 8) -> paddle.Tensor:
    """Quantize then dequantize ``x`` with ``scale = threshold / qmax(bits)``.

    Forward: ``clip(round(x / scale), -qmax, qmax) * scale``; a zero threshold gives zeros.
    Backward w.r.t. ``x``: the straight-through estimator, 1 where ``|x| <= threshold`` and
    0 outside. ``threshold`` gets no gradient here (learn a clip bound with :func:`pact_clip`).
    ``threshold`` is a float or a tensor broadcastable to ``x`` (e.g. per channel).
    Raises :class:`qcore.errors.ConfigError` if ``bits`` is not an integer from 2 to 16.
    """
    qm = float(_qmax(bits))
    t = paddle.to_tensor(threshold, dtype=x.dtype) if not isinstance(threshold, paddle.Tensor) else threshold
    t = t.detach().astype(x.dtype)
    safe_t = paddle.where(t > 0, t, paddle.ones_like(t))
    # x / threshold * qmax (not x / (threshold / qmax)) keeps exact ties such as 0.5 * 127 exact.
    q = paddle.clip(paddle.round(x.detach() / safe_t * qm), -qm, qm)
    fq = paddle.where(t > 0, q * (safe_t / qm), paddle.zeros_like(q))
    mask = (paddle.abs(x.detach()) <= t).astype(x.dtype)
    passthrough = x * mask
    return passthrough + (fq - passthrough).detach()


def pact_clip(x: paddle.Tensor, alpha: paddle.Tensor) -> paddle.Tensor:
    """PACT clip ``clip(x, -alpha, alpha)`` with a learnable bound ``alpha``.

    Written as ``x - relu(x - alpha) + relu(-x - alpha)`` so that ``d/d alpha`` is 1 where
    ``x > alpha``, -1 where ``x < -alpha`` and 0 inside; ``d/dx`` is 1 inside and 0 outside.
    """
    return x - F.relu(x - alpha) + F.relu(-x - alpha)
