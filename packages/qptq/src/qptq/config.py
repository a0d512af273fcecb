"""The one validated, frozen configuration of a static post-training quantization run.

:class:`PTQConfig` holds the keywords of :class:`~qptq.static.PostTrainingQuantization` (those of
``quant_post_static`` are the same set), checks them once and derives what the run uses: the op
types, the deployment target, the accuracy budget, the cache file. Both public entry points
build it from their own call (:meth:`PTQConfig.from_call`); neither re-lists the other's keywords.
"""

from __future__ import annotations

import logging
import os
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np

from qcore.config import (
    check_paddleslim_keywords,
    effective_op_types,
    validate_bits,
    validate_choice,
    validate_names,
)
from qcore.constants import ACTIVATION_QUANTIZE_TYPES, WEIGHT_QUANTIZE_TYPES
from qcore.deploy import Deployment
from qcore.errors import ConfigError
from qcore.model_io import Model, ModelFiles
from qcore.thresholds import LAYERWISE_ALGOS, canonical_algo

from .budget import Budget, EvalFunction
from .data import check_batch_arguments, feed_batches

log = logging.getLogger(__name__)
#: The seeds' ``activation_quantize_type`` default: the only value that is not warned about.
SEED_ACTIVATION_QUANTIZE_TYPE = "range_abs_max"


