"""The user-defined quantization hooks of static ``quant_aware``, shared by PIR and legacy programs.

A hook takes the tensor (``paddle.pir.Value`` or legacy ``Variable``) and returns the tensor the op
reads instead: ``*_preprocess_func`` runs first, then ``*_quantize_func`` replaces the built-in fake
quantization. Parameters the hooks create are initialised with :func:`initialise_new`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import paddle

from qcore.paddle_env import cpu_executor

Hook = Callable[[Any], Any] | None


def apply_hooks(x: Any, hooks: tuple[Hook, Hook], builtin: Callable[[Any], Any]) -> Any:
    """``preprocess(x)`` (when given), then ``quantize`` of it or, without one, ``builtin`` of it."""
    preprocess, quantize = hooks
    if preprocess is not None:
        x = preprocess(x)
    return quantize(x) if quantize is not None else builtin(x)


def initialise_new(startup: Any, scope: Any, executor: Any) -> None:
    """Run ``startup`` in a scratch scope and copy into ``scope`` only the variables it lacks, so quantizing
    the test program never resets what training learned."""
    scratch = paddle.static.Scope()
    with paddle.static.scope_guard(scratch):
        (executor or cpu_executor()).run(startup)
    for name in scratch.local_var_names():
        if name not in ("feed", "fetch") and scope.find_var(name) is None:  # not the executor's feed/fetch lists
            value = np.array(scratch.find_var(name).get_tensor())
            scope.var(name).get_tensor().set(value, paddle.CPUPlace())
