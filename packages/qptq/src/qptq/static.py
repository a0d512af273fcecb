"""Static post-training quantization: calibrate activation thresholds, store int8 weights.

``PostTrainingQuantization`` follows PaddleSlim's class; ``quant_post_static`` (alias
``quant_post``) is the one-call form with the seeds' signature.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from itertools import islice
from pathlib import Path
from typing import Any

from qcore.deploy import OpTarget, Targets
from qcore.deploy.apply import RUNS_FLOAT_NOTE, Applied, Planned
from qcore.distributed import on_rank0
from qcore.graph import Graph, open_graph
from qcore.graph.replay import LayerReplay, replayable
from qcore.model_io import ModelFiles, check_model_output, load_model
from qcore.outputs import write_bytes
from qcore.paddle_env import eager_mode
from qcore.thresholds import thresholds_all_algos

from .adaround import AdaRounded, adaround
from .auto import AUTO, AutoChoice, choose_thresholds
from .bias_correction import correct_bias, input_means
from .budget import EvalFunction, Search, output_error, score_of, smallest_within
from .budget import report as budget_report
from .calibrate import Calibration, run_batches, stacked_by_shape
from .config import PTQConfig
from .naming import output_names
from .sharded import calibrate_sharded
from .smooth import Smoothing, apply_smoothing, choose_smoothing, smoothable

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
    removed afterwards) instead of samples. The keywords become one validated
    :class:`~qptq.config.PTQConfig` (:attr:`config`); its settings read as attributes too
    (``ptq.algo``, ``ptq.op_types``, ...). :meth:`from_config` starts from a built one.
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
        self._start(PTQConfig.from_call(locals()))

    @classmethod
    def from_config(cls, config: PTQConfig) -> PostTrainingQuantization:
        """The quantizer of a built :class:`~qptq.config.PTQConfig` (loads its model)."""
        ptq = cls.__new__(cls)
        ptq._start(config)
        return ptq

    def _start(self, config: PTQConfig) -> None:
        self.config = config
        self.model = load_model(config.model_dir, config.model_filename, config.params_filename)
        config.check_model(self.model)
        if config.executor is not None:
            self.model.executor = config.executor
        self.graph: Graph | None = None
        self.report: dict[str, Any] = {}
        self._auto: dict[str, AutoChoice] = {}
        self._rounded: dict[int, AdaRounded] = {}
        self._smoothing: list[Smoothing] = []

    def __getattr__(self, name: str) -> Any:
        """A setting of :attr:`config` (``ptq.algo``, ``ptq.weight_bits``, ``ptq.deployment``, ...)."""
        if name == "config":  # not set yet: no recursion
            raise AttributeError(name)
        return getattr(self.config, name)

    def quantize(self) -> Any:
        """Calibrate and rewrite; returns the quantized program."""
        start = time.perf_counter()
        graph = open_graph(self.model)
        if self.optimize_model:
            graph.fold_conv_bn()
        planned = self._planned_targets(graph)
        self._smoothing = self._smooth(graph, planned.ops) if self.algo == AUTO else []
        if any(choice.factors is not None for choice in self._smoothing):
            planned = self._planned_targets(graph)  # the smoothed readers read the multiply's output
        targets = planned.ops
        means = input_means(targets) if self.bias_correction else {}
        layerwise = self.algo == AUTO or self.round_type == "adaround"
        calibration = calibrate_sharded(self, graph, targets, self.config.batches(self.model), enabled=self.distributed,
                                        progress=self.progress, channel_means=means,
                                        keep_samples=LAYERWISE_SAMPLES if layerwise else 0)  # merged over ranks
        if self.cache_file is not None:
            self._checkpoint(calibration)
        candidates = {
            name: thresholds_all_algos(obs, self.activation_bits, self.hist_percent)
            for name, obs in calibration.observers.items()
        }
        # where the run's grid is symmetric for signed tensors, auto also tries the asymmetric grid per activation
        alternative = (functools.partial(self._grid, calibration, grids="asymmetric")
                       if self.grids == "unsigned" and self.deployment.target.asymmetric_activations else None)
        self._auto = (choose_thresholds(graph, targets, candidates, calibration.activation_samples,
                                        self.activation_bits, functools.partial(self._grid, calibration),
                                        alternative)
                      if self.algo == AUTO else {})
        self._rounded = self._adaround(graph, targets, calibration) if self.round_type == "adaround" else {}
        calibration.activation_samples.clear()
        kept: dict[int, str] = {}
        budget_report = None
        if self.budget is not None:
            kept, budget_report = self._meet_budget(graph, targets, candidates, calibration)
        self.report = self._rewrite(graph, planned, candidates, calibration, kept)
        if budget_report is not None:
            self.report["budget"] = budget_report
        if self._smoothing:
            self.report["smoothing"] = {c.activation: {"alpha": c.alpha, "layer_output_error": _report_errors(c.errors)}
                                        for c in self._smoothing}
        if "float_layers" in self.report:
            log.warning("%s", self.report["float_layers"])
        self.report["calibration_seconds"] = round(time.perf_counter() - start, 3)
        self.graph = graph
        return graph.model.program

    def _planned_targets(self, graph: Graph) -> Targets:
        """The ops of ``quantizable_op_type`` not skipped (by pattern or ``skip_tensor_list``) plus what the
        deployment target adds, and the activations whose readers stay float; the same order on every clone."""
        joins = self.residual_add and "elementwise_add" not in self.op_types  # else they are ordinary targets
        return self.deployment.targets(graph, self.op_types, self.skip_patterns, self.skip_tensors,
                                       residual_add=joins)

    def _smooth(self, graph: Graph, targets: list[OpTarget]) -> list[Smoothing]:
        """Activation smoothing where it lowers the matmul outputs' error (:mod:`qptq.smooth`), from a pass
        that keeps samples of the matmul inputs; returns the choice for each."""
        groups = smoothable(graph, targets)
        if not groups:
            return []
        readers = [t for group in groups.values() for t in group]
        seen = calibrate_sharded(self, graph, readers, self.config.batches(self.model), enabled=self.distributed,
                                 progress=self.progress, keep_samples=LAYERWISE_SAMPLES)
        choices = choose_smoothing(graph, groups, seen.activation_samples, weight_bits=self.weight_bits,
                                   activation_bits=self.activation_bits, hist_percent=self.hist_percent,
                                   grid=functools.partial(self.deployment.activation_grid, self.grids))
        smoothed = apply_smoothing(graph, groups, choices)
        log.info("activation smoothing: %d of %d matmul inputs smoothed", smoothed, len(groups))
        return choices

    def _adaround(self, graph: Graph, targets: list[OpTarget], calibration: Calibration) -> dict[int, AdaRounded]:
        """AdaRound's weight for every replayable weighted target, by position in ``targets``."""
        max_code = self.deployment.weight_max_code(graph.family)
        rounded = {}
        for i, target in enumerate(targets):
            if target.weight is None or not target.activations or not replayable(graph, target.op):
                continue
            kept = calibration.activation_samples.get(target.activations[0].name)
            if not kept:
                continue
            axis = graph.weight_channel_axis(target.op) if self.per_channel else None
            with eager_mode():  # on the largest stack of same-shape samples
                rounded[i] = adaround(LayerReplay(graph, target.op), stacked_by_shape(kept)[0],
                                      graph.get_param(target.weight.name), bits=self.weight_bits, axis=axis,
                                      max_code=max_code)
        return rounded

    def _meet_budget(
        self, graph: Graph, targets: list[OpTarget], candidates: dict[str, dict[str, float]], calibration: Calibration
    ) -> tuple[dict[int, str], dict[str, Any]]:
        """Which layers (by position in ``targets``) go back to float to meet :attr:`budget`, and the report."""
        budget = self.budget
        assert budget is not None
        start = time.perf_counter()
        batches = list(islice(self.config.batches(self.model), BUDGET_BATCHES))
        reference = run_batches(graph, batches)
        layers = [i for i, t in enumerate(targets) if t.weight is not None and t.for_conv is None]

        def candidate(float_layers: Iterable[int]) -> Graph:
            clone = graph.clone()
            keep = {i: "accuracy budget: candidate" for i in float_layers}
            self._rewrite(clone, self._planned_targets(clone), candidates, calibration, keep)
            return clone

        alone = {i: output_error(run_batches(candidate(set(layers) - {i}), batches), reference) for i in layers}
        order = sorted(layers, key=lambda i: (-alone[i], i))

        def evaluate(k: int, search: Search) -> float:
            trial = candidate(order[:k])
            if budget.eval_function is None and budget.measure is None:
                return output_error(run_batches(trial, batches), reference)
            with tempfile.TemporaryDirectory(prefix="qptq-budget-") as tmp:
                files = trial.save(Path(tmp) / "candidate")
                if budget.measure is not None:
                    search.measured[k] = float(budget.measure(files))
                if budget.eval_function is None:
                    return output_error(run_batches(trial, batches), reference)
                return score_of(budget, files, k)

        assert self.model.source is not None
        float_score = 0.0
        if budget.eval_function is not None:
            float_score = score_of(budget, self.model.source, None)
        float_measured = None if budget.measure is None else float(budget.measure(self.model.source))
        search = smallest_within(budget, evaluate, float_score, len(order))
        if not search.met:
            best = search.tried[search.chosen]
            miss = float_score - best - (budget.max_metric_drop or 0) if budget.eval_function else best - (
                budget.max_output_error or 0)
            log.warning("accuracy budget not met: the best candidate tried (%d layers float, score %.4g) misses it by "
                        "%.4g; saving it", search.chosen, best, miss)
        kept = {
            order[rank]: f"accuracy budget: sensitivity rank {rank + 1} of {len(order)} "
                         f"(output error {alone[order[rank]]:.3g} with only this layer quantized)"
            for rank in range(search.chosen)
        }  # fmt: skip
        sensitivity = [{"op": targets[i].op.seed_type, "scope": targets[i].op.scope_name,
                        "weight": targets[i].weight.name if targets[i].weight else None, "output_error": alone[i]}
                       for i in order]
        return kept, budget_report(budget, search, float_score, sensitivity, time.perf_counter() - start,
                                   float_measured)

    def _rewrite(
        self,
        graph: Graph,
        targets: Targets,
        candidates: dict[str, dict[str, float]],
        calibration: Calibration,
        keep_float: Mapping[int, str] | None = None,
    ) -> dict[str, Any]:
        """Quantize ``targets`` except those ``keep_float`` names (by position, with the reason)."""
        keep_float = keep_float or {}
        chosen = {name: algos[self.algo] for name, algos in candidates.items()}
        grids: dict[str, tuple[float, float]] = {}

        def per_operand(values: dict[str, float], target: OpTarget) -> list[float]:
            """By position among the op's activation operands (PIR names shift as ops are inserted, positions
            do not); 0.0 (float) for the operands ``target`` leaves out (e.g. the conv side of a fused add)."""
            wanted = {a.name for a in target.activations}
            return [values[a.name] if a.name in wanted else 0.0 for a in graph.activation_operands(target.op)]

        def plan(shared: Mapping[str, float]) -> list[Planned]:
            """Each op with the thresholds the target runs (oneDNN shares scales along some chains) on our grids."""
            grids.update((name, self._grid(calibration, name, threshold)) for name, threshold in shared.items())
            deployed = {name: grid[0] for name, grid in grids.items()}
            offsets = {name: grid[1] for name, grid in grids.items()}
            return [
                Planned(t, per_operand(deployed, t), per_channel=self.per_channel, keep_float=keep_float.get(i),
                        act_offsets=per_operand(offsets, t) if self.grids != "symmetric" else None,
                        weight_thresholds=self._rounded[i].thresholds if i in self._rounded else None,
                        weight_value=self._rounded[i].weight if i in self._rounded else None)
                for i, t in enumerate(targets.ops)
            ]  # fmt: skip

        done = self.deployment.rewrite(graph, targets, chosen, plan)
        float_summary = self.deployment.float_summary(done.applied, graph.family)
        layers = [self._layer_report(graph, a, candidates, chosen, done.thresholds, grids, done.unsigned, calibration)
                  for a in done.applied]
        for i, rounded in self._rounded.items():
            if "weight" in layers[i]:
                layers[i]["weight"]["adaround"] = {
                    "used": rounded.used, "loss_nearest": round(rounded.loss_nearest, 6),
                    "loss_adaround": round(rounded.loss_adaround, 6), "flipped": round(rounded.flipped, 4)}
        return {"algo": self.algo, "deploy_backend": self.deployment.name,
                "weight_max_code": self.deployment.weight_max_code(graph.family),
                "batches": calibration.batches, "samples": calibration.samples, "layers": layers,
                **done.rewrites, **({"float_layers": float_summary} if float_summary else {})}

    def _grid(self, calibration: Calibration, name: str, threshold: float, grids: str | None = None
              ) -> tuple[float, float]:
        """The ``(threshold, offset)`` activation ``name`` deploys with (:meth:`Deployment.activation_grid`) on
        ``grids`` (default: ``auto``'s choice for it, else the run's); symmetric grids need no calibrated range
        (oneDNN's shared scales reach tensors not calibrated)."""
        choice = self._auto.get(name)
        grids = grids or (choice.grid if choice is not None and choice.grid else self.grids)
        if grids == "symmetric":
            return threshold, 0.0
        seen = calibration.observers[name]
        return self.deployment.activation_grid(grids, threshold, seen.min, seen.max)

    def _layer_report(self, graph: Graph, applied: Applied, candidates: dict[str, dict[str, float]],
                      chosen: dict[str, float], shared: dict[str, float], grids: dict[str, tuple[float, float]],
                      unsigned: set[str], calibration: Calibration) -> dict[str, Any]:
        target = applied.planned.target
        entry: dict[str, Any] = {"op": target.op.seed_type, "scope": target.op.scope_name, "inputs": {}}
        if applied.left_float is not None:
            entry["left_float"] = applied.left_float
            return entry
        done = applied.done
        assert done is not None
        if target.runs_float:
            entry["runs_float"] = RUNS_FLOAT_NOTE
        if done.weight is not None and target.weight is not None:
            entry["weight"] = {"name": target.weight.name, "thresholds": done.weight.thresholds.round(6).tolist()}
            if target.activations and target.activations[0].name in calibration.channel_means:
                entry["weight"]["bias_shift_max"] = correct_bias(
                    graph, target, done.weight, calibration.channel_means[target.activations[0].name]
                )
        for operand in target.activations:
            threshold, offset = grids[operand.name]
            info: dict[str, Any] = {"threshold": threshold,
                                    "all_algos": {k: round(v, 6) for k, v in candidates[operand.name].items()}}
            if offset:  # asymmetric: the grid spans offset +- threshold
                info["offset"] = offset
            if operand.name in unsigned:
                info["unsigned"] = True  # oneDNN runs it as u8; the simulation does too
            if operand.name in self._auto:
                choice = self._auto[operand.name]
                info["auto"] = {"algo": choice.algo, "layer_output_error": _report_errors(choice.errors)}
                if choice.alternative_errors is not None:  # the asymmetric grid won this activation
                    info["auto"]["grid"] = choice.grid
                    info["auto"]["layer_output_error_asymmetric"] = _report_errors(choice.alternative_errors)
            if shared[operand.name] != chosen[operand.name]:
                info["own_threshold"] = chosen[operand.name]  # oneDNN runs it with another tensor's scale
            if info["threshold"] <= 0:
                info["left_float"] = "activation was all zeros during calibration"
                log.warning("activation %s was all zeros during calibration; left in float", operand.name)
            entry["inputs"][operand.name] = info
        return entry

    def _checkpoint(self, calibration: Calibration) -> None:
        assert self.cache_file is not None
        self.cache_file.parent.mkdir(parents=True, exist_ok=True)
        states = {n: {k: _jsonable(v) for k, v in o.state().items()} for n, o in calibration.observers.items()}
        write_bytes(self.cache_file, json.dumps(states).encode())
        log.info("observer state checkpointed to %s", self.cache_file)

    def save_quantized_model(
        self,
        save_model_path: str | os.PathLike[str],
        model_filename: str | None = None,
        params_filename: str | None = None,
    ) -> ModelFiles:
        """Save the quantized model (same IR family as the input) atomically."""
        if self.graph is None:
            raise RuntimeError("call quantize() before save_quantized_model()")
        graph, names = self.graph, output_names(self.model.family, model_filename, params_filename)

        def write() -> ModelFiles:  # on rank 0 only under paddle.distributed; the other ranks wait for it
            files = self.deployment.save(graph, save_model_path, *names)
            if self.cache_file is not None and self.cache_file.exists():
                self.cache_file.unlink()
            return files

        return on_rank0(write, f"the quantized model to {save_model_path}", enabled=self.distributed)


