"""Running a saved model in ``paddle.inference`` on a deployment backend.

``create_predictor(files, backend=...)`` builds a predictor for any format this toolkit reads
or writes (``*.pdmodel``, ``__model__`` + ``__params__``, one file per parameter, PIR ``*.json``)
on one of :data:`qcore.deploy.BACKEND_NAMES`. On ``onednn`` a QDQ model only runs int8 kernels
with *both* ``enable_onednn()`` and ``enable_onednn_int8()``, which the target sets; on
``openvino`` the engine only opens ``*.pdmodel`` names, so other legacy names are linked (or,
for one file per parameter, re-saved) under such names in a temporary directory first.

The run-and-score helpers ``qcli`` and the benchmarks share: a model's outputs in the executor
(:func:`executor_outputs`) and on a backend (:func:`deployed_outputs`), :func:`top1` and
:func:`agreement`, latency with the models' runs interleaved (:func:`interleaved_latency`), and
all of them for a set of models at once (:func:`evaluate`).
"""

from __future__ import annotations

import os
import time
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Union

import numpy as np
from paddle import inference

from .deploy import DeployTarget, OnnxPredictor, get_target
from .deploy.base import marked_backend
from .errors import ConfigError
from .model_io import Model, ModelFiles, find_model_files, load_model
from .outputs import repair
from .paddle_env import native_output_quiet

#: Set to 1 to see what Paddle Inference's passes print while a predictor is built (``qcli --verbose`` does).
PADDLE_LOGS_ENV = "QCORE_PADDLE_LOGS"


Predictor = Union[inference.Predictor, OnnxPredictor]


def create_predictor(
    files: ModelFiles | str | os.PathLike[str],
    *,
    backend: str | DeployTarget = "onednn",
    threads: int = 2,
    onednn: bool = True,
    int8: bool = True,
) -> Predictor:
    """A predictor for ``files`` (a :class:`ModelFiles`, a model directory, a model file, or an ``.onnx``
    file for the ONNX runtimes) on ``backend``.

    ``onednn=False`` is the same as ``backend="native"``; ``int8=False`` keeps oneDNN to its float
    kernels (the float baseline). A backend this machine cannot run (``tensorrt`` without a GPU)
    raises :class:`ConfigError`; so does one that would silently run another backend's kernels
    (``openvino`` on a PIR model). On ``onnxruntime`` / ``openvino-runtime`` a Paddle model is
    exported first (:func:`qcore.export.export_onnx`, into a temporary file), except where the runtime
    reads its family itself (the OpenVINO runtime reads legacy programs). A save a kill interrupted in
    the model's directory is finished first (:func:`qcore.outputs.repair`).
    """
    target = get_target("native" if not onednn else backend)
    if not isinstance(files, ModelFiles):
        files = Path(files) if str(files).endswith(".onnx") else find_model_files(files)
    repair(files.directory if isinstance(files, ModelFiles) else files.parent)
    own = target.own_predictor(files, threads)
    if own is not None:
        return own
    if isinstance(files, Path):
        raise ConfigError(f"{files} is an ONNX file; run it with backend='onnxruntime' or 'openvino-runtime'")
    if not int8:
        target = target.float_kernels()
    reason = target.unavailable() or target.accepts(files.model_file)
    if reason is not None:
        raise ConfigError(f"backend {target.name!r} cannot run {files.model_file}: {reason}")
    program = files.model_file.read_bytes()
    made_for = target.made_for_problem(marked_backend(program) if files.family == "legacy" else None)
    if made_for is not None:
        warnings.warn(f"{files.model_file}: {made_for}", stacklevel=2)
    problem = target.host_problem()
    if problem is not None and (b"quantize_linear" in program or b"fake_quantize" in program):  # a QDQ model
        warnings.warn(f"{files.model_file}: {problem}", stacklevel=2)
    files = target.predictor_files(files)
    if files.params_file is None:
        config = inference.Config(str(files.directory))
        config.set_prog_file(str(files.model_file))
    else:
        config = inference.Config(str(files.model_file), str(files.params_file))
    config.disable_glog_info()
    target.configure(config, threads)
    with native_output_quiet(os.environ.get(PADDLE_LOGS_ENV) != "1"):  # the passes print ~100 lines otherwise
        return inference.create_predictor(config)


