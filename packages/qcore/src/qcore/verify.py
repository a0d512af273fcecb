"""Running models and comparing them: outputs in the executor and deployed, evaluation, verification per backend.

The run-and-score helpers ``qcli``, the quantizers' reports and the benchmarks share: a model's outputs
in the executor (:func:`executor_outputs`) and on a backend (:func:`deployed_outputs`), in batches;
top-1 and latency for a set of models at once (:func:`evaluate`); and a quantized model verified on
the runtimes it may ship to (:func:`verify`: deployed vs simulated, agreement, latency). Every
model's runs are interleaved with the others' (:func:`qcore.scoring.interleaved_latency`) and the
latency is the median. Backends this machine cannot run are reported as such, never silently replaced.

This module sits on top of qcore: it imports :mod:`qcore.scoring`, :mod:`qcore.inference` and
:mod:`qcore.deploy`, and nothing in qcore imports it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .deploy import DeployTarget, OnnxTarget, get_target, host
from .inference import Predictor, create_predictor, run_predictor
from .model_io import Model, ModelFiles, load_model
from .scoring import agreement, interleaved_latency, relative_error, top1


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


def verify(
    float_files: ModelFiles | Path,
    int8_files: ModelFiles | Path,
    feed: Mapping[str, np.ndarray],
    backends: Sequence[str],
    *,
    repeats: int = 10,
    threads: int = 2,
    labels: np.ndarray | None = None,
    latency_batch: int = 8,
) -> dict[str, dict[str, Any]]:
    """Per backend: the int8 model's output error deployed vs simulated (None for an ``.onnx`` file, which
    has no simulation) and vs the float model, arg-max agreement with the float model on that backend,
    top-1 when ``labels`` are given (all on ``feed``), and float / int8 latency (on its first
    ``latency_batch`` rows). Either model may be an ``.onnx`` file (run on the ONNX runtimes only). A
    backend that cannot run (or cannot write the files it needs, such as OpenVINO's cache) says why
    under ``"unavailable"``."""
    simulated = load_model(int8_files).run(dict(feed))[0] if isinstance(int8_files, ModelFiles) else None
    result: dict[str, dict[str, Any]] = {}
    for name in backends:
        target = get_target(name)
        reason = (target.unavailable() or _file_problem(target, float_files) or _file_problem(target, int8_files)
                  or target.files_problem())
        if reason is not None:
            result[target.name] = {"unavailable": reason}
            continue
        predictors = {m: create_predictor(f, backend=target, threads=threads)
                      for m, f in (("float", float_files), ("int8", int8_files))}
        float_out, int8_out = (run_predictor(predictors[m], feed)[0] for m in ("float", "int8"))
        ms = interleaved_latency(predictors, {k: v[:latency_batch] for k, v in feed.items()}, repeats)
        row: dict[str, Any] = {
            "deployed_vs_simulated": None if simulated is None else round(relative_error(int8_out, simulated), 6),
            "int8_vs_float": round(relative_error(int8_out, float_out), 6),
            "agreement_with_float": round(agreement(int8_out, float_out), 2),
            "float_ms": round(ms["float"], 3),
            "int8_ms": round(ms["int8"], 3),
            "speedup": round(ms["float"] / ms["int8"], 3),
        }
        if labels is not None:
            row["top1_float"] = round(top1(float_out, labels), 2)
            row["top1_int8"] = round(top1(int8_out, labels), 2)
        result[target.name] = row
    return result


def _file_problem(target: DeployTarget, files: ModelFiles | Path) -> str | None:
    """Why ``target`` cannot run ``files`` (an ``.onnx`` file runs on the ONNX runtimes only), or None."""
    if isinstance(files, ModelFiles):
        return target.accepts(files.model_file)
    if isinstance(target, OnnxTarget):
        return None
    return f"{files.name} is an ONNX file, which runs on onnxruntime and openvino-runtime only"


def markdown_table(results: Mapping[str, Mapping[str, Any]], labels: tuple[str, str] = ("float", "int8")) -> str:
    """The :func:`verify` results as a markdown table, a row per backend; ``labels`` name the two models."""
    first, second = labels
    lines = [f"| backend | {first} ms | {second} ms | speed-up | deployed vs simulated | {second} vs {first} | "
             "agreement % |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for backend, row in results.items():
        if "unavailable" in row:
            lines.append(f"| {backend} | {row['unavailable']} | | | | | |")
            continue
        simulated = row["deployed_vs_simulated"]
        lines.append(f"| {backend} | {row['float_ms']:.2f} | {row['int8_ms']:.2f} | {row['speedup']:.2f}x | "
                     f"{'n/a' if simulated is None else f'{simulated:.2e}'} | {row['int8_vs_float']:.2e} | "
                     f"{row['agreement_with_float']:.1f} |")
    return "\n".join(lines)


#: An int8 model that does not beat its float model by this factor on a backend is said to gain nothing there.
MIN_SPEEDUP = 1.05


def slow_int8_warnings(results: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """One line per backend of ``results`` (:func:`verify`'s rows: ``float_ms``, ``int8_ms``) whose int8 model ran
    less than :data:`MIN_SPEEDUP` times as fast as its float model on this CPU, naming the fastest run measured."""
    timed = {name: row for name, row in results.items() if "int8_ms" in row}
    runs = [(row[f"{kind}_ms"], f"the {kind} model on {name}")
            for name, row in timed.items() for kind in ("float", "int8")]
    if not runs:
        return []
    fastest_ms, fastest = min(runs)
    return [
        f"{name}: int8 ran {row['float_ms'] / row['int8_ms']:.2f}x its float model's speed on this CPU "
        f"({host.cpu_class()}), no real gain; the fastest measured here was {fastest} ({fastest_ms:.2f} ms)"
        for name, row in timed.items()
        if row["float_ms"] < MIN_SPEEDUP * row["int8_ms"]
    ]
