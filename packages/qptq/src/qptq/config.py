"""The validated, frozen settings of one static post-training quantization run, in five groups.

:class:`~qptq.static.PostTrainingQuantization` maps PaddleSlim's keywords (``quant_post_static``
passes the same set) once into a :class:`PTQConfig` of groups; each PTQ stage receives the group
it reads, never the quantizer:

* :class:`ModelConfig`: where the float model is, and the caller's executor;
* :class:`DataConfig`: the calibration data (:meth:`DataConfig.batches`);
* :class:`TargetConfig`: what the model becomes: the deployment target (the one door to it,
  :class:`qcore.deploy.Deployment`, with the bit widths), the ops, the activation grids;
* :class:`CalibrationConfig`: how thresholds and weight codes are chosen;
* :class:`Budget`: the accuracy budget, or None (:mod:`qptq.budget` searches for it).

The settings import no PTQ stage: the stages import the group they read from here.
"""

from __future__ import annotations

import logging
import math
import os
import sys
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from qcore.config import check_paddleslim_keywords, effective_op_types, validate_bits, validate_choice, validate_names
from qcore.constants import ACTIVATION_QUANTIZE_TYPES, WEIGHT_QUANTIZE_TYPES
from qcore.deploy import Deployment, Targets
from qcore.errors import ConfigError
from qcore.graph import Graph
from qcore.model_io import Model, ModelFiles, load_model
from qcore.thresholds import LAYERWISE_ALGOS, canonical_algo

from .data import check_batch_arguments, feed_batches

log = logging.getLogger(__name__)
#: The seeds' ``activation_quantize_type`` default: the only value that is not warned about.
SEED_ACTIVATION_QUANTIZE_TYPE = "range_abs_max"


@dataclass(frozen=True)
class ModelConfig:
    """The float model (a directory or path prefix, optional file names) and the caller's executor."""

    model_dir: str | os.PathLike[str]
    model_filename: str | None
    params_filename: str | None
    executor: Any  # runs the model when given (PaddleSlim's habit); else each model has its own

    def __post_init__(self) -> None:
        if self.model_dir is None:
            raise ConfigError("model_dir is required: the directory (or path prefix) of the float model")

    def load(self) -> Model:
        """The float model, with the caller's executor if one was given."""
        model = load_model(self.model_dir, self.model_filename, self.params_filename)
        if self.executor is not None:
            model.executor = self.executor
        return model


@dataclass(frozen=True)
class DataConfig:
    """The calibration data: one of three sources (PaddleSlim's), and how many batches of what size."""

    sample_generator: Callable[[], Iterable[Any]] | None
    batch_generator: Callable[[], Iterable[Any]] | None
    data_loader: Iterable[Any] | None
    batch_size: int
    batch_nums: int | None

    def __post_init__(self) -> None:
        check_batch_arguments((self.sample_generator, self.batch_generator, self.data_loader), self.batch_size,
                              self.batch_nums)
        if self.sample_generator is not None and self.data_loader is not None:
            log.info("both sample_generator and data_loader given: calibrating on the data_loader (as PaddleSlim)")

    def batches(self, model: Model) -> Iterator[dict[str, np.ndarray]]:
        """The calibration batches as ``model``'s feed dicts (a new pass over the data each call)."""
        return feed_batches(model.feed_names, sample_generator=self.sample_generator,
                            batch_generator=self.batch_generator, data_loader=self.data_loader,
                            batch_size=self.batch_size, batch_nums=self.batch_nums, specs=model.feed_specs())