@dataclass(frozen=True)
class PTQConfig:
    """Every keyword of one PTQ run as given, validated; the settings derived from them below.

    ``algo``, ``deploy_backend``, the bit widths and the name lists are stored normalized
    (``"direct"`` -> ``"abs_max"``, ``"mkldnn"`` -> ``"onednn"``, tuples). ``scope`` and a
    non-default ``activation_quantize_type`` are accepted for PaddleSlim's callers and warned
    about: each loaded model has its own scope, and activation thresholds come from ``algo``.
    """

    executor: Any
    sample_generator: Callable[[], Iterable[Any]] | None
    model_dir: str | os.PathLike[str] | None
    model_filename: str | None
    params_filename: str | None
    batch_generator: Callable[[], Iterable[Any]] | None
    data_loader: Iterable[Any] | None
    batch_size: int
    batch_nums: int | None
    scope: Any
    algo: str
    hist_percent: float
    quantizable_op_type: Sequence[str]
    is_full_quantize: bool
    weight_bits: int
    activation_bits: int
    activation_quantize_type: str
    weight_quantize_type: str
    optimize_model: bool
    is_use_cache_file: bool
    cache_dir: str | os.PathLike[str]
    skip_patterns: Sequence[str]
    bias_correction: bool
    onednn_fallback: bool
    residual_add: bool
    progress: bool
    deploy_backend: str | None
    onnx_format: bool | None
    round_type: str
    activation_symmetric: bool | None  # None or True: symmetric grids; False: asymmetric (qcore.quant.asymmetric_range)
    skip_tensor_list: Sequence[str] | None
    eval_function: EvalFunction | None
    max_metric_drop: float | None
    max_output_error: float | None
    max_float_layers: int | None
    max_evaluations: int
    measure_candidate: Callable[[ModelFiles], float] | None
    distributed: bool  # under paddle.distributed: merge every rank's calibration, rank 0 saves
    # derived in __post_init__
    op_types: tuple[str, ...] = field(init=False)  # is_full_quantize's op set or quantizable_op_type
    per_channel: bool = field(init=False)
    skip_tensors: frozenset[str] = field(init=False)
    cache_file: Path | None = field(init=False)  # observer checkpoint when is_use_cache_file
    deployment: Deployment = field(init=False)  # the one door to the target (qcore.deploy.session)
    budget: Budget | None = field(init=False)
    grids: str = field(init=False)  # "symmetric", "asymmetric" or "unsigned" (asymmetric for never-negative ones)

    @classmethod
    def from_call(cls, arguments: Mapping[str, Any]) -> PTQConfig:
        """The config of a call whose parameters include every keyword of this class
        (``locals()`` of ``PostTrainingQuantization.__init__`` or ``quant_post_static``)."""
        return cls(**{f.name: arguments[f.name] for f in fields(cls) if f.init})

    def __post_init__(self) -> None:
        if self.model_dir is None:
            raise ConfigError("model_dir is required: the directory (or path prefix) of the float model")
        check_batch_arguments((self.sample_generator, self.batch_generator, self.data_loader), self.batch_size,
                              self.batch_nums)
        if self.sample_generator is not None and self.data_loader is not None:
            log.info("both sample_generator and data_loader given: calibrating on the data_loader (as PaddleSlim)")
        op_names = validate_names("quantizable_op_type", self.quantizable_op_type)
        hist = self.hist_percent
        if isinstance(hist, bool) or not isinstance(hist, (int, float)) or not 0 < hist <= 1:
            raise ConfigError(f"hist_percent={hist!r} is not valid; valid choices: a number in (0, 1]")
        validate_choice("activation_quantize_type", self.activation_quantize_type, ACTIVATION_QUANTIZE_TYPES)
        validate_choice("weight_quantize_type", self.weight_quantize_type, WEIGHT_QUANTIZE_TYPES[:2])
        check_paddleslim_keywords(self.onnx_format, self.round_type)
        budget = Budget.from_options(self.eval_function, self.max_metric_drop, self.max_output_error,
                                     self.max_float_layers, self.max_evaluations, self.measure_candidate)
        weight_bits = validate_bits("weight_bits", self.weight_bits, 2, 16)
        activation_bits = validate_bits("activation_bits", self.activation_bits, 2, 16)
        deployment = Deployment(self.deploy_backend, weight_bits=weight_bits, activation_bits=activation_bits,
                                fallback=self.onednn_fallback)
        ignored = []
        if self.scope is not None:
            ignored.append("scope (each loaded model has its own scope)")
        if self.activation_quantize_type != SEED_ACTIVATION_QUANTIZE_TYPE:
            ignored.append(f"activation_quantize_type={self.activation_quantize_type!r} (activation thresholds "
                           f"come from algo={self.algo!r}; the activation ops written are fixed per model family)")
        if ignored:
            # stacklevel 5: the line that called PostTrainingQuantization or quant_post_static
            warnings.warn(f"qptq ignores {' and '.join(ignored)}", UserWarning, stacklevel=5)
        normalized = {
            "quantizable_op_type": op_names,
            "skip_patterns": tuple(self.skip_patterns),
            "deploy_backend": deployment.name,
            "weight_bits": weight_bits,
            "activation_bits": activation_bits,
            "algo": canonical_algo(self.algo, extra=LAYERWISE_ALGOS),
        }
        # None (the default): the target's default grids (symmetric except where its int8 kernels want zero points)
        grids = deployment.grids(self.activation_symmetric)
        for name, value in normalized.items():
            object.__setattr__(self, name, value)
        derived = {
            "op_types": effective_op_types(op_names, self.is_full_quantize),
            "per_channel": self.weight_quantize_type == "channel_wise_abs_max",
            "skip_tensors": frozenset(self.skip_tensor_list or ()),
            "cache_file": Path(self.cache_dir) / "observers.json" if self.is_use_cache_file else None,
            "deployment": deployment,
            "budget": budget,
            "grids": grids,
        }
        for name, value in derived.items():
            object.__setattr__(self, name, value)

    def check_model(self, model: Model) -> None:
        """Refuse a model ``deploy_backend`` cannot run, or bit widths its target cannot run for its family."""
        self.deployment.check(str(model.source.model_file) if model.source else "", model.family)

    def batches(self, model: Model) -> Iterator[dict[str, np.ndarray]]:
        """The calibration batches as ``model``'s feed dicts (a new pass over the data each call)."""
        return feed_batches(model.feed_names, sample_generator=self.sample_generator,
                            batch_generator=self.batch_generator, data_loader=self.data_loader,
                            batch_size=self.batch_size, batch_nums=self.batch_nums, specs=model.feed_specs())
