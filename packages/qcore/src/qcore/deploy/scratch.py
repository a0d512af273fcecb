"""Temporary copies of a model in the form a runtime opens, removed when the process exits."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

from ..model_io import ModelFiles, load_model, save_model

_MADE: list[Path] = []
atexit.register(lambda: [shutil.rmtree(p, ignore_errors=True) for p in _MADE])


def scratch_dir(prefix: str) -> Path:
    """A new temporary directory, removed at exit."""
    path = Path(tempfile.mkdtemp(prefix=prefix))
    _MADE.append(path)
    return path


def as_pdmodel(files: ModelFiles) -> ModelFiles:
    """Legacy ``files`` under ``*.pdmodel`` / ``*.pdiparams`` names (OpenVINO's Paddle frontend opens no
    others): links, or a combined copy of a one-file-per-parameter model."""
    if files.model_file.suffix == ".pdmodel" and files.params_file is not None:
        return files
    tmp = scratch_dir("qcore-ov-")
    if files.params_file is None:  # one file per parameter: write them combined
        return save_model(load_model(files), tmp / "model", "model.pdmodel", "model.pdiparams")
    os.symlink(files.model_file.resolve(), tmp / "model.pdmodel")
    os.symlink(files.params_file.resolve(), tmp / "model.pdiparams")
    return ModelFiles(tmp / "model.pdmodel", tmp / "model.pdiparams", "legacy")