@dataclass(frozen=True)
class TargetConfig:
    """What the model becomes: the deployment (target and bit widths), the ops quantized, the grids."""

    deployment: Deployment
    op_types: tuple[str, ...]  # is_full_quantize's op set or quantizable_op_type
    skip_patterns: tuple[str, ...]
    skip_tensors: frozenset[str]
    residual_add: bool  # quantize residual joins' inputs with their readers (oneDNN's fused adds)
    optimize_model: bool  # legacy conv biases in the form oneDNN fuses (batch norms are folded either way)
    grids: str  # "symmetric", "asymmetric" or "unsigned" (asymmetric for never-negative tensors)

    @classmethod
    def build(
        cls,
        *,
        deploy_backend: str | None,
        weight_bits: int,
        activation_bits: int,
        onednn_fallback: bool,
        quantizable_op_type: Sequence[str],
        is_full_quantize: bool,
        skip_patterns: Sequence[str],
        skip_tensor_list: Sequence[str] | None,
        residual_add: bool,
        optimize_model: bool,
        activation_symmetric: bool | None,
    ) -> TargetConfig:
        """The target of PaddleSlim's keywords, validated; ``activation_symmetric=None`` takes the target's
        default grids (symmetric except where its int8 kernels want zero points)."""
        op_names = validate_names("quantizable_op_type", quantizable_op_type)
        deployment = Deployment(deploy_backend, weight_bits=validate_bits("weight_bits", weight_bits, 2, 16),
                                activation_bits=validate_bits("activation_bits", activation_bits, 2, 16),
                                fallback=onednn_fallback)
        return cls(deployment, effective_op_types(op_names, is_full_quantize), tuple(skip_patterns),
                   frozenset(skip_tensor_list or ()), residual_add, optimize_model,
                   deployment.grids(activation_symmetric))

    def targets(self, graph: Graph) -> Targets:
        """The ops of :attr:`op_types` not skipped (by pattern or tensor name) plus what the deployment target
        adds, and the activations whose readers stay float; the same order on every clone."""
        joins = self.residual_add and "elementwise_add" not in self.op_types  # else they are ordinary targets
        return self.deployment.targets(graph, self.op_types, self.skip_patterns, self.skip_tensors,
                                       residual_add=joins)


@dataclass(frozen=True)
class CalibrationConfig:
    """How thresholds and weight codes are chosen, and how the calibration pass runs."""

    algo: str
    hist_percent: float
    per_channel: bool
    round_type: str
    bias_correction: bool
    progress: bool
    distributed: bool  # under paddle.distributed: merge every rank's calibration, rank 0 saves
    cache_file: Path | None  # observer checkpoint when is_use_cache_file

    @classmethod
    def build(
        cls,
        *,
        algo: str,
        hist_percent: float,
        weight_quantize_type: str,
        round_type: str,
        bias_correction: bool,
        progress: bool,
        distributed: bool,
        is_use_cache_file: bool,
        cache_dir: str | os.PathLike[str],
    ) -> CalibrationConfig:
        """The calibration of PaddleSlim's keywords, validated and normalized (``"direct"`` -> ``"abs_max"``)."""
        if isinstance(hist_percent, bool) or not isinstance(hist_percent, (int, float)) or not 0 < hist_percent <= 1:
            raise ConfigError(f"hist_percent={hist_percent!r} is not valid; valid choices: a number in (0, 1]")
        validate_choice("weight_quantize_type", weight_quantize_type, WEIGHT_QUANTIZE_TYPES[:2])
        return cls(canonical_algo(algo, extra=LAYERWISE_ALGOS), hist_percent,
                   weight_quantize_type == "channel_wise_abs_max", round_type, bias_correction, progress, distributed,
                   Path(cache_dir) / "observers.json" if is_use_cache_file else None)


#: ``eval_function(model_files) -> score``, higher is better (the PaddleSlim / NNCF convention).
EvalFunction = Callable[[ModelFiles], float]


