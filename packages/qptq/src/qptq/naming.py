"""Output file names: the seeds' defaults, adapted to the IR family and the naming of the input model.

The default ``save_model_filename`` / ``save_params_filename`` of ``quant_post_static`` are
:data:`SEED_MODEL_FILENAME` / :data:`SEED_PARAMS_FILENAME`: they read ``'__model__'`` / ``'__params__'``
(the seeds' documented defaults) and mean "name the output as the input is named":

* a legacy ``*.pdmodel`` input gives ``model.pdmodel`` + ``model.pdiparams`` (PaddleSlim 2.6's defaults);
* a legacy ``__model__`` (or otherwise named) input gives ``__model__`` + ``__params__`` (the seeds');
* a PIR input gives ``inference.json`` + ``inference.pdiparams`` (a PIR model cannot be named ``__model__``).

A default params name next to an explicit model name follows the model name (``m.pdmodel`` ->
``m.pdiparams``, else ``__params__``). Names passed explicitly, ``'__model__'`` included, are kept.
"""

from __future__ import annotations

import logging

from qcore.model_io import PARAMS_SUFFIX, ModelFiles, output_filenames

log = logging.getLogger(__name__)
SEED_DEFAULTS = ("__model__", "__params__")
PADDLESLIM_LEGACY_NAMES = ("model.pdmodel", "model" + PARAMS_SUFFIX)


class FollowInput(str):
    """A default file name that follows the input's naming (see the module docstring); equal to its text."""


SEED_MODEL_FILENAME = FollowInput(SEED_DEFAULTS[0])
SEED_PARAMS_FILENAME = FollowInput(SEED_DEFAULTS[1])
#: A PIR model's names when both file names are None in ``quant_post_dynamic`` (PaddleSlim 2.6's ``model.*``).
DYNAMIC_PIR_NAMES = ("model.json", "model" + PARAMS_SUFFIX)


def output_names(family: str, model_filename: str | None, params_filename: str | None,
                 source: ModelFiles | None = None) -> tuple[str, str | None]:
    """File names to save with: :class:`FollowInput` defaults resolved for ``source`` (the input's files)."""
    if family == "pir":
        if (model_filename, params_filename) == SEED_DEFAULTS:
            log.info("PIR output: saving as inference.json/inference.pdiparams instead of __model__/__params__")
            model_filename, params_filename = None, None
        return output_filenames(family, model_filename, params_filename)  # type: ignore[arg-type]
    if isinstance(model_filename, FollowInput):
        pdmodel_input = source is not None and source.model_file.suffix == ".pdmodel"
        model_filename = PADDLESLIM_LEGACY_NAMES[0] if pdmodel_input else SEED_DEFAULTS[0]
    if isinstance(params_filename, FollowInput):
        stem, dot, suffix = (model_filename or "").rpartition(".")
        params_filename = stem + PARAMS_SUFFIX if dot and suffix == "pdmodel" else SEED_DEFAULTS[1]
    return output_filenames(family, model_filename, params_filename)  # type: ignore[arg-type]


def dynamic_output_names(family: str, model_filename: str | None, params_filename: str | None,
                         source: ModelFiles | None = None) -> tuple[str, str | None]:
    """``quant_post_dynamic``'s file names: both None follow the input (PIR: :data:`DYNAMIC_PIR_NAMES`)."""
    if model_filename is None and params_filename is None:  # the names the script will load
        model_filename, params_filename = DYNAMIC_PIR_NAMES if family == "pir" else (
            SEED_MODEL_FILENAME, SEED_PARAMS_FILENAME)
    return output_names(family, model_filename, params_filename, source)
