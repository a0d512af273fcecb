"""Weight-only quantization of a ``paddle.nn.Layer`` in one call: ``quantize_(model, WeightOnlyConfig(...),
calibration)``.

Every ``paddle.nn.Linear`` (``[in, out]`` weight) whose name does not match ``skip`` gets group-wise codes
chosen by the configured algorithms, run in NNCF's order: AWQ-style scales (:mod:`.awq`, shared by the
linears that read one tensor, such as q / k / v), then clip search (:mod:`.clip_search`) or GPTQ
(:mod:`.gptq`) on the scaled weight. Calibration runs the float model once over the given batches with a
pre-hook on each linear summing its input Hessian (memory: one ``[in, in]`` float64 matrix per linear, flat
in the number of batches); round to nearest needs none. Every input Hessian comes from the float model (the
linears are not re-run one after another on quantized predecessors, as GPTQ's reference implementation does).

The layer afterwards computes the simulation: each linear's weight holds the dequantized codes (divided by
its AWQ scales), and :data:`WeightOnlyResult.codes` keeps the codes by weight name for the ONNX writers
(:func:`qcore.export.nbits.replace_matmuls`). The model is changed in place, as ``torchao.quantize_`` does.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from qcore.config import validate_choice
from qcore.errors import ConfigError, DataError
from qcore.groupwise import GroupCodes, check_bits, group_count, quantize_groups

from .awq import search_scales
from .clip_search import search_clip
from .gptq import HessianAccumulator, gptq

ALGOS = ("rtn", "gptq")
#: What a linear whose width ``group_size`` does not divide gets (NNCF's names): a one-line error, the largest
#: power-of-two group from ``group_size`` down to 32 that divides it (else int8 per channel), or float.
GROUP_FALLBACKS = ("error", "adjust", "ignore")
SMALLEST_ADJUSTED_GROUP = 32


@dataclass(frozen=True)
class WeightOnlyConfig:
    """What :func:`quantize_` does: ``bits`` 4 or 8; ``group_size`` input channels per step (-1: per output
    channel); asymmetric (zero points) unless ``symmetric``; ``algo`` ``"rtn"`` (round to nearest) or
    ``"gptq"``; ``awq`` activation-aware scales first; ``clip_search`` per-group range search (with
    ``"rtn"``); ``ratio`` the share of the weights (by count) at ``bits`` when 4, the rest int8: the linears
    whose 4-bit output error per weight is largest (mixed precision); ``group_size_fallback`` what a linear
    whose width ``group_size`` does not divide gets (:data:`GROUP_FALLBACKS`); linears whose full name
    matches one of the ``skip`` regular expressions stay float."""

    bits: int = 4
    group_size: int = 128
    symmetric: bool = False
    algo: str = "rtn"
    awq: bool = False
    clip_search: bool = False
    ratio: float = 1.0
    group_size_fallback: str = "error"
    skip: Sequence[str] = ()

    def __post_init__(self) -> None:
        check_bits(self.bits)
        validate_choice("algo", self.algo, ALGOS)
        validate_choice("group_size_fallback", self.group_size_fallback, GROUP_FALLBACKS)
        if not 0.0 < self.ratio <= 1.0:
            raise ConfigError(f"ratio={self.ratio!r} is not valid; use the share of weights at {self.bits} bits, "
                              "in (0, 1]")
        if self.clip_search and self.algo == "gptq":
            raise ConfigError("clip_search chooses the grids GPTQ chooses itself; use it with algo='rtn'")
        for pattern in self.skip:
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ConfigError(f"skip pattern {pattern!r} is not a regular expression: {exc}") from None

    @property
    def calibrated(self) -> bool:
        return self.algo == "gptq" or self.awq or self.clip_search


@dataclass
class LayerReport:
    name: str
    weight: str
    shape: tuple[int, int]
    bits: int
    group_size: int
    output_error: float | None  # relative layer output error on the calibration inputs (None without them)
    awq_alpha: float | None = None


@dataclass
class WeightOnlyResult:
    """What :func:`quantize_` did: codes (and AWQ input scales) by weight name, a row per linear."""

    codes: dict[str, GroupCodes] = field(default_factory=dict)
    input_scales: dict[str, np.ndarray] = field(default_factory=dict)  # weight name -> divide the input by it
    layers: list[LayerReport] = field(default_factory=list)
    seconds: float = 0.0

    def size_bytes(self) -> int:
        """Bytes of the codes (packed), steps (fp32) and zero points (packed) of every quantized linear."""
        total = 0
        for q in self.codes.values():
            k, n = q.codes.shape
            groups = k // q.group_size
            zero_bytes = 0 if q.zero_points is None else -(-groups * n * q.bits // 8)
            total += k * n * q.bits // 8 + groups * n * 4 + zero_bytes
        return total


def _linears(model: Any, skip: Sequence[str]) -> list[tuple[str, Any]]:
    import paddle

    found = [(name, layer) for name, layer in model.named_sublayers()
             if isinstance(layer, paddle.nn.Linear) and not any(re.search(p, name) for p in skip)]
    if not found:
        raise ConfigError("the model has no paddle.nn.Linear outside the skip patterns; nothing to quantize "
                          "(weight-only quantization takes Linear layers)")
    return found


def _calibrate(model: Any, linears: list[tuple[str, Any]], batches: Iterable[Any],
               run: Callable[[Any, Any], Any]) -> tuple[dict[str, HessianAccumulator], list[list[str]]]:
    """Input Hessians of every linear over ``batches``, and the linears that read one tensor (by first batch)."""
    import paddle

    sums = {name: HessianAccumulator(int(layer.weight.shape[0])) for name, layer in linears}
    readers: dict[int, list[str]] = {}
    held: list[Any] = []  # the first batch's inputs stay alive, so that no two of them share an id
    first = [True]

    def hook(name: str) -> Callable[[Any, tuple[Any, ...]], None]:
        def pre(layer: Any, inputs: tuple[Any, ...]) -> None:
            sums[name].update(inputs[0].numpy())
            if first[0]:
                readers.setdefault(id(inputs[0]), []).append(name)
                held.append(inputs[0])
        return pre

    handles = [layer.register_forward_pre_hook(hook(name)) for name, layer in linears]
    try:
        with paddle.no_grad():
            for batch in batches:
                run(model, batch)
                first[0] = False
                held.clear()
    finally:
        for handle in handles:
            handle.remove()
    unused = [name for name, acc in sums.items() if not acc.rows]
    if len(unused) == len(sums):
        raise DataError("the calibration batches reached no linear layer; check that they are the model's inputs")
    if unused:
        raise DataError(f"the calibration batches never reached {unused[0]!r} ({len(unused)} linears in all); "
                        "pass batches that run every layer, or skip those layers")
    return sums, list(readers.values())


def _default_run(model: Any, batch: Any) -> Any:
    import paddle

    items = batch if isinstance(batch, (list, tuple)) else (batch,)
    return model(*(paddle.to_tensor(x) if isinstance(x, np.ndarray) else x for x in items))


def layer_group(k: int, config: WeightOnlyConfig) -> tuple[int, int] | None:
    """``(bits, group_size)`` for a linear of ``k`` input channels, None to leave it float (fallback
    ``"ignore"``); one :class:`ConfigError` line for a group size that does not divide ``k`` under ``"error"``."""
    size = config.group_size
    if size == -1 or k % size == 0 or config.group_size_fallback == "error":
        group_count(k, size)
        return config.bits, size
    if config.group_size_fallback == "ignore":
        return None
    while size >= SMALLEST_ADJUSTED_GROUP:
        if k % size == 0:
            return config.bits, size
        size //= 2
    return 8, -1


@dataclass
class _Plan:
    """One linear's float weight, input Hessian, AWQ scales and, once quantized, its codes and effective weight."""

    weight: np.ndarray
    hessian: np.ndarray | None
    scales: np.ndarray | None
    alpha: float | None
    group_size: int
    codes: GroupCodes | None = None
    effective: np.ndarray | None = None

    def quantize(self, config: WeightOnlyConfig, bits: int) -> None:
        w, h = self.weight, self.hessian
        if self.scales is not None:  # the weight rows times s read the input divided by s: its Hessian scales too
            w = w * self.scales[:, None]
            h = h / np.outer(self.scales, self.scales)
        if config.algo == "gptq":
            self.codes = gptq(w, h, bits, self.group_size, config.symmetric)
        else:
            clip = search_clip(w, h, bits, self.group_size, config.symmetric) if config.clip_search else 1.0
            self.codes = quantize_groups(w, bits, self.group_size, config.symmetric, clip)
        effective = self.codes.dequantize().astype(np.float64)
        self.effective = effective if self.scales is None else effective / self.scales[:, None]

    def output_error(self) -> float:
        """``tr(D^T H D)`` of the weight change (``||D||^2`` without calibration inputs)."""
        d = self.effective - self.weight
        return float(np.einsum("in,ij,jn->", d, self.hessian, d)) if self.hessian is not None else float(np.sum(d * d))

    def relative_error(self) -> float | None:
        """The layer output error relative to its output on the calibration inputs (None without them)."""
        if self.hessian is None:
            return None
        w = self.weight
        return float(np.sqrt(self.output_error() / np.einsum("in,ij,jn->", w, self.hessian, w)))