@dataclass(frozen=True)
class Budget:
    """What "good enough" means: a metric drop against float, or an output error, with search bounds."""

    eval_function: EvalFunction | None = None
    max_metric_drop: float | None = None
    max_output_error: float | None = None
    max_float_layers: int | None = None  # None: any number of layers may go back to float
    max_evaluations: int = 10
    #: called on the float model and on every candidate scored (e.g. its latency on your backend);
    #: the values go into the report, next to the scores, and never decide anything
    measure: Callable[[ModelFiles], float] | None = None

    @classmethod
    def from_options(cls, eval_function: EvalFunction | None, max_metric_drop: float | None,
                     max_output_error: float | None, max_float_layers: int | None,
                     max_evaluations: int, measure: Callable[[ModelFiles], float] | None = None) -> Budget | None:
        """The budget the PTQ keywords ask for, or None; one clear line for every inconsistent mix."""
        if eval_function is None and max_metric_drop is None and max_output_error is None:
            return None
        if (eval_function is None) != (max_metric_drop is None):
            raise ConfigError("eval_function and max_metric_drop go together: pass both (e.g. max_metric_drop=0.01), "
                              "or max_output_error alone for a label-free budget")
        if max_metric_drop is not None and max_output_error is not None:
            raise ConfigError("pass max_metric_drop (with eval_function) or max_output_error, not both")
        if eval_function is not None and not callable(eval_function):
            raise ConfigError(f"eval_function={eval_function!r} is not callable; pass fn(model_files) -> float")
        limits = (("max_metric_drop", max_metric_drop, 1.0), ("max_output_error", max_output_error, None))
        for name, value, top in limits:
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                      or not math.isfinite(value) or value < 0 or (top is not None and value > top)):
                bound = f"between 0 and {top:g} (a fraction: 0.01 is one point)" if top else "a finite number >= 0"
                raise ConfigError(f"{name}={value!r} is not valid; valid choices: {bound}")
        for name, value, low in (("max_float_layers", max_float_layers, 0), ("max_evaluations", max_evaluations, 2)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < low):
                raise ConfigError(f"{name}={value!r} is not valid; valid choices: an int >= {low}")
        if measure is not None and not callable(measure):
            raise ConfigError(f"measure_candidate={measure!r} is not callable; pass fn(model_files) -> float")
        return cls(eval_function, max_metric_drop, max_output_error, max_float_layers, max_evaluations, measure)

    @property
    def metric(self) -> str:
        return "eval_function" if self.eval_function is not None else "output_error"

    def within(self, score: float, float_score: float) -> bool:
        """Whether a candidate's ``score`` meets the budget (``float_score``: the float model's metric)."""
        if self.eval_function is not None:
            assert self.max_metric_drop is not None
            return float_score - score <= self.max_metric_drop
        assert self.max_output_error is not None
        return score <= self.max_output_error


@dataclass(frozen=True)
class PTQConfig:
    """One run's settings: the model, its calibration data, its target, how to calibrate, the budget."""

    model: ModelConfig
    data: DataConfig
    target: TargetConfig
    calibration: CalibrationConfig
    budget: Budget | None


def check_paddleslim_only(scope: Any, activation_quantize_type: str, onnx_format: bool | None, round_type: str,
                          algo: str) -> None:
    """Refuse PaddleSlim keyword values with no meaning here; warn, at the caller's line, about those ignored:
    ``scope`` (each loaded model has its own) and a non-default ``activation_quantize_type``."""
    validate_choice("activation_quantize_type", activation_quantize_type, ACTIVATION_QUANTIZE_TYPES)
    check_paddleslim_keywords(onnx_format, round_type)
    ignored = []
    if scope is not None:
        ignored.append("scope (each loaded model has its own scope)")
    if activation_quantize_type != SEED_ACTIVATION_QUANTIZE_TYPE:
        ignored.append(f"activation_quantize_type={activation_quantize_type!r} (activation thresholds "
                       f"come from algo={algo!r}; the activation ops written are fixed per model family)")
    if ignored:
        warnings.warn(f"qptq ignores {' and '.join(ignored)}", UserWarning, stacklevel=_callers_level())


def _callers_level() -> int:
    """``warnings.warn``'s stacklevel for the first frame outside qptq (the user's call)."""
    frame, level = sys._getframe(1), 1
    while frame is not None and frame.f_globals.get("__name__", "").startswith("qptq."):
        frame, level = frame.f_back, level + 1
    return level
