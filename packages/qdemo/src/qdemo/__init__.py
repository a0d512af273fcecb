"""Demo data, the demo CNN and the shared test models of the q* packages.

Nothing here is needed to quantize a model: ``qcore`` and the method packages never import
``qdemo``. It serves ``qcli demo`` / ``qcli qat``, the benchmarks, the documentation's examples
and every package's tests. This module reads the bundled assets; :mod:`qdemo.net` rebuilds the
demo CNN as layers, :mod:`qdemo.qat` fine-tunes it with ``qqat`` (the ``qat`` extra:
``pip install --find-links dist 'paddle-quant-demo[qat]'`` from the built wheels), and :mod:`qdemo.testing`
builds the tiny models the test suites save in every format.

The assets live in ``qdemo/assets/`` and are shipped as package data, so they are available
from an installed ``qdemo`` as well as from a source checkout:

* ``fashion_mnist_subset.npz`` -- uint8 images (N, 28, 28) and int64 labels for the
  ``train`` (6000), ``calib`` (1000, disjoint from train) and ``test`` (2000) splits,
  10 classes, stratified. Fashion-MNIST is (c) 2017 Zalando SE, MIT license
  (see ``LICENSE-fashion-mnist.txt``).
* ``model_pir/inference.{json,pdiparams}`` -- the demo CNN as a Paddle 3 PIR inference model.
* ``model_legacy/inference.{pdmodel,pdiparams}`` -- the same weights as a legacy
  ProgramDesc inference model.

Both models take a float32 input named ``image`` of shape (N, 1, 28, 28), normalised
exactly as :func:`load_demo_data` returns it, and output (N, 10) logits.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from qcore.errors import ConfigError, ModelFormatError, did_you_mean

__version__ = "0.1.0"

#: Mean and standard deviation of Fashion-MNIST pixels (scaled to [0, 1]) used to
#: normalise the model input: ``x = (pixel / 255 - MEAN) / STD``.
PIXEL_MEAN = 0.2860
PIXEL_STD = 0.3530

#: Class names, index = label.
CLASS_NAMES = (
    "T-shirt/top",
    "Trouser",
    "Pullover",
    "Dress",
    "Coat",
    "Sandal",
    "Shirt",
    "Sneaker",
    "Bag",
    "Ankle boot",
)

SPLITS = ("train", "calib", "test")
MODEL_FAMILIES = {
    "pir": ("inference.json", "inference.pdiparams"),
    "legacy": ("inference.pdmodel", "inference.pdiparams"),
}
INPUT_NAME = "image"
INPUT_SHAPE = (1, 28, 28)

_ASSETS = Path(__file__).resolve().parent / "assets"
_DATA_FILE = "fashion_mnist_subset.npz"


def demo_assets_dir() -> Path:
    """Directory holding the bundled demo data and models."""
    return _ASSETS


def normalize_images(images: np.ndarray) -> np.ndarray:
    """Turn uint8 images (N, 28, 28) into the model's float32 input (N, 1, 28, 28)."""
    x = np.asarray(images)
    if x.ndim != 3 or x.shape[1:] != (28, 28):
        raise ConfigError(f"images have shape {x.shape}; expected (N, 28, 28) uint8 pixels")
    x = (x.astype(np.float32) / np.float32(255.0) - np.float32(PIXEL_MEAN)) / np.float32(PIXEL_STD)
    return x[:, None, :, :].astype(np.float32, copy=False)


def load_demo_raw(split: str) -> tuple[np.ndarray, np.ndarray]:
    """Return the raw uint8 images (N, 28, 28) and int64 labels (N,) of a split."""
    if split not in SPLITS:
        raise ConfigError(f"unknown demo split '{split}'{did_you_mean(split, SPLITS)}; use one of {', '.join(SPLITS)}")
    path = _ASSETS / _DATA_FILE
    if not path.is_file():
        raise ModelFormatError(
            f"{path} is missing; reinstall paddle-quant-demo or regenerate it with demo/make_data.py"
        )
    with np.load(path) as data:
        images = data[f"{split}_images"]
        labels = data[f"{split}_labels"].astype(np.int64, copy=False)
    return images, labels


def load_demo_data(split: str) -> tuple[np.ndarray, np.ndarray]:
    """Return normalised float32 images (N, 1, 28, 28) and int64 labels (N,) of a split.

    ``split`` is one of ``'train'``, ``'calib'``, ``'test'``.
    """
    images, labels = load_demo_raw(split)
    return normalize_images(images), labels


def demo_model_dir(family: str = "pir") -> Path:
    """Directory of the pretrained demo model in the given format family.

    ``family`` is ``'pir'`` (``inference.json`` + ``inference.pdiparams``) or
    ``'legacy'`` (``inference.pdmodel`` + ``inference.pdiparams``).
    """
    if family not in MODEL_FAMILIES:
        raise ConfigError(
            f"unknown model family '{family}'{did_you_mean(family, MODEL_FAMILIES)}; "
            f"use one of {', '.join(MODEL_FAMILIES)}"
        )
    path = _ASSETS / f"model_{family}"
    missing = [f for f in MODEL_FAMILIES[family] if not (path / f).is_file()]
    if missing:
        raise ModelFormatError(
            f"{path} lacks {', '.join(missing)}; reinstall paddle-quant-demo or regenerate it with demo/train.py"
        )
    return path


def demo_model_files(family: str = "pir") -> tuple[Path, Path]:
    """(model_file, params_file) of the demo model, e.g. for ``paddle.inference.Config``."""
    d = demo_model_dir(family)
    model_name, params_name = MODEL_FAMILIES[family]
    return d / model_name, d / params_name
