"""Post-training quantization of a ``paddle.nn.Layer`` (Paddle 3's dygraph PTQ flow) on static PTQ's machinery.

Paddle 3 quantizes a layer with ``PTQ(config).quantize(model)``, calibration batches run through the
returned model, then ``convert`` and ``paddle.jit.save``. Here :meth:`PTQ.quantize` returns the model
wrapped in a :class:`Recorder` that runs it unchanged and keeps the batches it sees;
:meth:`PTQ.save_quantized_model` exports the float layer (``paddle.jit.save``, PIR or legacy) into a
scratch directory and quantizes that program with :func:`qptq.quant_post_static` on the recorded
batches. Every algo (``auto`` included), deployment target and writer of static PTQ applies, and the
thresholds are those ``quant_post_static`` chooses on the exported model with the same batches.
"""

from __future__ import annotations

import inspect
import os
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import paddle
from paddle import nn

from qcore.errors import ConfigError, DataError, QuantError, did_you_mean
from qcore.model_io import check_model_output, export_layer, load_model
from qcore.paddle_env import FAMILIES, eager_mode, layer_mode

from .static import quant_post_static

#: ``quant_post_static`` keywords that describe the model files or the data: PTQ supplies them itself.
SUPPLIED = (
    "executor", "model_dir", "quantize_model_path", "batch_generator", "sample_generator", "data_loader",
    "model_filename", "params_filename", "save_model_filename", "save_params_filename", "batch_size",
    "batch_nums", "scope",
)  # fmt: skip
OPTIONS = tuple(name for name in inspect.signature(quant_post_static).parameters if name not in SUPPLIED)


class Recorder(nn.Layer):
    """Runs ``layer`` unchanged and keeps a copy of every batch of positional inputs it is called with."""

    def __init__(self, layer: nn.Layer) -> None:
        super().__init__()
        self.layer = layer
        self.batches: list[list[np.ndarray]] = []

    def forward(self, *inputs: Any, **named: Any) -> Any:
        if named:
            raise QuantError(f"PTQ records positional inputs only; call the model as model(x, ...) instead of "
                             f"with {sorted(named)} by name")
        self.batches.append([np.array(x.numpy() if isinstance(x, paddle.Tensor) else x) for x in inputs])
        return self.layer(*inputs)


class PTQ:
    """Post-training quantization of a dygraph model: ``quantize`` -> run batches -> ``save_quantized_model``.

    ``config`` (a dict) and ``options`` take :func:`qptq.quant_post_static`'s keywords that are not about
    files or data (:data:`OPTIONS`: ``algo``, ``weight_bits``, ``quantizable_op_type``, ``deploy_backend``,
    ``activation_symmetric``, ``round_type``, the accuracy budget, ...), with its defaults.
    """

    def __init__(self, config: Mapping[str, Any] | None = None, **options: Any) -> None:
        merged = {**(dict(config) if config is not None else {}), **options}
        for key in merged:
            if key not in OPTIONS:
                why = " (PTQ supplies it)" if key in SUPPLIED else did_you_mean(key, OPTIONS)
                raise ConfigError(f"unknown PTQ option {key!r}{why}; valid options: {', '.join(OPTIONS)}")
        self.options = merged
        self.report: dict[str, Any] | None = None

    def quantize(self, model: nn.Layer, inplace: bool = False) -> Recorder:
        """The model, wrapped to record the calibration batches run through it (``inplace`` is accepted
        for Paddle's signature: the model itself is never changed)."""
        del inplace
        if isinstance(model, Recorder):
            raise QuantError("this model is already being recorded; run the batches through it")
        if not isinstance(model, nn.Layer):
            raise QuantError(f"PTQ.quantize expects a paddle.nn.Layer, got {type(model).__name__}")
        return Recorder(model)

    def save_quantized_model(
        self,
        model: Recorder,
        path: str | os.PathLike[str],
        input_spec: Sequence[Any] | None = None,
        *,
        family: str = "pir",
    ) -> dict[str, Any]:
        """Quantize with the recorded batches and write ``<path>.json`` (or ``.pdmodel``) + ``<path>.pdiparams``.

        ``input_spec`` defaults to one ``InputSpec`` per positional input, named after ``forward``'s
        parameters, with the dimensions that differed between batches left free. Returns the report.
        """
        if not isinstance(model, Recorder):
            raise QuantError("save_quantized_model takes the model PTQ.quantize returned, after running batches")
        if not model.batches:
            raise DataError("no calibration batch was run; call the model PTQ.quantize returned on your batches "
                            "(with paddle.no_grad()) before saving")
        if family not in FAMILIES:
            raise ConfigError(f"family={family!r} is not valid; valid choices: 'pir', 'legacy'")
        prefix = Path(path)
        names = (prefix.name + (".json" if family == "pir" else ".pdmodel"), prefix.name + ".pdiparams")
        check_model_output(prefix.parent, family, *names)  # before any work
        spec = list(input_spec) if input_spec is not None else _input_spec(model)
        with (tempfile.TemporaryDirectory(prefix="qptq-dygraph-") as scratch, eager_mode(),
              layer_mode(model.layer, training=False)):
            export_layer(model.layer, Path(scratch) / "float", spec, family)  # type: ignore[arg-type]
            feeds = load_model(scratch).feed_names
            if len(feeds) != len(model.batches[0]):
                raise DataError(f"the exported model takes {len(feeds)} input(s) {feeds} but the batches have "
                                f"{len(model.batches[0])}; pass an input_spec with one entry per input")
            self.report = quant_post_static(
                None, scratch, prefix.parent, batch_generator=lambda: (dict(zip(feeds, b)) for b in model.batches),
                save_model_filename=names[0], save_params_filename=names[1], **self.options,
            )
        return self.report


def _input_spec(model: Recorder) -> list[paddle.static.InputSpec]:
    params = [p for p in inspect.signature(model.layer.forward).parameters.values()
              if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    spec = []
    for i, first in enumerate(model.batches[0]):
        shapes = {b[i].shape for b in model.batches}
        if len({len(s) for s in shapes}) != 1:
            raise DataError(f"input {i} has batches of different ranks {sorted(shapes)}; give each batch one rank")
        dims = [d if len({s[k] for s in shapes}) == 1 else None for k, d in enumerate(first.shape)]
        dims[0] = None  # any batch size
        name = params[i].name if i < len(params) else f"x{i}"
        spec.append(paddle.static.InputSpec(dims, str(first.dtype), name))
    return spec
