"""Accuracy budget: keep the most sensitive layers float until the quantized model is within budget.

One calibration serves every candidate. A candidate is the float graph rewritten with the
calibrated thresholds, except for the ``k`` layers that hurt most when quantized alone
(their *sensitivity*: the model's output error on calibration batches with only that layer
quantized, label-free). The smallest ``k`` within budget is found by bisection over that
ranking, so a model with ``n`` layers costs ``n`` cheap sensitivity runs plus about
``log2(n) + 2`` evaluations of the user's metric (or of the output error).
"""

from __future__ import annotations

import logging
import math
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from qcore.deploy import Deployment
from qcore.errors import QuantError
from qcore.graph import Graph
from qcore.model_io import ModelFiles

from .calibrate import Calibration, run_batches
from .config import Budget, TargetConfig
from .plan import Plan
from .rewrite import rewritten_clone

log = logging.getLogger(__name__)

def score_of(budget: Budget, files: ModelFiles, float_layers: int | None) -> float:
    """``budget.eval_function(files)`` as a float; one line naming the candidate if it fails or is not a number."""
    assert budget.eval_function is not None
    which = "the float model" if float_layers is None else f"the candidate with {float_layers} layers float"
    try:
        score = budget.eval_function(files)
    except Exception as exc:
        raise QuantError(f"eval_function failed on {which} ({files.model_file}): {type(exc).__name__}: {exc}") from exc
    real = isinstance(score, (int, float, np.integer, np.floating)) and not isinstance(score, bool)
    if not real or not math.isfinite(score):
        raise QuantError(
            f"eval_function returned {score!r} for {which}; it must return a finite number (higher is better)"
        )
    return float(score)


def output_error(outputs: Sequence[np.ndarray], reference: Sequence[np.ndarray]) -> float:
    """Relative L2 error of every model output against the float model's, over all batches."""
    diff = sum(float(np.sum((o.astype(np.float64) - r) ** 2)) for o, r in zip(outputs, reference))
    norm = sum(float(np.sum(r.astype(np.float64) ** 2)) for r in reference)
    return math.sqrt(diff / norm) if norm > 0 else math.sqrt(diff)


@dataclass
class Search:
    """The candidates tried (float layer count -> score) and the one chosen."""

    tried: dict[int, float] = field(default_factory=dict)
    measured: dict[int, float] = field(default_factory=dict)  # Budget.measure of each candidate tried
    chosen: int = 0
    met: bool = False


def smallest_within(budget: Budget, evaluate: Callable[[int, Search], float], float_score: float,
                    layers: int) -> Search:
    """Bisect for the fewest float layers (most sensitive first) whose candidate meets ``budget``.

    ``evaluate(k, search)`` scores the candidate with the ``k`` most sensitive layers float. Assumes the
    score improves with ``k`` (it usually does; the search keeps the best candidate it saw either
    way). When even the largest allowed ``k`` misses the budget, the best candidate tried is chosen.
    """
    search = Search()
    top = layers if budget.max_float_layers is None else min(layers, budget.max_float_layers)

    def ok(k: int) -> bool:
        if k not in search.tried:
            search.tried[k] = evaluate(k, search)
        return budget.within(search.tried[k], float_score)

    if ok(0):
        search.met = True
        return search
    if not ok(top):
        search.chosen = min(search.tried, key=lambda k: (-search.tried[k], k) if budget.eval_function
                            else (search.tried[k], k))
        return search
    low, high = 0, top  # low misses, high meets
    while high - low > 1 and len(search.tried) < budget.max_evaluations:
        middle = (low + high) // 2
        low, high = (low, middle) if ok(middle) else (middle, high)
    search.chosen, search.met = high, True
    return search


def report(budget: Budget, search: Search, float_score: float, sensitivity: list[dict[str, Any]],
           seconds: float, float_measured: float | None = None) -> dict[str, Any]:
    """The ``budget`` section of the PTQ report."""
    limit = budget.max_metric_drop if budget.eval_function is not None else budget.max_output_error
    return {
        "metric": budget.metric, "limit": limit, "float_score": float_score, "met": search.met,
        "float_layers": search.chosen, "evaluations": len(search.tried),
        "candidates": [{"float_layers": k, "score": s, **({"measured": search.measured[k]} if k in search.measured
                                                             else {})} for k, s in sorted(search.tried.items())],
        "sensitivity": sensitivity, "seconds": round(seconds, 3),
        **({"float_measured": float_measured} if float_measured is not None else {}),
    }


def search(graph: Graph, plan: Plan, calibration: Calibration, budget: Budget, *, target: TargetConfig,
           batches: list[dict[str, np.ndarray]], float_files: ModelFiles, per_channel: bool
           ) -> tuple[dict[int, str], dict[str, Any]]:
    """Which layers (by position in the plan's targets) go back to float to meet ``budget``, with the reason for
    each, and the report section. Candidates are clones of ``graph`` rewritten as the plan says (with those
    layers float), scored on ``batches`` (label-free) or by ``budget.eval_function`` on their saved files."""
    start = time.perf_counter()
    deployment: Deployment = target.deployment
    reference = run_batches(graph, batches)
    ops = plan.targets.ops
    layers = [i for i, t in enumerate(ops) if t.weight is not None and t.for_conv is None]

    def candidate(float_layers: Iterable[int]) -> Graph:
        return rewritten_clone(graph, plan, deployment, calibration, target.targets, per_channel=per_channel,
                               keep_float={i: "accuracy budget: candidate" for i in float_layers})

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

    float_score = 0.0 if budget.eval_function is None else score_of(budget, float_files, None)
    float_measured = None if budget.measure is None else float(budget.measure(float_files))
    found = smallest_within(budget, evaluate, float_score, len(order))
    if not found.met:
        best = found.tried[found.chosen]
        miss = float_score - best - (budget.max_metric_drop or 0) if budget.eval_function else best - (
            budget.max_output_error or 0)
        log.warning("accuracy budget not met: the best candidate tried (%d layers float, score %.4g) misses it by "
                    "%.4g; saving it", found.chosen, best, miss)
    kept = {
        order[rank]: f"accuracy budget: sensitivity rank {rank + 1} of {len(order)} "
                     f"(output error {alone[order[rank]]:.3g} with only this layer quantized)"
        for rank in range(found.chosen)
    }  # fmt: skip
    sensitivity = [{"op": ops[i].op.seed_type, "scope": ops[i].op.scope_name,
                    "weight": ops[i].weight.name if ops[i].weight else None, "output_error": alone[i]}
                   for i in order]
    return kept, report(budget, found, float_score, sensitivity, time.perf_counter() - start, float_measured)
