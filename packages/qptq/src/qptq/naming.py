"""Output file names: the seeds' defaults, adapted to the IR family of the model."""

from __future__ import annotations

import logging

from qcore.model_io import output_filenames

log = logging.getLogger(__name__)
SEED_DEFAULTS = ("__model__", "__params__")


def output_names(family: str, model_filename: str | None, params_filename: str | None) -> tuple[str, str | None]:
    """File names to save with. A PIR model cannot be named ``__model__`` (Paddle needs
    ``.json``), so the seeds' default names become ``inference.json`` / ``inference.pdiparams``."""
    if family == "pir" and (model_filename, params_filename) == SEED_DEFAULTS:
        log.info("PIR output: saving as inference.json/inference.pdiparams instead of __model__/__params__")
        model_filename, params_filename = None, None
    return output_filenames(family, model_filename, params_filename)  # type: ignore[arg-type]