def _promoted(plans: dict[str, _Plan], config: WeightOnlyConfig) -> list[str]:
    """The linears kept in int8 so that at most ``config.ratio`` of the weights (by count) are ``config.bits``:
    those whose low-bit output error per weight is largest first."""
    if config.ratio >= 1.0:
        return []
    total = sum(p.weight.size for p in plans.values())
    low = total
    chosen = []
    for name in sorted(plans, key=lambda n: -plans[n].output_error() / plans[n].weight.size):
        if low <= config.ratio * total:
            break
        chosen.append(name)
        low -= plans[name].weight.size
    return chosen


def quantize_(model: Any, config: WeightOnlyConfig, calibration: Iterable[Any] | None = None, *,
              run: Callable[[Any, Any], Any] = _default_run, progress: Callable[[str], None] | None = None
              ) -> WeightOnlyResult:
    """Quantize the weights of ``model``'s linears in place; return the codes and a report.

    ``calibration``: batches of the model's inputs (arrays or tensors; a tuple per batch for several inputs),
    needed by GPTQ, AWQ and clip search; ``run(model, batch)`` calls the model on one.
    """
    import paddle

    start = time.perf_counter()
    groups = {name: layer_group(int(layer.weight.shape[0]), config) for name, layer in _linears(model, config.skip)}
    linears = [(name, layer) for name, layer in _linears(model, config.skip) if groups[name] is not None]
    if config.calibrated and calibration is None:
        raise ConfigError(f"algo={config.algo!r}{', awq' if config.awq else ''}"
                          f"{', clip_search' if config.clip_search else ''} needs calibration batches; pass "
                          "calibration=... (a few hundred sequences) or use algo='rtn'")
    hessians: dict[str, HessianAccumulator] = {}
    shared: list[list[str]] = [[name] for name, _ in linears]
    if calibration is not None:
        hessians, shared = _calibrate(model, linears, calibration, run)
    by_name = dict(linears)
    plans: dict[str, _Plan] = {}
    for names in shared:
        weights = {n: by_name[n].weight.numpy().astype(np.float64) for n in names}
        h = hessians[names[0]].hessian() if hessians else None
        scales, alpha = None, None
        bits, size = groups[names[0]]  # one width: one group
        if config.awq:
            found = search_scales(list(weights.values()), h, bits, size, config.symmetric)
            scales, alpha = found.scales, found.alpha
        for n in names:
            plans[n] = _Plan(weights[n], h, scales, alpha, size)
            plans[n].quantize(config, bits)
    for n in _promoted(plans, config):
        plans[n].quantize(config, 8)
    result = WeightOnlyResult()
    for n, plan in plans.items():
        layer = by_name[n]
        layer.weight.set_value(paddle.to_tensor(plan.effective.astype(np.float32)))
        result.codes[layer.weight.name] = plan.codes
        if plan.scales is not None:
            result.input_scales[layer.weight.name] = plan.scales.astype(np.float32)
        result.layers.append(LayerReport(n, layer.weight.name, tuple(plan.weight.shape), plan.codes.bits,
                                         plan.codes.group_size, plan.relative_error(), plan.alpha))
        if progress is not None:
            progress(n)
    result.seconds = time.perf_counter() - start
    return result
