"""The inputs a command's float model declares, read once per run (loading a model for them is not free)."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from types import MappingProxyType

from qcore.model_io import ModelFiles, load_model


@functools.cache
def feed_specs(files: ModelFiles) -> Mapping[str, tuple[tuple[int, ...], str]]:
    """``{feed_name: (shape, dtype)}`` of the model at ``files``, in feed order; the model is loaded once."""
    return MappingProxyType(load_model(files).feed_specs())


def first_feed(files: ModelFiles) -> str:
    """The name of the model's first input."""
    return next(iter(feed_specs(files)))
