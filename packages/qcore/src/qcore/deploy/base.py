"""What a deployment target is: the facts about one runtime, mostly as data, and its per-model rules.

A :class:`DeployTarget` says which seed op types its runtime runs in int8, which it keeps
float and why, which IR families it runs with int8 kernels, how residual joins are quantized
for it, and how to configure a ``paddle.inference`` predictor for it. Its :meth:`~DeployTarget.plan`
adds the ops a quantizer must also quantize for it, and :meth:`~DeployTarget.rules` works out,
once per model, the rules that depend on the graph (:class:`ModelRules`). Post-training
quantization and the QAT export both apply those rules through :func:`qcore.deploy.apply.apply_rules`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from ..optable import FC, kind_of
from . import host

if TYPE_CHECKING:
    from paddle import inference

    from ..graph import Graph, Operand, OpRef


@dataclass
class OpTarget:
    """One op to quantize: its weight (if any) and the activations it reads."""

    op: OpRef
    weight: Operand | None
    activations: list[Operand]  # the ones to quantize: all the op reads, or fewer
    # the conv this op is quantized for (a runtime fuses the op into it): quantized only with it
    for_conv: OpRef | None = None
    runs_float: bool = False  # only its input is quantized (for the op writing it); the runtime runs it float
    float_reason: str | None = None  # a data rule of the target keeps it float (planned, reported like any rule)


def find_targets(graph: Graph, op_types: Iterable[str], skip_patterns: Iterable[str] = ()) -> list[OpTarget]:
    """Every op of ``op_types`` not skipped, with its weight and activation operands."""
    return [
        OpTarget(op, graph.weight_operand(op), graph.activation_operands(op))
        for op in graph.ops(list(op_types), skip_patterns=list(skip_patterns))
    ]


def residual_joins(graph: Graph, skip_patterns: Iterable[str] = ()) -> list[OpTarget]:
    """Every ``elementwise_add`` of two activations (a residual join), with both inputs."""
    return [
        t for t in find_targets(graph, ["elementwise_add"], skip_patterns)
        if len(t.activations) == 2 and graph.added_param(t.op) is None
    ]  # fmt: skip


#: Ops that read a sum in float on every runtime: a join they read gains no int8 kernel from QDQ on its inputs
#: (a transformer's attention scores + mask / position bias go to a softmax).
NORMALIZING_READERS = frozenset({"layer_norm", "rms_norm", "softmax"})
#: Ops squaring their input (op type without "pd_op."): the first step of an RMSNorm written out, as decoders do.
SQUARES = frozenset({"square", "multiply", "elementwise_mul"})


def _normalizes(graph: Graph, reader: Operand) -> bool:
    """``reader`` is a normalization (:data:`NORMALIZING_READERS`) or squares what it reads (``x * x``: an RMSNorm
    in plain ops, whose statistic is the mean of that square)."""
    kind = reader.op.type.split(".")[-1]
    if kind in NORMALIZING_READERS or kind == "square":
        return True
    if kind not in SQUARES:
        return False
    operands = graph.operands(reader.op)
    return len(operands) == 2 and all(o.name == reader.name for o in operands)


def int8_joins(graph: Graph, skip_patterns: Iterable[str] = ()) -> list[OpTarget]:
    """The residual joins worth quantizing: not those whose sum goes to a normalization (:func:`_normalizes`; a
    transformer's residual stream carries outlier channels that one per-tensor grid cannot hold, and the
    LayerNorm runs float anyway; measured: all-MiniLM-L6-v2 cosine to float 0.94 with them, 0.993 without),
    nor those read only by joins left float (an attention bias built from a position bias and a mask: one
    per-tensor grid over the mask's -10000 and the bias's few units erases the bias; measured on
    all-mpnet-base-v2: cosine 0.64 with nothing else quantized)."""
    joins, _, kept = _judged_joins(graph, skip_patterns)
    return [t for t in joins if t.op.key in kept]


def _judged_joins(graph: Graph, skip_patterns: Iterable[str]) -> tuple[list[OpTarget], dict[Any, list[Any]], set[Any]]:
    """Every residual join, the operands reading each (by key), and the keys of those :func:`int8_joins` keeps."""
    joins = residual_joins(graph, skip_patterns)
    readers = graph.readers([t.op for t in joins])
    kept = {t.op.key for t in joins if not any(_normalizes(graph, r) for r in readers[t.op.key])}
    keys = {t.op.key for t in joins}
    changed = True
    while changed:  # a join feeding only float joins gains nothing either
        changed = False
        for key in list(kept):
            read_by = [r.op.key for r in readers[key]]
            if read_by and all(r in keys and r not in kept for r in read_by):
                kept.discard(key)
                changed = True
    return joins, readers, kept


#: Why a residual join asked for by op type (``elementwise_add`` listed, ``is_full_quantize``) stays float.
FLOAT_JOIN_REASON = ("a residual join read by a normalization (LayerNorm, softmax) or only by such joins: "
                     "one per-tensor grid erases what it adds (see qcore.deploy.base.int8_joins)")
#: Why a softmax reading such a join (attention scores plus mask and position bias) stays float.
MASKED_SOFTMAX_REASON = ("reads attention scores plus a mask (-10000): one per-tensor grid over both erases the "
                         "scores (a tiny encoder's output error 0.37 with it)")


def float_joins(graph: Graph, targets: Iterable[OpTarget], skip_patterns: Iterable[str] = ()) -> dict[Any, str]:
    """The ``targets`` (by key) that every runtime keeps float with a residual join, and why: the joins
    :func:`int8_joins` leaves float, and the softmaxes reading them."""
    targets = list(targets)
    if not any((t.op.seed_type or t.op.type) in ("elementwise_add", "softmax") for t in targets):
        return {}
    keys = {t.op.key for t in targets}
    joins, readers, kept = _judged_joins(graph, skip_patterns)
    reasons = {}
    for join in (t for t in joins if t.op.key not in kept):
        if join.op.key in keys:
            reasons[join.op.key] = FLOAT_JOIN_REASON
        reasons.update((r.op.key, MASKED_SOFTMAX_REASON) for r in readers[join.op.key]
                       if r.op.key in keys and r.op.type.split(".")[-1] == "softmax")
    return reasons


def output_readers(graph: Graph, writers: list[OpRef], passes: Callable[[Graph, OpRef], bool] | None = None
                   ) -> list[tuple[OpRef, list[Operand]]]:
    """Each of ``writers`` with the operands reading its output: behind a conv's bias add (its only reader), and
    behind the ops ``passes`` says the runtime runs on the codes of what they read (instead of those ops)."""
    def behind(ops: list[OpRef]) -> dict[int, list[Operand]]:
        direct = graph.readers(ops)
        passing = [r.op for found in direct.values() for r in found if passes is not None and passes(graph, r.op)]
        further = behind(passing) if passing else {}
        return {key: [o for r in found for o in (further[r.op.key] if r.op.key in further else [r])]
                for key, found in direct.items()}

    readers = graph.readers(writers)
    after = {}
    for op in writers:
        found = readers[op.key]
        if len(found) == 1 and found[0].op.seed_type == "elementwise_add" and graph.added_param(found[0].op):
            after[op.key] = found[0].op  # a conv's bias
    through = behind([*after.values(), *(op for op in writers if op.key not in after)])
    return [(op, through[after[op.key].key if op.key in after else op.key]) for op in writers]


@dataclass(frozen=True)
class SlowInt8:
    """A cost rule of one runtime: ops of ``op_type`` producing fewer than ``max_outputs`` values per sample run
    slower in int8 there than in float (what the quantize / dequantize pair and layout changes around the op cost
    exceeds what its int8 kernel saves), with the measurement behind it."""

    op_type: str  # seed op type
    max_outputs: int
    reason: str

    def applies(self, op_type: str | None, outputs: int) -> bool:
        return op_type == self.op_type and outputs < self.max_outputs


@dataclass(frozen=True)
class MinInt8Work:
    """A whole-model cost rule: a model whose quantizable ops do fewer than ``macs`` multiply-adds per sample
    cannot run faster in int8 on the runtime (fixed per-op costs dominate), with the measurement behind it."""

    macs: int
    reason: str


#: Legacy op attribute recording which backend a model was quantized for (on its first op after the feeds).
MARK_ATTR = "qcore_deploy_backend"


def mark_model(graph: Graph, target: DeployTarget) -> None:
    """Record in a legacy program that it was quantized for ``target`` (read by :func:`marked_backend`)."""
    if graph.family == "legacy":
        first = next((op for op in graph.ops() if op.type not in ("feed", "fetch")), None)
        if first is not None:
            graph.set_attr(first, MARK_ATTR, target.name)


def marked_backend(program: bytes) -> str | None:
    """The backend a serialized legacy program was quantized for (:func:`mark_model`), or None."""
    at = program.find(MARK_ATTR.encode())
    if at < 0:
        return None
    window = program[at : at + len(MARK_ATTR) + 32]
    return next((name for name in ("openvino", "tensorrt", "native", "onednn") if name.encode() in window), None)


class ModelRules:
    """A target's rules worked out for one model; this base applies only the target's data."""

    def __init__(self, target: DeployTarget, graph: Graph) -> None:
        self.target = target
        self.graph = graph
        self.unsigned: set[str] = set()  # activations the runtime quantizes as unsigned
        self.rewrites: dict[str, list[str]] = {}  # what the rules changed in the graph, for the report

    def prepare(self) -> None:
        """The graph edits the runtime needs before anything is quantized (none by default); the first step of
        :meth:`qcore.deploy.Deployment.rewrite`, recorded in :attr:`rewrites`."""

    def thresholds(self, chosen: Mapping[str, float]) -> dict[str, float]:
        """The threshold the runtime runs each activation with, given ours."""
        return dict(chosen)

    def problem(self, op: OpRef, bits: int, per_channel: bool) -> str | None:
        """Why ``op`` should stay float on this target, or None."""
        return self.target.op_problem(op, self.graph.family)

    def keep_float(self, op: OpRef) -> None:
        """Make the runtime run ``op`` in float although its input is quantized (no-op by default)."""

    def finish(self, quantized: list[OpRef], activations: list[str]) -> None:
        """Once every QDQ is in: make the simulation match what the runtime does with them."""


class OutputReaderRules(ModelRules):
    """The data rules, except for the ops a target's :meth:`~DeployTarget.plan` quantizes only as readers of an
    int8 op's output (:attr:`OpTarget.runs_float`): they run float whatever their type (no kernel of their own
    is needed)."""

    def __init__(self, target: DeployTarget, graph: Graph, readers: Iterable[OpTarget]) -> None:
        super().__init__(target, graph)
        self.readers = {t.op.key for t in readers if t.runs_float}

    def problem(self, op: OpRef, bits: int, per_channel: bool) -> str | None:
        return None if op.key in self.readers else super().problem(op, bits, per_channel)


class DeployTarget(ABC):
    """One runtime a quantized model is made for. Subclasses fill in the class-level data."""

    name: ClassVar[str]
    aliases: ClassVar[tuple[str, ...]] = ()
    runtime: ClassVar[str]  # one line: what runs the model
    #: seed op types the runtime runs with int8 kernels when their inputs carry QDQ
    int8_ops: ClassVar[frozenset[str]]
    #: seed op types the runtime cannot run well in int8, with the reason (measured where the text says so)
    float_ops: ClassVar[Mapping[str, str]] = {}
    #: seed op types whose table the runtime reads as 8-bit codes with a scale per row, dequantized after the
    #: lookup (size, not speed: the lookup itself is a gather). Every runtime here runs that form; a table
    #: dequantized whole before the lookup made Paddle Inference's oneDNN int8 passes fail ("no kernels ...
    #: reduce_mean") on a legacy model
    weight_only_ops: ClassVar[frozenset[str]] = frozenset({"lookup_table"})
    #: IR families whose QDQ the runtime runs with int8 kernels; others run the simulation in float
    int8_families: ClassVar[tuple[str, ...]]
    #: seed op types whose int8 weight is read through cast -> multiply instead of ``dequantize_linear``
    float_dequant_weights: ClassVar[frozenset[str]] = frozenset()
    #: how residual joins are quantized: "both" inputs of every join, "none", or the target's own rule ("fused")
    residual_adds: ClassVar[str] = "both"
    #: (weight bits, activation bits) of the int8 kernels; None: any width (the target runs float kernels)
    kernel_bits: ClassVar[tuple[int, int] | None] = (8, 8)
    #: runs activations shifted onto asymmetric grids (:func:`qcore.quant.asymmetric_range`) as simulated
    asymmetric_activations: ClassVar[bool] = False
    #: activation grids when the caller does not choose (``activation_symmetric=None``): "symmetric",
    #: "asymmetric" (:func:`qcore.quant.asymmetric_range` for every activation) or "unsigned" (asymmetric only
    #: for never-negative tensors: relu outputs on all codes of ``[0, max]``, zero point at the lowest code)
    default_grids: ClassVar[str] = "symmetric"
    #: asymmetric grids must hold zero (ONNX's zero point is a code of the type: a tensor that never reaches 0,
    #: such as a sigmoid's output, gets a grid stretched down to 0); never-negative tensors get zero on the
    #: lowest code (:func:`qcore.quant.unsigned_range`: uint8 zero point 0)
    zero_on_grid: ClassVar[bool] = False
    #: reads the ``ZeroPoint`` of activation QDQ pairs (asymmetric grids deploy as zero points, not shifts)
    activation_zero_points: ClassVar[bool] = False
    #: runs int8 dot products on an x86 CPU, where without VNNI they saturate (:mod:`qcore.deploy.host`)
    cpu_int8: ClassVar[bool] = False
    #: why the runtime keeps a matmul of two activations (attention's ``Q K^T`` and ``scores V``) float even when
    #: its op type is asked for (``matmul`` listed, ``is_full_quantize``), or None: it runs them int8
    activation_matmuls: ClassVar[str | None] = None
    #: cost rules: ops the runtime runs slower in int8 than in float (``algo="auto"`` keeps them float)
    slow_int8: ClassVar[tuple[SlowInt8, ...]] = ()
    #: a model doing less work than this per sample stays float under ``algo="auto"`` (None: no such rule)
    min_int8_work: ClassVar[MinInt8Work | None] = None

    def __init__(self, overflow_fix: bool | None = None) -> None:
        #: keep 8-bit weight codes within +-64 (True), use the full range (False), or ask the host (None)
        self.overflow_fix = overflow_fix

    def weight_max_code(self, bits: int, family: str) -> int | None:
        """The largest weight code this target's output may hold, None for the whole ``bits`` range.

        CPU targets keep 8-bit codes of the families they run in int8 within
        :data:`~qcore.deploy.host.SATURATION_FREE_CODE` when the overflow fix is on
        (``overflow_fix``, else :func:`~qcore.deploy.host.overflow_fix_default`).
        """
        if not self.cpu_int8 or bits != 8 or family not in self.int8_families:
            return None
        fix = host.overflow_fix_default() if self.overflow_fix is None else self.overflow_fix
        return host.SATURATION_FREE_CODE if fix else None

    def activation_matmul_problem(self, target: OpTarget) -> str | None:
        """The data rule for a matmul of two activations: why ``target`` stays float, or None (any other op)."""
        if self.activation_matmuls is None or target.weight is not None or kind_of(target.op.seed_type) is not FC:
            return None
        return f"{self.name}: {self.activation_matmuls}"

    def speed_problem(self, op_type: str | None, outputs: int) -> str | None:
        """The cost rule keeping an op of ``op_type`` with ``outputs`` values per sample float, or None."""
        rule = next((r for r in self.slow_int8 if r.applies(op_type, outputs)), None)
        return None if rule is None else f"{self.name}: slower in int8 ({outputs} outputs per sample < " \
            f"{rule.max_outputs}): {rule.reason}"

    def model_speed_problem(self, macs: int) -> str | None:
        """Why a model doing ``macs`` multiply-adds per sample in its quantizable ops stays float, or None."""
        rule = self.min_int8_work
        if rule is None or macs >= rule.macs:
            return None
        return f"{self.name}: int8 cannot be faster than float ({macs / 1e6:.1f} M multiply-adds per sample < " \
               f"{rule.macs / 1e6:.0f} M): {rule.reason}"

    def op_problem(self, op: OpRef, family: str) -> str | None:
        """The data rule: why ``op`` stays float on this target, or None."""
        seed = op.seed_type or op.type
        if seed in self.weight_only_ops:
            return None
        if seed in self.float_ops:
            return f"{self.name}: {self.float_ops[seed]}"
        if seed not in self.int8_ops:
            return f"{self.name}: the runtime has no int8 kernel for {seed}"
        return None

    def plan(
        self,
        graph: Graph,
        targets: list[OpTarget],
        skip_patterns: Iterable[str] = (),
        *,
        residual_add: bool = True,
        calibrated: bool = True,
    ) -> tuple[list[OpTarget], set[str]]:
        """The extra ops to quantize with ``targets`` for this runtime, and the activations whose
        readers must stay float. ``calibrated=False`` (the QAT export) adds no op needing new thresholds."""
        if not residual_add or not calibrated or self.residual_adds != "both":
            return [], set()
        return int8_joins(graph, skip_patterns), set()

    def rules(self, graph: Graph, targets: list[OpTarget], float_inputs: Iterable[str] = ()) -> ModelRules:
        """The rules for one model about to get QDQ on ``targets``."""
        return ModelRules(self, graph)

    def bits_problem(self, weight_bits: int, activation_bits: int, family: str) -> str | None:
        """Why the runtime cannot run a ``family`` model quantized to these widths, or None."""
        if self.kernel_bits in (None, (weight_bits, activation_bits)) or family not in self.int8_families:
            return None
        w, a = self.kernel_bits
        return (f"{self.name} runs {family} models with {w}-bit weights and {a}-bit activations only; use "
                f"weight_bits={w}, activation_bits={a}, or deploy_backend='native' for a simulation-only model")

    def host_problem(self) -> str | None:
        """Why this runtime's int8 kernels on this machine run a quantized model unlike its simulation, or None."""
        return None

    def unavailable(self) -> str | None:
        """Why this runtime cannot run on this machine / Paddle build, or None."""
        return None

    def output_problem(self) -> str | None:
        """Why a model quantized for this runtime cannot be written and checked on this machine (what its
        companion files need is missing), or None; :meth:`Deployment.check` asks before any work."""
        return None

    def export_problem(self, model: Any) -> str | None:
        """Why the float :class:`~qcore.model_io.Model` cannot be written in the form this runtime reads (its
        export fails), or None; checked before calibration."""
        return None

    def files_problem(self) -> str | None:
        """Why the files the runtime writes while it runs (a compiled-model cache) cannot be written, or None;
        callers check it before any work."""
        return None

    def own_predictor(self, files: Any, threads: int) -> Any | None:
        """A predictor from the runtime's own API for ``files`` (:class:`~qcore.model_io.ModelFiles` or an
        ``.onnx`` path), or None where it runs in ``paddle.inference`` (:meth:`configure`)."""
        return None

    @abstractmethod
    def configure(self, config: inference.Config, threads: int) -> None:
        """Set up a ``paddle.inference`` config for this runtime."""

    def float_kernels(self) -> DeployTarget:
        """This runtime with its int8 kernels switched off (the float baseline to compare with); the target
        itself where nothing switches them."""
        return self

    def without_fallback(self) -> DeployTarget:
        """This runtime without graph-dependent fallbacks (``onednn_fallback=False``); the target itself where
        it has none."""
        return self

    def made_for_problem(self, made_for: str | None) -> str | None:
        """Why a model quantized for the backend ``made_for`` (:func:`marked_backend`) runs worse here, or None."""
        return None

    def predictor_files(self, files: Any) -> Any:
        """``files`` (:class:`~qcore.model_io.ModelFiles`) as the runtime opens them; the same by default."""
        return files

    def companion_files(self, model: Any) -> dict[str, bytes]:
        """Files a model quantized for this runtime is saved with (name -> bytes), from the quantized
        :class:`~qcore.model_io.Model`; none for runtimes that read the Paddle program itself."""
        return {}

    def accepts(self, model_file: Any) -> str | None:
        """Why the runtime cannot open ``model_file`` as it is named / formatted, or None."""
        return None

    def __repr__(self) -> str:
        return f"<deploy target {self.name}>"
