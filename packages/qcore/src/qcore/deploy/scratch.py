"""Temporary copies of a model in the form a runtime opens, removed when the process exits."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

from ..model_io import ModelFiles, load_model, save_model
from ..zero_points import runtime_program

_MADE: list[Path] = []
atexit.register(lambda: [shutil.rmtree(p, ignore_errors=True) for p in _MADE])


def scratch_dir(prefix: str) -> Path:
    """A new temporary directory, removed at exit."""
    path = Path(tempfile.mkdtemp(prefix=prefix))
    _MADE.append(path)
    return path


def as_pdmodel(files: ModelFiles) -> ModelFiles:
    """Legacy ``files`` as OpenVINO's Paddle frontend reads them: under ``*.pdmodel`` / ``*.pdiparams`` names
    (it opens no others), with zero points in place of the saved shifts (:func:`qcore.zero_points.runtime_program`).
    The files themselves where they already are so, else links and a rewritten program in a scratch directory
    (a combined copy of a one-file-per-parameter model)."""
    if files.params_file is None:  # one file per parameter: write them combined
        files = save_model(load_model(files), scratch_dir("qcore-ov-") / "model", "model.pdmodel", "model.pdiparams")
    folded = runtime_program(files.model_file.read_bytes())
    if files.model_file.suffix == ".pdmodel" and files.params_file is not None and folded is None:
        return files
    assert files.params_file is not None
    tmp = scratch_dir("qcore-ov-")
    if folded is None:
        os.symlink(files.model_file.resolve(), tmp / "model.pdmodel")
    else:
        (tmp / "model.pdmodel").write_bytes(folded)
    os.symlink(files.params_file.resolve(), tmp / "model.pdiparams")
    return ModelFiles(tmp / "model.pdmodel", tmp / "model.pdiparams", "legacy")
