"""Calibration samples from what a command line can name: a ``.npy`` file, a directory of
images or ``.npy`` files, or a Python function (``module:function`` / ``file.py:function``).

Every source becomes a seed-style ``sample_generator``: a callable returning an iterator of
samples for a one-input model (multi-input models take a Python function yielding tuples or
feed dicts).
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from qcore.errors import DataError

from .options import load_npy

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp")


def sample_source(
    spec: str,
    image_shape: Callable[[], Sequence[int]],
    mean: Sequence[float] = (0.0,),
    std: Sequence[float] = (1.0,),
) -> Callable[[], Iterable[Any]]:
    """The sample generator ``spec`` names; images are resized to ``image_shape()`` (C, H, W),
    which is only called for a folder (reading the model's input shape can mean loading it)."""
    path = Path(spec)
    if path.suffix == ".npy" and path.is_file():
        array = load_npy(path, "--data", mmap=True)
        return lambda: iter(array)
    if path.is_dir():
        return _directory(path, image_shape, mean, std)
    if ":" in spec and not path.exists():
        return _function(spec)
    raise DataError(
        f"calibration data {spec!r} is not a .npy file, a directory or module:function; "
        "pass a .npy array of samples, a folder of images/.npy files, or my_module:my_generator"
    )


def _directory(
    folder: Path, image_shape: Callable[[], Sequence[int]], mean: Sequence[float], std: Sequence[float]
) -> Callable[[], Iterator[np.ndarray]]:
    files = sorted(p for p in folder.iterdir() if p.suffix.lower() in (".npy", *IMAGE_SUFFIXES))
    if not files:
        raise DataError(f"{folder} holds no images ({', '.join(IMAGE_SUFFIXES)}) or .npy files; point --data at them")
    shape = tuple(image_shape()) if any(f.suffix != ".npy" for f in files) else ()

    def samples() -> Iterator[np.ndarray]:
        for file in files:
            yield load_npy(file, "--data") if file.suffix == ".npy" else load_image(file, shape, mean, std)

    return samples


def load_image(file: Path, shape: tuple[int, ...], mean: Sequence[float], std: Sequence[float]) -> np.ndarray:
    """One image as a float32 CHW array of ``shape``: resized, scaled to [0, 1], then normalised."""
    from PIL import Image  # Pillow comes with paddlepaddle

    if len(shape) != 3 or min(shape) < 1:
        raise DataError(
            f"images need a fixed (C, H, W) model input, got {shape}; pass --input-shape C,H,W"
        )
    channels, height, width = shape
    if channels not in (1, 3):
        raise DataError(f"images become 1 or 3 channels, but the model input has {channels}; feed .npy files instead")
    with Image.open(file) as img:
        pixels = np.asarray(img.convert("L" if channels == 1 else "RGB").resize((width, height)), dtype=np.float32)
    chw = pixels.reshape(height, width, channels).transpose(2, 0, 1) / 255.0
    mean_a = np.asarray(mean, np.float32).reshape(-1, 1, 1)
    std_a = np.asarray(std, np.float32).reshape(-1, 1, 1)
    return ((chw - mean_a) / std_a).astype(np.float32)


def _function(spec: str) -> Callable[[], Iterable[Any]]:
    return load_function(spec, "--data", "module:function returning samples")


def load_function(spec: str, option: str, expects: str) -> Callable[..., Any]:
    """The function ``module:function`` or ``file.py:function`` names; one DataError line naming ``option``."""
    target, _, name = spec.rpartition(":")
    if target.endswith(".py"):
        file = Path(target)
        if not file.is_file():
            raise DataError(f"{option} {spec}: file {file} does not exist")
        module_spec = importlib.util.spec_from_file_location(file.stem, file)
        assert module_spec is not None and module_spec.loader is not None
        module = importlib.util.module_from_spec(module_spec)
        module_spec.loader.exec_module(module)
    else:
        try:
            module = importlib.import_module(target)
        except ImportError as exc:
            raise DataError(f"cannot import {target!r} for {option} {spec}: {exc}") from None
    function = getattr(module, name, None)
    if not callable(function):
        raise DataError(f"{target} has no function {name!r}; {option} expects {expects}")
    return function