def _report_errors(errors: Mapping[str, float]) -> dict[str, float]:
    """Layer output errors as the report shows them: six significant digits."""
    return {k: float(f"{v:.6g}") for k, v in errors.items()}


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
    save_model_filename: str | None = "__model__",
    save_params_filename: str | None = "__params__",
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
    ``eval_function`` + ``max_metric_drop``, or ``max_output_error``: keep the layers that hurt most
    float until the model is within that budget (:mod:`qptq.budget`; report section ``budget``);
    ``measure_candidate(files)`` is recorded for the float model and each candidate (e.g. latency).
    Under ``paddle.distributed`` with several ranks, each rank calibrates on its own data, the
    statistics are merged (every rank gets the same thresholds) and rank 0 alone writes the model
    (:mod:`qptq.sharded`); ``distributed=False`` makes each rank work alone.
    """
    ptq = PostTrainingQuantization.from_config(PTQConfig.from_call(locals()))
    family = ptq.model.family
    check_model_output(quantize_model_path, family, *output_names(family, save_model_filename, save_params_filename),
                       ptq.model.source)  # before calibration: a bad output fails in a second, not after
    ptq.quantize()
    ptq.save_quantized_model(quantize_model_path, save_model_filename, save_params_filename)
    return ptq.report


quant_post = quant_post_static
