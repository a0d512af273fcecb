"""The inputs a command's model declares, read once per run (loading a model for them is not free)."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType

from qcore import ONNX_INSTALL
from qcore.errors import ConfigError, ModelFormatError
from qcore.model_io import ModelFiles, load_model


@functools.cache
def feed_specs(files: ModelFiles | Path) -> Mapping[str, tuple[tuple[int, ...], str]]:
    """``{feed_name: (shape, dtype)}`` of the model at ``files`` (a Paddle model, or an ``.onnx`` file), in feed
    order, -1 for a free dimension; the model is loaded once."""
    if isinstance(files, Path):
        return MappingProxyType(_onnx_feed_specs(files))
    return MappingProxyType(load_model(files).feed_specs())


def first_feed(files: ModelFiles) -> str:
    """The name of the model's first input."""
    return next(iter(feed_specs(files)))


def _onnx_feed_specs(path: Path) -> dict[str, tuple[tuple[int, ...], str]]:
    try:
        import onnx
        from onnx.helper import tensor_dtype_to_np_dtype
    except ImportError:
        raise ConfigError(f"{path} is an ONNX file and reading it needs onnx ({ONNX_INSTALL})") from None
    try:
        graph = onnx.load(str(path), load_external_data=False).graph
    except Exception as exc:  # onnx raises DecodeError and others for a file that is not ONNX
        raise ModelFormatError(f"{path} is not an ONNX model ({str(exc).strip() or type(exc).__name__}); "
                               "check the path") from None
    weights = {init.name for init in graph.initializer}
    return {
        value.name: (tuple(d.dim_value if d.HasField("dim_value") else -1 for d in value.type.tensor_type.shape.dim),
                     str(tensor_dtype_to_np_dtype(value.type.tensor_type.elem_type)))
        for value in graph.input if value.name not in weights
    }
