"""Exception hierarchy shared by every q* package.

Every message names the offending file/op/tensor and says how to fix it, in one line.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class QuantError(Exception):
    """Base class of all errors raised by the toolkit."""


class ConfigError(QuantError, ValueError):
    """A configuration key or value is invalid."""


class ModelFormatError(QuantError, ValueError):
    """A model directory or file is missing or not in a format we can read."""


class GraphError(QuantError, ValueError):
    """A graph rewrite cannot be applied (op, tensor or parameter not found, shape mismatch)."""


class OutputError(QuantError, ValueError):
    """An output location cannot be written safely (a file, the input itself, another model, read-only)."""


class DataError(QuantError, ValueError):
    """Calibration or table data is empty, non-finite, or has the wrong shape."""


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """Return ' (did you mean 'x'?)' for the closest choice, or '' when nothing is close."""
    by_lower = {str(c).lower(): str(c) for c in choices}
    close = difflib.get_close_matches(str(word).lower(), list(by_lower), n=1, cutoff=0.6)
    return f" (did you mean '{by_lower[close[0]]}'?)" if close else ""


class ExportError(QuantError, ValueError):
    """A model cannot be written in an exchange format (ONNX): a missing converter, an unsupported grid or op."""
