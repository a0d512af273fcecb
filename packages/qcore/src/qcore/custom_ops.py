"""Custom ops a saved program may hold, registered before Paddle reads the program.

The executor and ``paddle.inference`` read only programs whose custom ops are registered in the
process, so an op's library is loaded before the program is loaded or a predictor is created. Each
op comes from a method package's module, imported by name (qcore depends on none of them), whose
``require()`` loads the op or raises an error saying in one line what to install.
"""

from __future__ import annotations

import importlib
from pathlib import Path

from .errors import ConfigError

#: custom op type -> (module whose ``require()`` registers it, the pip package that ships the module)
PROVIDERS = {"qembed_lookup": ("qembed.ext", "paddle-quant-embed")}


def register_custom_ops(program: bytes | Path) -> list[str]:
    """Register the custom ops the saved ``program`` (its bytes, or its file) holds; returns their types."""
    data = program.read_bytes() if isinstance(program, Path) else program
    found = [op for op in PROVIDERS if op.encode() in data]
    for op in found:
        module, package = PROVIDERS[op]
        try:
            provider = importlib.import_module(module)
        except ImportError:
            raise ConfigError(f"the model uses the custom op {op}, which {package} provides; pip install {package}"
                              ) from None
        provider.require()
    return found
