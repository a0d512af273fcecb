"""The one door from a quantizer to a deployment target.

Post-training quantization (static and weight-only) and both QAT exports reach a runtime's rules
only through a :class:`Deployment`: :meth:`~Deployment.check` refuses a model or bit widths the
runtime cannot run before any work, :meth:`~Deployment.targets` finds the ops to quantize and adds
what the runtime needs with them, :meth:`~Deployment.rewrite` applies the runtime's rules, thresholds
and finishing steps and marks the model, :meth:`~Deployment.save` writes it with the files the
runtime reads beside it. A new runtime is one module under ``qcore/deploy/``; no method package
names a concrete target.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError, ExportError
from ..quant import asymmetric_range, unsigned_range
from . import host
from .apply import Applied, Planned, apply_rules
from .base import DeployTarget, ModelRules, OpTarget, find_targets, float_joins, mark_model
from .registry import get_target

if TYPE_CHECKING:
    from ..graph import Graph, OpRef, QuantizedWeight
    from ..model_io import ModelFiles

log = logging.getLogger(__name__)
#: Ops whose int8 weight is read through cast -> multiply on every runtime. Measured on Paddle Inference 3.3.1
#: (native and oneDNN): with ``dequantize_linear`` in front of a legacy ``gru``'s Weight the predictor is not built
#: ("The type of data we are trying to retrieve (float32) does not match ... (int8)"); with cast -> multiply it runs.
CAST_DEQUANT_OPS = frozenset({"gru"})
#: Backends :meth:`Deployment.float_summary` may suggest, in order (their rules are data, not graph-dependent).
SUGGESTED_TARGETS = ("openvino", "openvino-runtime", "onnxruntime")
#: ``activation_symmetric`` -> activation grids; None takes the target's default.
_GRIDS = {False: "asymmetric", True: "symmetric"}


@dataclass(frozen=True)
class Targets:
    """The ops one run quantizes, in a stable order, and the activations whose readers stay float."""

    ops: list[OpTarget]
    float_inputs: set[str] = field(default_factory=set)


@dataclass
class Rewritten:
    """What :meth:`Deployment.rewrite` did: each planned op's fate, the thresholds the runtime runs,
    the activations it runs unsigned, and the graph edits its rules made (for the report)."""

    applied: list[Applied]
    thresholds: dict[str, float]
    unsigned: set[str]
    rewrites: dict[str, list[str]]


class Deployment:
    """A quantization run's deployment target and bit widths; every method goes through this.

    ``deploy_backend`` is a name of :data:`qcore.deploy.BACKEND_NAMES`, a :class:`DeployTarget`, or None
    (oneDNN's rules, correct on every runtime; the model is then not marked for a backend).
    ``fallback=False`` asks the target for its variant without graph-dependent fallbacks (oneDNN's).
    """

    def __init__(
        self,
        deploy_backend: str | DeployTarget | None = None,
        *,
        weight_bits: int = 8,
        activation_bits: int = 8,
        fallback: bool = True,
    ) -> None:
        target = get_target(deploy_backend)
        self.target: DeployTarget = target if fallback else target.without_fallback()
        self.requested = deploy_backend is not None
        self.fallback = fallback
        self.weight_bits = weight_bits
        self.activation_bits = activation_bits
        if self.target.cpu_int8 and self.target.overflow_fix is None:
            host.overflow_fix_default()  # a bad $QCORE_OVERFLOW_FIX fails here, before any calibration

    @property
    def name(self) -> str | None:
        """The backend the caller asked for (canonical name), None for the default rules."""
        return self.target.name if self.requested else None

    # --- before any work

    def check(self, model_file: str, family: str, *, fix: str = "") -> None:
        """Refuse a model file the runtime cannot open, or a runtime whose output cannot be written here (both only
        when a backend was asked for), or bit widths its kernels cannot run for ``family``; ``fix`` is appended to
        the first message (e.g. how to re-export)."""
        reason = self.target.accepts(model_file)
        if self.requested and reason is not None:
            raise ConfigError(f"deploy_backend={self.target.name!r}: {reason}{fix}")
        reason = self.target.output_problem()
        if self.requested and reason is not None:
            raise ConfigError(f"deploy_backend={self.target.name!r}: {reason}; install it or choose another backend")
        problem = self.bits_problem(family)
        if problem is not None:
            raise ConfigError(problem)

    def check_export(self, model: Any) -> None:
        """Refuse, before calibration, a float ``model`` whose export to the form the asked-for runtime reads
        fails (:meth:`DeployTarget.export_problem`)."""
        reason = self.target.export_problem(model) if self.requested else None
        if reason is not None:
            raise ExportError(f"deploy_backend={self.target.name!r} runs the model's ONNX export, and the float "
                              f"model does not export (checked before calibration): {reason}")

    def bits_problem(self, family: str) -> str | None:
        """Why the runtime cannot run this run's bit widths for ``family`` (one line), or None."""
        problem = self.target.bits_problem(self.weight_bits, self.activation_bits, family)
        if problem is None:
            return None
        return f"weight_bits={self.weight_bits}, activation_bits={self.activation_bits}: {problem}"

    def grids(self, symmetric: bool | None) -> str:
        """The activation grids of ``activation_symmetric``: "symmetric", "asymmetric" or "unsigned"."""
        if symmetric not in (None, True, False):
            raise ConfigError(f"activation_symmetric={symmetric!r} is not valid; use True, False or None")
        grids = self.target.default_grids if symmetric is None else _GRIDS[symmetric]
        if grids != "symmetric" and not self.target.asymmetric_activations:
            raise ConfigError(f"activation_symmetric=False: {self.target.name} runs symmetric activation grids only; "
                              "use deploy_backend='openvino' or 'native', or leave activation_symmetric unset")
        return grids

    def float_kernels_problem(self, family: str) -> str | None:
        """Why the runtime runs a quantized ``family`` model with float kernels, or None (it runs int8)."""
        if family in self.target.int8_families:
            return None
        shown = {"pir": "PIR", "legacy": "legacy"}.get(family, family)
        return f"{self.target.name} runs {shown} programs with float kernels (Paddle 3.3.1)"

    # --- finding and planning

    def targets(
        self,
        graph: Graph,
        op_types: Iterable[str],
        skip_patterns: Iterable[str] = (),
        skip_tensors: Iterable[str] = (),
        *,
        residual_add: bool = True,
        calibrated: bool = True,
    ) -> Targets:
        """The ops of ``op_types`` not skipped by pattern or tensor name, plus what the runtime quantizes with
        them; ``calibrated=False`` (a QAT export) adds nothing that needs new thresholds. The same order on
        every clone of one graph."""
        skip_tensors = set(skip_tensors)
        found = []
        for target in find_targets(graph, op_types, skip_patterns):
            if target.weight is not None and target.weight.name in skip_tensors:
                continue
            target.activations = [a for a in target.activations if a.name not in skip_tensors]
            found.append(target)
        return self.plan(graph, found, skip_patterns, residual_add=residual_add, calibrated=calibrated)

    def plan(
        self, graph: Graph, ops: list[OpTarget], skip_patterns: Iterable[str] = (), *, residual_add: bool = True,
        calibrated: bool = True,
    ) -> Targets:
        """``ops`` (found by the caller, e.g. matched to QAT layers) plus what the runtime quantizes with them; the
        ops every runtime's data rules keep float carry their reason (:attr:`OpTarget.float_reason`): residual
        joins read by a normalization and softmaxes reading them, and matmuls of two activations where the
        runtime says so."""
        joins = float_joins(graph, ops, skip_patterns)
        for op in ops:
            op.float_reason = joins.get(op.op.key) or self.target.activation_matmul_problem(op)
        extra, float_inputs = self.target.plan(graph, ops, skip_patterns, residual_add=residual_add,
                                               calibrated=calibrated)
        return Targets(ops + extra, float_inputs)

    def weight_max_code(self, family: str) -> int | None:
        """The largest weight code the output may hold (:meth:`DeployTarget.weight_max_code`)."""
        return self.target.weight_max_code(self.weight_bits, family)

    def activation_grid(self, grids: str, threshold: float, seen_min: float, seen_max: float) -> tuple[float, float]:
        """The ``(threshold, offset)`` an activation calibrated over ``[seen_min, seen_max]`` deploys with:
        symmetric, or asymmetric (:func:`qcore.quant.asymmetric_range`; with ``grids="unsigned"`` only for a
        tensor never seen negative). Where the runtime's zero point must be a code, a never-negative tensor
        gets zero on its lowest code (:func:`qcore.quant.unsigned_range`) and every grid holds zero."""
        if grids == "symmetric":
            return threshold, 0.0
        zero_on_grid = self.target.zero_on_grid
        if seen_min >= 0 and zero_on_grid:
            return unsigned_range(threshold, seen_max, self.activation_bits)
        if grids == "unsigned":
            return threshold, 0.0
        lo, hi = (min(seen_min, 0.0), max(seen_max, 0.0)) if zero_on_grid else (seen_min, seen_max)
        return asymmetric_range(threshold, lo, hi, self.activation_bits)

    def weight_only_problem(self, graph: Graph, op: OpRef) -> str | None:
        """Why a weight-only quantizer leaves ``op``'s weight float for this runtime, or None."""
        seed = op.seed_type or op.type
        if graph.family in self.target.int8_families and seed in self.target.float_ops:
            return f"{self.target.name}: {self.target.float_ops[seed]}"
        return None

    def reads_weight_through_cast(self, op: OpRef) -> bool:
        """Whether the runtime reads ``op``'s int8 weight through cast -> multiply (not ``dequantize_linear``)."""
        return op.seed_type in self.target.float_dequant_weights or op.seed_type in CAST_DEQUANT_OPS

    def store_weights(
        self, graph: Graph, ops: Sequence[OpRef], bits: int = 8, per_channel: bool = True
    ) -> list[QuantizedWeight | None]:
        """Weight-only quantization: store each of ``ops``' float weights as int``bits`` codes (per output channel,
        or one scale) read through the dequantize step this runtime takes. One entry per op: None where the op
        has no float parameter weight or the runtime keeps it float (logged with the reason)."""
        stored: list[QuantizedWeight | None] = []
        for op in ops:
            weight = graph.weight_operand(op)
            problem = None if weight is None else self.weight_only_problem(graph, op)
            if problem is not None:
                log.warning("%r left in float: %s", op, problem)
            if weight is None or problem is not None:
                stored.append(None)
                continue
            axis = graph.weight_channel_axis(op) if per_channel else None
            stored.append(graph.quantize_weight(weight, bits, axis, float_dequant=self.reads_weight_through_cast(op)))
        return stored

    # --- rewriting and saving

    def rewrite(
        self,
        graph: Graph,
        targets: Targets,
        chosen: Mapping[str, float],
        plan: Callable[[Mapping[str, float]], Sequence[Planned]],
    ) -> Rewritten:
        """Put ``targets`` in the form the runtime runs: its rules for this graph prepare it (e.g. oneDNN's
        relus written as leaky where residual convs need signed inputs), turn the ``chosen``
        activation thresholds into the ones it runs, ``plan`` builds each op's :class:`Planned` from those,
        the rules apply (ops they keep float are reported, not quantized) and finish the graph; a model
        made for an asked-for backend is marked with it."""
        rules: ModelRules = self.target.rules(graph, targets.ops, targets.float_inputs)
        rules.prepare()
        thresholds = rules.thresholds(chosen)
        applied = apply_rules(graph, rules, plan(thresholds), weight_bits=self.weight_bits,
                              activation_bits=self.activation_bits)
        if self.requested:
            mark_model(graph, self.target)
        return Rewritten(applied, thresholds, rules.unsigned, rules.rewrites)

    def float_summary(self, applied: Sequence[Applied], family: str) -> str | None:
        """One line when the target's rules left most weighted layers float (how many, the main reason, and a
        backend whose rules would run most of them int8), else None; layers the caller kept float (an
        accuracy budget) do not count."""
        weighted = [a for a in applied if a.planned.target.weight is not None and a.planned.keep_float is None]
        kept = [a for a in weighted if a.left_float is not None]
        if not weighted or 2 * len(kept) <= len(weighted):
            return None
        reason = Counter(a.left_float for a in kept).most_common(1)[0][0]
        ops = [a.planned.target.op for a in kept]
        hint = ""
        for other in SUGGESTED_TARGETS:
            target = get_target(other)
            runs = sum(target.op_problem(op, family) is None for op in ops)
            if target.name != self.target.name and family in target.int8_families and 2 * runs > len(ops) \
                    and target.unavailable() is None:
                hint = f"; deploy_backend={target.name!r} runs {runs} of them int8"
                break
        return (f"{len(kept)} of {len(weighted)} weighted layers stay float for {self.target.name} "
                f"(mostly: {reason}){hint}")

    def save(self, graph: Graph, directory: Any, model_filename: str, params_filename: str | None) -> ModelFiles:
        """Write the quantized model atomically, with the files the runtime reads beside it (an ONNX export);
        a model made for an asked-for backend is marked with it."""
        if self.requested:
            mark_model(graph, self.target)
        return graph.save(directory, model_filename, params_filename,
                          extra_files=self.target.companion_files(graph.model))

    def __repr__(self) -> str:
        return f"<deployment {self.target.name} w{self.weight_bits}a{self.activation_bits}>"
