"""Static post-training quantization: calibrate activation thresholds, store int8 weights.

``PostTrainingQuantization`` follows PaddleSlim's class; ``quant_post_static`` (alias
``quant_post``) is the one-call form with the seeds' signature. A run is plain stages over a
:class:`~qptq.plan.Plan` (:mod:`qptq.plan` lists them); this module only orders them.

Every batch norm that directly follows a conv is folded into it (:meth:`qcore.graph.Graph.fold_conv_bn`)
before anything is calibrated, for every target and whatever ``optimize_model`` says, so the weight scales
are the folded weight's and the simulated model is what a runtime runs. Left in, a batch norm behind a
quantized conv runs in float between a dequantize and a quantize (ONNX Runtime cannot fold it into a conv
whose weight it reads through ``DequantizeLinear``), and folding it only at export cannot move the conv's
output quantization behind it. ``optimize_model=True`` also writes every legacy conv bias in the form
Paddle Inference's oneDNN passes fuse (:meth:`~qcore.graph.Graph.fold_conv_bn`'s ``fusable_biases``).
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from itertools import islice
from typing import Any

from qcore.deploy import Targets
from qcore.distributed import active, all_gather, on_rank0
from qcore.graph import Graph, open_graph
from qcore.model_io import ModelFiles, check_model_output
from qcore.outputs import write_bytes

from . import budget, decide
from .adaround import adaround_targets
from .auto import AUTO
from .bias_correction import input_means
from .calibrate import Calibration
from .config import (
    Budget,
    CalibrationConfig,
    DataConfig,
    EvalFunction,
    ModelConfig,
    PTQConfig,
    TargetConfig,
    check_paddleslim_only,
)
from .naming import SEED_MODEL_FILENAME, SEED_PARAMS_FILENAME, output_names
from .plan import Plan, choose
from .report import run_report
from .rewrite import quantize_graph, rewritten_clone
from .sharded import calibrate_sharded
from .smooth import smooth_graph

log = logging.getLogger(__name__)
#: Calibration batches the accuracy budget scores candidates on (label-free) and ranks layers with.
BUDGET_BATCHES = 4
#: Calibration samples kept per activation for the layer-wise methods (``algo="auto"``, AdaRound).
LAYERWISE_SAMPLES = 32
DEFAULT_OP_TYPES = ("conv2d", "depthwise_conv2d", "mul")


class PostTrainingQuantization:
    """Calibrate on sample data, then quantize weights and activations of the chosen ops.

    Differences from PaddleSlim: ``executor``/``scope`` are optional (each loaded model has
    its own scope on the CPU; a ``scope`` is warned about); statistics stream, so
    ``is_use_cache_file`` only checkpoints observer state to ``cache_dir`` (a JSON file,
    removed afterwards) instead of samples. Batch norms after convs are folded before calibration
    whatever ``optimize_model`` says (module doc). The keywords become one validated
    :class:`~qptq.config.PTQConfig` of groups (:attr:`config`: ``config.calibration.algo``,
    ``config.target.op_types``, ...); :meth:`from_config` starts from a built one.
    """

    def __init__(
        self,
        executor: Any = None,
        sample_generator: Callable[[], Iterable[Any]] | None = None,
        model_dir: str | os.PathLike[str] | None = None,
        model_filename: str | None = None,
        params_filename: str | None = None,
        batch_generator: Callable[[], Iterable[Any]] | None = None,
        data_loader: Iterable[Any] | None = None,
        batch_size: int = 10,
        batch_nums: int | None = None,
        scope: Any = None,
        algo: str = "KL",
        hist_percent: float = 0.99999,
        quantizable_op_type: Sequence[str] = DEFAULT_OP_TYPES,
        is_full_quantize: bool = False,
        weight_bits: int = 8,
        activation_bits: int = 8,
        activation_quantize_type: str = "range_abs_max",
        weight_quantize_type: str = "channel_wise_abs_max",
        optimize_model: bool = False,
        is_use_cache_file: bool = False,
        cache_dir: str | os.PathLike[str] = "./temp_post_training",
        skip_patterns: Sequence[str] = ("skip_quant",),
        bias_correction: bool = False,
        onednn_fallback: bool = True,
        residual_add: bool = True,
        progress: bool = False,
        *,
        deploy_backend: str | None = None,
        onnx_format: bool | None = None,
        round_type: str = "round",
        activation_symmetric: bool | None = None,
        skip_tensor_list: Sequence[str] | None = None,
        eval_function: EvalFunction | None = None,
        max_metric_drop: float | None = None,
        max_output_error: float | None = None,
        max_float_layers: int | None = None,
        max_evaluations: int = 10,
        measure_candidate: Callable[[ModelFiles], float] | None = None,
        distributed: bool = True,
    ) -> None:
        check_paddleslim_only(scope, activation_quantize_type, onnx_format, round_type, algo)
        self._start(PTQConfig(
            model=ModelConfig(model_dir, model_filename, params_filename, executor),
            data=DataConfig(sample_generator, batch_generator, data_loader, batch_size, batch_nums),
            target=TargetConfig.build(
                deploy_backend=deploy_backend, weight_bits=weight_bits, activation_bits=activation_bits,
                onednn_fallback=onednn_fallback, quantizable_op_type=quantizable_op_type,
                is_full_quantize=is_full_quantize, skip_patterns=skip_patterns, skip_tensor_list=skip_tensor_list,
                residual_add=residual_add, optimize_model=optimize_model, activation_symmetric=activation_symmetric),
            calibration=CalibrationConfig.build(
                algo=algo, hist_percent=hist_percent, weight_quantize_type=weight_quantize_type,
                round_type=round_type, bias_correction=bias_correction, progress=progress, distributed=distributed,
                is_use_cache_file=is_use_cache_file, cache_dir=cache_dir),
            budget=Budget.from_options(eval_function, max_metric_drop, max_output_error, max_float_layers,
                                       max_evaluations, measure_candidate),
        ))

    @classmethod
    def from_config(cls, config: PTQConfig) -> PostTrainingQuantization:
        """The quantizer of a built :class:`~qptq.config.PTQConfig` (loads its model)."""
        ptq = cls.__new__(cls)
        ptq._start(config)
        return ptq

    def _start(self, config: PTQConfig) -> None:
        self.config = config
        self.model = config.model.load()
        deployment = config.target.deployment
        deployment.check(str(self.model.source.model_file) if self.model.source else "", self.model.family)
        deployment.check_export(self.model)
        self.graph: Graph | None = None
        self.report: dict[str, Any] = {}

    def quantize(self) -> Any:
        """Calibrate and rewrite; returns the quantized program. The stages, in order (:mod:`qptq.plan`)."""
        start = time.perf_counter()
        config, model = self.config, self.model
        target, how, deployment = config.target, config.calibration, config.target.deployment  # how: to calibrate
        graph = open_graph(model)
        graph.fold_conv_bn(fusable_biases=target.optimize_model)  # always (module doc)
        targets = target.targets(graph)
        held = decide.HeldOut()
        decides = how.algo == AUTO and config.budget is None  # a budget's search decides the float layers itself
        fit = replace(config, data=decide.split_data(config.data, model, held)) if decides else config
        smoothing = smooth_graph(graph, targets.ops, fit, model, LAYERWISE_SAMPLES) if how.algo == AUTO else []
        if any(choice.factors is not None for choice in smoothing):
            targets = target.targets(graph)  # the smoothed readers read the multiply's output
        layerwise = how.algo == AUTO or how.round_type == "adaround"
        calibration = calibrate_sharded(
            graph, targets.ops, fit, model,
            channel_means=input_means(targets.ops) if how.bias_correction else {},
            keep_samples=LAYERWISE_SAMPLES if layerwise else 0)  # merged over ranks
        if how.cache_file is not None:
            checkpoint(calibration, how.cache_file)
        plan = choose(graph, targets, calibration, algo=how.algo, grids=target.grids,
                      hist_percent=how.hist_percent, deployment=deployment, smoothing=smoothing)
        if how.round_type == "adaround":
            plan.rounded = adaround_targets(graph, targets.ops, calibration.activation_samples, deployment,
                                            per_channel=how.per_channel)
        auto_report = None
        if decides and active(config.calibration.distributed):  # every rank scores on every rank's, in rank order
            held.batches = [b for part in all_gather(held.batches, "held-back batches") for b in part]
            held.seen = sum(all_gather(held.seen, "held-back batch counts"))
        if decides:
            plan.keep_float, auto_report = self._decide(graph, targets, plan, calibration, held)
        calibration.activation_samples.clear()
        budget_report = None
        if config.budget is not None and not decides:
            assert model.source is not None
            plan.keep_float, budget_report = budget.search(
                graph, plan, calibration, config.budget, target=target,
                batches=list(islice(config.data.batches(model), BUDGET_BATCHES)), float_files=model.source,
                per_channel=how.per_channel)
        quantized = quantize_graph(graph, targets, plan, deployment, calibration,
                                   per_channel=how.per_channel)
        self.report = run_report(plan, quantized, calibration, deployment, graph.family, budget_report)
        if auto_report is not None:
            self.report["auto"] = auto_report
        if "float_layers" in self.report:
            log.warning("%s", self.report["float_layers"])
        self.report["calibration_seconds"] = round(time.perf_counter() - start, 3)
        self.graph = graph
        return graph.model.program

    def _decide(self, graph: Graph, targets: Targets, plan: Plan, calibration: Calibration, held: decide.HeldOut
                ) -> tuple[dict[int, str], dict[str, Any]]:
        """``algo="auto"``'s float layers and its report section (:mod:`qptq.decide`)."""
        config, how = self.config, self.config.calibration
        deployment = config.target.deployment
        errors = decide.layer_errors(graph, targets.ops, plan, deployment, calibration.activation_samples,
                                     how.per_channel)
        whole, speed = decide.speed_float(deployment, targets.ops, errors)
        if whole is not None:
            return speed, decide.whole_model_report(whole, errors)

        def candidate(keep: dict[int, str]) -> Graph:
            return rewritten_clone(graph, plan, deployment, calibration, config.target.targets,
                                   per_channel=how.per_channel, keep_float=keep)

        fallback = [] if held.batches else list(islice(config.data.batches(self.model), BUDGET_BATCHES))
        return decide.choose_float(graph, targets, errors, speed, held, fallback, candidate)

    def save_quantized_model(
        self,
        save_model_path: str | os.PathLike[str],
        model_filename: str | None = None,
        params_filename: str | None = None,
    ) -> ModelFiles:
        """Save the quantized model (same IR family as the input) atomically.

        With both names None the files are named as the input is (:mod:`qptq.naming`): ``model.pdmodel`` +
        ``model.pdiparams`` for a ``*.pdmodel`` input (Paddle 2.6's names), ``__model__`` + ``__params__`` for
        a ``__model__`` input, ``inference.json`` + ``inference.pdiparams`` for a PIR input.
        """
        if self.graph is None:
            raise RuntimeError("call quantize() before save_quantized_model()")
        if model_filename is None and params_filename is None:
            model_filename, params_filename = SEED_MODEL_FILENAME, SEED_PARAMS_FILENAME
        graph = self.graph
        names = output_names(self.model.family, model_filename, params_filename, self.model.source)

        def write() -> ModelFiles:  # on rank 0 only under paddle.distributed; the other ranks wait for it
            files = self.config.target.deployment.save(graph, save_model_path, *names)
            cache = self.config.calibration.cache_file
            if cache is not None and cache.exists():
                cache.unlink()
            return files

        return on_rank0(write, f"the quantized model to {save_model_path}", enabled=self.config.calibration.distributed)



