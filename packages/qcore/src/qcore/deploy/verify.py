"""Verifying a quantized model on the runtimes it may ship to: deployed vs simulated, agreement, latency.

One function serves the quantizers' reports, ``qcli bench`` and the benchmarks: every model's
runs are interleaved with the others' (:func:`qcore.inference.interleaved_latency`) and the
latency is the median. Backends this machine cannot run are reported as such, never silently replaced.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..inference import agreement, create_predictor, interleaved_latency, run_predictor, top1
from ..model_io import ModelFiles, load_model
from . import get_target


def relative_error(got: np.ndarray, expected: np.ndarray) -> float:
    """Largest ``|got - expected|`` over the range of ``expected``."""
    return float(np.abs(got - expected).max() / max(float(np.abs(expected).max()), 1e-12))


def verify(
    float_files: ModelFiles,
    int8_files: ModelFiles,
    feed: Mapping[str, np.ndarray],
    backends: Sequence[str],
    *,
    repeats: int = 10,
    threads: int = 2,
    labels: np.ndarray | None = None,
    latency_batch: int = 8,
) -> dict[str, dict[str, Any]]:
    """Per backend: the int8 model's output error deployed vs simulated (and the float model's, for
    scale), arg-max agreement with the float model on that backend, top-1 when ``labels`` are given
    (all on ``feed``), and float / int8 latency (on its first ``latency_batch`` rows). A backend that
    cannot run says why under ``"unavailable"``."""
    simulated = load_model(int8_files).run(dict(feed))[0]
    result: dict[str, dict[str, Any]] = {}
    for name in backends:
        target = get_target(name)
        reason = target.unavailable() or target.accepts(int8_files.model_file)
        if reason is not None:
            result[target.name] = {"unavailable": reason}
            continue
        predictors = {m: create_predictor(f, backend=target, threads=threads)
                      for m, f in (("float", float_files), ("int8", int8_files))}
        float_out, int8_out = (run_predictor(predictors[m], feed)[0] for m in ("float", "int8"))
        ms = interleaved_latency(predictors, {k: v[:latency_batch] for k, v in feed.items()}, repeats)
        row: dict[str, Any] = {
            "deployed_vs_simulated": round(relative_error(int8_out, simulated), 6),
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


def markdown_table(results: Mapping[str, Mapping[str, Any]]) -> str:
    """The :func:`verify` results as a markdown table, a row per backend."""
    lines = ["| backend | float ms | int8 ms | speed-up | deployed vs simulated | int8 vs float | agreement % |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for backend, row in results.items():
        if "unavailable" in row:
            lines.append(f"| {backend} | {row['unavailable']} | | | | | |")
            continue
        lines.append(f"| {backend} | {row['float_ms']:.2f} | {row['int8_ms']:.2f} | {row['speedup']:.2f}x | "
                     f"{row['deployed_vs_simulated']:.2e} | {row['int8_vs_float']:.2e} | "
                     f"{row['agreement_with_float']:.1f} |")
    return "\n".join(lines)
