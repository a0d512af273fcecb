"""Reading what an option names: comma-separated numbers, a JSON config file, a ``.npy`` array.

Bad input ends in one line naming the option and the fix: an argparse usage error for numbers,
a ``ConfigError`` for a config file, a ``DataError`` for an array.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from qcore.errors import ConfigError, DataError


def numbers(kind: type[int] | type[float], example: str) -> Callable[[str], tuple[Any, ...]]:
    """An argparse ``type``: comma-separated ``kind`` values, such as ``example``."""
    what = "whole numbers" if kind is int else "numbers"

    def parse(text: str) -> tuple[Any, ...]:
        try:
            return tuple(kind(v) for v in text.split(","))
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{text!r} is not a comma-separated list of {what}, e.g. {example}"
            ) from None

    return parse


def json_config(path: Path, option: str = "--config") -> dict[str, Any]:
    """The JSON object of config keys in ``path``."""
    try:
        config = json.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{option} {path}: no such file; give a JSON file of config keys") from None
    except (OSError, ValueError) as exc:  # unreadable, not text, or not JSON (json.JSONDecodeError)
        raise ConfigError(f"{option} {path} is not JSON ({exc}); write a JSON object of config keys") from None
    if not isinstance(config, dict):
        raise ConfigError(f"{option} {path} holds a {type(config).__name__}, not a JSON object of config keys")
    return config


def load_npy(path: Path, option: str, mmap: bool = False) -> np.ndarray:
    """The numeric array in the ``.npy`` file ``path`` (memory-mapped with ``mmap``)."""
    try:
        return np.load(path, mmap_mode="r" if mmap else None)
    except FileNotFoundError:
        raise DataError(f"{option} {path}: no such file; give a .npy array") from None
    except (OSError, ValueError) as exc:
        if _holds_objects(path):
            raise DataError(
                f"{option} {path} holds Python objects (dtype object), not one numeric array; save samples of one "
                "shape with np.save(path, np.stack(samples))"
            ) from None
        raise DataError(f"{option} {path} is not a .npy array ({exc}); write one with np.save") from None


def _holds_objects(path: Path) -> bool:
    """Whether the ``.npy`` header of ``path`` declares Python objects (read without unpickling anything)."""
    try:
        with open(path, "rb") as file:
            version = np.lib.format.read_magic(file)
            read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
            return bool(read(file)[2].hasobject)
    except (OSError, ValueError):
        return False