def run_predictor(predictor: Predictor, feed: Mapping[str, np.ndarray]) -> list[np.ndarray]:
    """Feed arrays by input name, run, and return every output in order."""
    if isinstance(predictor, OnnxPredictor):
        return predictor.run(feed)
    for name in predictor.get_input_names():
        handle = predictor.get_input_handle(name)
        array = np.ascontiguousarray(feed[name])
        handle.reshape(list(array.shape))
        handle.copy_from_cpu(array)
    predictor.run()
    return [predictor.get_output_handle(n).copy_to_cpu() for n in predictor.get_output_names()]


def predict(files: ModelFiles, feed: Mapping[str, np.ndarray], **options: object) -> list[np.ndarray]:
    """One-shot :func:`create_predictor` + :func:`run_predictor`."""
    return run_predictor(create_predictor(files, **options), feed)  # type: ignore[arg-type]


def executor_outputs(model: Model | ModelFiles, feed_name: str, x: np.ndarray, batch: int = 250) -> np.ndarray:
    """First output of ``model`` (loaded, or its files) over ``x`` in ``paddle.static.Executor``, ``batch``
    rows at a time."""
    if not isinstance(model, Model):
        model = load_model(model)
    return np.concatenate([model.run({feed_name: x[i : i + batch]})[0] for i in range(0, len(x), batch)])


def deployed_outputs(
    model: ModelFiles | Predictor,
    feed_name: str,
    x: np.ndarray,
    backend: str | DeployTarget | None = None,
    *,
    threads: int = 2,
    batch: int = 250,
) -> np.ndarray:
    """First output of ``model`` (its files, or a predictor already built) over ``x`` in ``paddle.inference``
    on ``backend`` (None: oneDNN int8), ``batch`` rows at a time."""
    if isinstance(model, ModelFiles):
        model = create_predictor(model, backend=get_target(backend), threads=threads)
    return np.concatenate([run_predictor(model, {feed_name: x[i : i + batch]})[0] for i in range(0, len(x), batch)])


def top1(logits: np.ndarray, labels: np.ndarray) -> float:
    """Percent of rows whose arg-max (over the last axis) equals the label."""
    return float((logits.argmax(-1) == labels.reshape(-1)).mean() * 100)


def agreement(a: np.ndarray, b: np.ndarray) -> float:
    """Percent of rows on which two outputs pick the same arg-max (over the last axis)."""
    return float((a.argmax(-1) == b.argmax(-1)).mean() * 100)


def interleaved_latency(
    predictors: Mapping[str, Predictor], feed: Mapping[str, np.ndarray], repeats: int = 10, warmup: int = 2
) -> dict[str, float]:
    """Median milliseconds per run of each predictor, their runs interleaved (so load drifts hit all alike)."""
    for predictor in predictors.values():
        for _ in range(warmup):
            run_predictor(predictor, feed)
    times: dict[str, list[float]] = {label: [] for label in predictors}
    for _ in range(repeats):
        for label, predictor in predictors.items():
            start = time.perf_counter()
            run_predictor(predictor, feed)
            times[label].append(time.perf_counter() - start)
    return {label: float(np.median(t)) * 1000 for label, t in times.items()}


def evaluate(
    models: Mapping[str, ModelFiles],
    feed_name: str,
    x: np.ndarray,
    labels: np.ndarray,
    *,
    backend: str | DeployTarget | None = None,
    latency_rows: int = 8,
    repeats: int = 20,
    threads: int = 2,
) -> dict[str, dict[str, float]]:
    """Per model (by label): top-1 in the executor (``executor_top1``) and deployed on ``backend``
    (``deployed_top1``), and the median latency on the first ``latency_rows`` rows (``latency_ms``), every
    model's runs interleaved."""
    predictors = {
        label: create_predictor(files, backend=get_target(backend), threads=threads) for label, files in models.items()
    }
    latency = interleaved_latency(predictors, {feed_name: x[:latency_rows]}, repeats)
    return {
        label: {
            "executor_top1": top1(executor_outputs(files, feed_name, x), labels),
            "deployed_top1": top1(deployed_outputs(predictors[label], feed_name, x), labels),
            "latency_ms": latency[label],
        }
        for label, files in models.items()
    }
