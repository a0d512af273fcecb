"""Sharded calibration: each rank of a ``paddle.distributed`` job calibrates on its own data.

Used by :class:`~qptq.static.PostTrainingQuantization` when ``paddle.distributed`` is
initialised with more than one process (``distributed=False`` turns it off). Every rank:

1. checks that all ranks quantize the same model with the same settings (a mismatch is a
   :class:`~qcore.errors.ConfigError` on every rank, before any calibration or output);
2. calibrates its own batches;
3. exchanges its statistics with every other rank and merges them in rank order, so all end with
   the same observers and therefore the same thresholds.

The merge is exact by construction, not by the luck of the data: a
:class:`~qcore.observers.HistogramObserver`'s bins sit on one fixed power-of-two grid and its
counts are integers, so its histogram is a function of the values it saw, not of their order or
of how they were split; the per-batch abs max sum (``avg``) is an exact integer sum too. The
merged observers, and every threshold read from them (``abs_max``, ``hist``, ``KL``, ``mse``,
``emd``, ``avg``), are those of one process calibrating the same batches in any order. The bias
correction's channel means are float64 sums: equal to one process's up to summation order
(about 1e-16 relative). A rank with no data contributes nothing.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import numpy as np

from qcore.deploy import OpTarget
from qcore.distributed import DistributedError, active, all_gather, check_same, digest_files, world
from qcore.errors import ConfigError, DataError, QuantError
from qcore.graph import Graph
from qcore.model_io import Model
from qcore.observers import HistogramObserver

from .calibrate import Calibration, ChannelMean, calibrate

#: How :func:`qptq.data.feed_batches` reports a source that yielded nothing (an empty shard here).
if TYPE_CHECKING:
    from .config import PTQConfig

EMPTY = "calibration data is empty"


def settings(config: PTQConfig) -> dict[str, Any]:
    """The options of a run that change the result, for :func:`check_same`."""
    target, calibration, deployment = config.target, config.calibration, config.target.deployment
    return {
        "algo": calibration.algo, "hist_percent": calibration.hist_percent, "weight_bits": deployment.weight_bits,
        "activation_bits": deployment.activation_bits, "per_channel": calibration.per_channel,
        "op_types": list(target.op_types), "skip_patterns": list(target.skip_patterns),
        "skip_tensor_list": sorted(target.skip_tensors), "bias_correction": calibration.bias_correction,
        "round_type": calibration.round_type, "residual_add": target.residual_add,
        "onednn_fallback": deployment.fallback, "deploy_backend": deployment.name,
        "optimize_model": target.optimize_model,
    }  # fmt: skip


def model_identity(model: Model) -> dict[str, Any]:
    """What identifies a loaded model: its IR family and a digest of its files."""
    source = model.source
    files = [] if source is None else [source.model_file, source.params_file or source.directory]
    return {"family": model.family, "files (sha256)": digest_files(files) if files else None}


def calibrate_sharded(
    graph: Graph,
    targets: list[OpTarget],
    config: PTQConfig,
    model: Model,
    *,
    channel_means: dict[str, ChannelMean] | None = None,
    keep_samples: int = 0,
) -> Calibration:
    """:func:`~qptq.calibrate.calibrate` over this rank's batches of ``config.data``, merged over every rank.

    In a single process, or with ``distributed=False``, this is exactly ``calibrate(...)``.
    """
    batches, progress = config.data.batches(model), config.calibration.progress
    if not active(config.calibration.distributed):
        return calibrate(graph, targets, batches, progress=progress, channel_means=channel_means,
                         keep_samples=keep_samples)
    if config.budget is not None:
        raise ConfigError("an accuracy budget is not supported with sharded calibration (each rank would score its "
                          "own batches); run it in one process or pass distributed=False")
    try:
        return _calibrate_ranks(config, model, graph, targets, batches, progress, channel_means, keep_samples)
    except DistributedError as exc:  # before any output: say so
        raise DistributedError(f"{exc}; nothing was written") from exc


def _calibrate_ranks(config: PTQConfig, model: Model, graph: Graph, targets: list[OpTarget],
                     batches: Iterable[dict[str, np.ndarray]], progress: bool,
                     channel_means: dict[str, ChannelMean] | None, keep_samples: int) -> Calibration:
    check_same("quantization settings", settings(config), "pass the same arguments on every rank")
    check_same("model", model_identity(model), "load the same model on every rank")
    rank, _ = world()
    local, problem = None, None
    try:
        local = calibrate(graph, targets, batches, progress=progress, channel_means=channel_means,
                          keep_samples=keep_samples)
    except DataError as exc:
        if str(exc).startswith(EMPTY):  # an empty shard is allowed: it contributes nothing
            local = calibrate(graph, targets, [], channel_means=channel_means)
        else:
            problem = exc
    except QuantError as exc:  # told to every rank, so none waits for this one
        problem = exc
    summary = None if local is None else (_portable(local, rows=0), local.samples_kept)
    gathered = _gather_or_raise((summary, problem), "calibration statistics")
    if not any(part["batches"] for part, _ in gathered):
        raise DataError("no rank has calibration data; give at least one rank a non-empty shard")
    parts = [part for part, _ in gathered]
    if keep_samples and local is not None:  # kept samples: only the rows the lowest ranks need travel
        room = max(0, keep_samples - sum(kept for _, kept in gathered[:rank]))
        rows = all_gather(_portable(local, rows=room)["samples_of"], "kept activation samples")
        for part, samples in zip(parts, rows):
            part["samples_of"] = samples
    return _merged(parts, keep_samples)


def _gather_or_raise(mine: tuple[Any, QuantError | None], what: str) -> list[Any]:
    """Exchange ``(value, error)`` pairs; if any rank had an error, raise it on that rank and name it on the others."""
    rank, _ = world()
    value, problem = mine
    gathered = all_gather((value, None if problem is None else f"{type(problem).__name__}: {problem}"), what)
    failed = [(r, msg) for r, (_, msg) in enumerate(gathered) if msg is not None]
    if problem is not None:
        raise problem
    if failed:
        other, msg = failed[0]
        raise DistributedError(f"rank {rank}: stopped because rank {other} failed during {what}: {msg}")
    return [v for v, _ in gathered]


def _portable(c: Calibration, rows: int | None = None) -> dict[str, Any]:
    """``c`` as plain data for the exchange, with at most ``rows`` kept samples per activation (None: all)."""
    return {
        "observers": {n: o.state() for n, o in c.observers.items()},
        "channel_means": {n: (m.axis, m.total, m.count) for n, m in c.channel_means.items()},
        "samples_of": {n: _first_rows(v, rows) for n, v in c.activation_samples.items()},
        "batches": c.batches, "samples": c.samples,
    }  # fmt: skip


def _first_rows(chunks: list[np.ndarray], rows: int | None) -> list[np.ndarray]:
    if rows is None:
        return list(chunks)
    kept = []
    for chunk in chunks:
        if rows <= 0:
            break
        kept.append(chunk[:rows])
        rows -= len(kept[-1])
    return kept


def _merged(parts: list[dict[str, Any]], keep_samples: int) -> Calibration:
    """Merge every rank's statistics in rank order (rank 0's data first, as one process reading them in turn)."""
    result = Calibration()
    for name in parts[0]["observers"]:
        merged = HistogramObserver()
        for part in parts:
            merged.merge(HistogramObserver.from_state(part["observers"][name]))
        result.observers[name] = merged
    for name, (axis, _, _) in parts[0]["channel_means"].items():
        mean = ChannelMean(axis)
        for part in parts:
            _, total, count = part["channel_means"][name]
            if count:
                mean.merge(ChannelMean(axis, total, count))
        result.channel_means[name] = mean
    for name in parts[0]["samples_of"]:
        kept: list[np.ndarray] = []
        room = keep_samples
        for part in parts:
            for rows in part["samples_of"][name]:
                if room > 0:
                    kept.append(rows[:room])
                    room -= len(kept[-1])
        result.activation_samples[name] = kept
    result.batches = sum(p["batches"] for p in parts)
    result.samples = sum(p["samples"] for p in parts)
    result.samples_kept = min(keep_samples, result.samples)
    return result