def checkpoint(calibration: Calibration, cache_file: Any) -> None:
    """Write every observer's state to ``cache_file`` (``is_use_cache_file``; removed once the model is saved)."""
    cache_file.parent.mkdir(parents=True, exist_ok=True)
    states = {n: {k: _jsonable(v) for k, v in o.state().items()} for n, o in calibration.observers.items()}
    write_bytes(cache_file, json.dumps(states).encode())
    log.info("observer state checkpointed to %s", cache_file)


def _jsonable(value: Any) -> Any:
    return value.tolist() if hasattr(value, "tolist") else value


def quant_post_static(
    executor: Any,
    model_dir: str | os.PathLike[str],
    quantize_model_path: str | os.PathLike[str],
    batch_generator: Callable[[], Iterable[Any]] | None = None,
    sample_generator: Callable[[], Iterable[Any]] | None = None,
    model_filename: str | None = None,
    params_filename: str | None = None,
    save_model_filename: str | None = SEED_MODEL_FILENAME,
    save_params_filename: str | None = SEED_PARAMS_FILENAME,
    batch_size: int = 16,
    batch_nums: int | None = None,
    scope: Any = None,
    algo: str = "KL",
    quantizable_op_type: Sequence[str] = DEFAULT_OP_TYPES,
    is_full_quantize: bool = False,
    weight_bits: int = 8,
    activation_bits: int = 8,
    activation_quantize_type: str = "range_abs_max",
    weight_quantize_type: str = "channel_wise_abs_max",
    optimize_model: bool = False,
    is_use_cache_file: bool = False,
    cache_dir: str | os.PathLike[str] = "./temp_post_training",
    *,
    data_loader: Iterable[Any] | None = None,
    hist_percent: float = 0.99999,
    skip_patterns: Sequence[str] = ("skip_quant",),
    bias_correction: bool = False,
    onednn_fallback: bool = True,
    residual_add: bool = True,
    progress: bool = False,
    deploy_backend: str | None = None,
    onnx_format: bool | None = None,
    round_type: str = "round",
    activation_symmetric: bool | None = None,
    skip_tensor_list: Sequence[str] | None = None,
    eval_function: EvalFunction | None = None,
    max_metric_drop: float | None = None,
    max_output_error: float | None = None,
    max_float_layers: int | None = None,
    max_evaluations: int = 10,
    measure_candidate: Callable[[ModelFiles], float] | None = None,
    distributed: bool = True,
) -> dict[str, Any]:
    """Quantize the model in ``model_dir`` with calibration data and save it.

    Returns the per-layer report (thresholds chosen, and what every algo would choose).
    The default file names (``'__model__'`` / ``'__params__'``, :data:`qptq.naming.SEED_MODEL_FILENAME`) follow
    the input's naming: ``*.pdmodel`` in, ``model.pdmodel`` + ``model.pdiparams`` out (PaddleSlim 2.6);
    ``__model__`` in, ``__model__`` + ``__params__`` out (the seeds); PIR in, ``inference.json`` out.
    ``None`` / ``None`` writes ``inference.pdmodel`` (or ``.json``) + ``inference.pdiparams``.
    ``eval_function`` + ``max_metric_drop``, or ``max_output_error``: keep the layers that hurt most
    float until the model is within that budget (:mod:`qptq.budget`; report section ``budget``);
    ``measure_candidate(files)`` is recorded for the float model and each candidate (e.g. latency).
    Under ``paddle.distributed`` with several ranks, each rank calibrates on its own data, the
    statistics are merged (every rank gets the same thresholds) and rank 0 alone writes the model
    (:mod:`qptq.sharded`); ``distributed=False`` makes each rank work alone.
    """
    ptq = PostTrainingQuantization(
        executor, sample_generator, model_dir, model_filename, params_filename, batch_generator, data_loader,
        batch_size, batch_nums, scope, algo, hist_percent, quantizable_op_type, is_full_quantize, weight_bits,
        activation_bits, activation_quantize_type, weight_quantize_type, optimize_model, is_use_cache_file, cache_dir,
        skip_patterns, bias_correction, onednn_fallback, residual_add, progress, deploy_backend=deploy_backend,
        onnx_format=onnx_format, round_type=round_type, activation_symmetric=activation_symmetric,
        skip_tensor_list=skip_tensor_list, eval_function=eval_function, max_metric_drop=max_metric_drop,
        max_output_error=max_output_error, max_float_layers=max_float_layers, max_evaluations=max_evaluations,
        measure_candidate=measure_candidate, distributed=distributed)
    names = output_names(ptq.model.family, save_model_filename, save_params_filename, ptq.model.source)
    check_model_output(quantize_model_path, ptq.model.family, *names,
                       ptq.model.source)  # before calibration: a bad output fails in a second, not after
    ptq.quantize()
    ptq.save_quantized_model(quantize_model_path, *names)
    return ptq.report


quant_post = quant_post_static
