"""The graph interface method packages use, independent of the IR underneath.

A :class:`Graph` wraps a loaded :class:`~qcore.model_io.Model`. Method code asks for ops by
the seeds' op-type names, reads operands and parameters, and applies the few rewrites
quantization needs. Rewrites only ever add parameters under new names, so the float
parameters in the scope stay intact and a :meth:`Graph.clone` taken earlier keeps working.
"""

from __future__ import annotations

import contextlib
import os
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

import numpy as np
import paddle

from ..errors import GraphError
from ..model_io import Model, ModelFiles, save_model
from ..optable import OP_TABLE, backend_names, spec
from ..packing import MAX_PACKED_BITS, byte_values, codes_per_byte, field_bits, pack_codes, signed_fields
from ..paddle_env import onednn_kernels, static_mode
from ..quant import abs_max, bounded_thresholds, dequantize, qmax, quantize, scale_from_threshold


@dataclass(frozen=True)
class OpRef:
    """One op of the graph: the backend object, its backend type and its seed type."""

    raw: Any
    type: str
    seed_type: str | None
    scope_name: str  # name scope / layer path, matched by skip patterns

    @property
    def key(self) -> int:
        """The backend op's identity, to key dicts and sets of ops by."""
        return id(self.raw)

    def __repr__(self) -> str:
        return f"<{self.seed_type or self.type} {self.scope_name}>"


@dataclass(frozen=True)
class Operand:
    """An input of an op: which slot, the backend value, and a stable readable name."""

    op: OpRef
    slot: str
    index: int
    value: Any
    name: str
    is_param: bool


@dataclass(frozen=True)
class LookupTables:
    """The parameters a quantized lookup reads (backend values or names) and how to read them."""

    codes: Any  # int8 codes [rows, dim], or packed bytes when ``byte_values`` is set
    scale: Any  # [rows, 1] per row, or [1]
    dim: int
    per_row: bool
    log_step: float | None = None  # unpacked log codes (packed ones are decoded by ``byte_values``)
    offset: Any = None  # [rows, 1]: affine rows (codes * scale + offset)
    byte_values: Any = None  # [256, codes per byte] float: packed bytes -> their codes' values
    padded: bool = False  # packed rows decode to more than ``dim`` values (the last byte is not full)
    code_values: Any = None  # [256] float: unpacked log code c -> its value at c + 128 (fused lookups only)
    per_byte: int = 1  # codes per stored byte
    half: bool = False  # per-row scales (and offsets) stored float16: cast to float32 after their lookup


@dataclass(frozen=True)
class RowSet:
    """One row set of a mixed-precision table (:meth:`Graph.quantize_mixed_lookup`): int8 codes ``[rows, dim]``, one
    scale per row (float32 or float16), per-row offsets (affine rows, unsigned codes) or None, and the code width."""

    codes: np.ndarray
    scales: np.ndarray
    bits: int
    offsets: np.ndarray | None = None


@dataclass(frozen=True)
class QuantizedWeight:
    """What :meth:`Graph.quantize_weight` stored: integer codes and thresholds per channel."""

    codes: np.ndarray
    thresholds: np.ndarray
    axis: int | None
    bits: int
    float_dequant: bool = False  # read through cast -> multiply, never a dequantize_linear op

    def dequantized(self) -> np.ndarray:
        """The float weight the codes represent."""
        thr = self.thresholds if self.axis is not None else self.thresholds[0]
        return dequantize(self.codes, scale_from_threshold(thr, self.bits), self.axis)


@dataclass(frozen=True)
class ActivationGrid:
    """The integer grid one activation QDQ pair runs: ``x' = (clip(round(x / step) + zero_point, qmin, qmax)
    - zero_point) * step``. Symmetric grids have ``zero_point`` 0; unsigned ones ``qmin`` 0."""

    step: float
    zero_point: int
    qmin: int
    qmax: int


@dataclass(frozen=True)
class StoredWeight:
    """An integer-stored weight as :meth:`Graph.unquantize` left it: float parameter ``name`` holds
    ``codes * steps`` (one step per channel along ``axis``, or one for all when ``axis`` is None)."""

    name: str
    codes: np.ndarray
    steps: np.ndarray
    axis: int | None


@dataclass
class Unquantized:
    """What :meth:`Graph.unquantize` took out of a quantized program.

    Each activation QDQ pair became a float32 -> float32 ``cast`` (a *marker*): ``markers`` maps
    the marker's position among all the program's casts (program order) to the pair's grid.
    """

    markers: dict[int, ActivationGrid]
    weights: list[StoredWeight]


#: Paddle's ``round_type`` 0 (half to even), the rounding of :mod:`qcore.quant`, for the training fake-quant ops.
ROUND_HALF_EVEN = 0


class Graph(ABC):
    """One graph interface over PIR and legacy programs (see ``legacy.py`` and ``pir.py``)."""

    family: str

    def __init__(self, model: Model) -> None:
        self.model = model
        self._act_qdq: dict[str, Any] = {}
        self._weight_dq: dict[str, Any] = {}
        self._made: set[Any] = set()  # keys of values our rewrites produced
        #: per conv weight :meth:`fold_conv_bn` replaced: the new parameter and the per-channel factor
        self.bn_folded: dict[str, tuple[str, np.ndarray]] = {}

    # ---- reading -------------------------------------------------------------------
    @abstractmethod
    def _raw_ops(self) -> list[Any]: ...

    @abstractmethod
    def _op_type(self, raw: Any) -> str: ...

    @abstractmethod
    def _scope_name(self, raw: Any) -> str: ...

    @abstractmethod
    def operands(self, op: OpRef) -> list[Operand]:
        """Every float tensor input of ``op`` (parameters included)."""

    @abstractmethod
    def _operand_in_slot(self, op: OpRef, slot: str) -> Operand | None: ...

    @abstractmethod
    def output(self, op: OpRef) -> Any:
        """The backend value of ``op``'s first output (what :meth:`run` fetches)."""

    @abstractmethod
    def attrs(self, op: OpRef) -> dict[str, Any]:
        """``op``'s attributes by their name in its IR (legacy ``trans_y`` is PIR's ``transpose_y``)."""

    @abstractmethod
    def attr(self, op: OpRef, name: str, default: Any = None) -> Any:
        """One attribute of ``op`` (``default`` when it has none)."""

    @abstractmethod
    def input_names(self, op: OpRef, slot: str | None = None) -> list[str]:
        """Names of the tensors ``op`` reads in input ``slot`` (its IR's slot name), or in every slot; one entry per
        read. Names are those of :attr:`Operand.name` (PIR: parameter, feed or ``<op>_<position>.out<k>``)."""

    @abstractmethod
    def output_names(self, op: OpRef, slot: str | None = None) -> list[str]:
        """Names of the tensors ``op`` writes in output ``slot``, or in every slot."""

    @abstractmethod
    def shape(self, name: str) -> list[int]:
        """The declared shape of tensor ``name`` (-1 for a dimension known only at run time)."""

    def _seed_type(self, raw: Any, backend_type: str) -> str | None:
        for seed, entry in OP_TABLE.items():
            if backend_type in (entry.legacy if self.family == "legacy" else entry.pir):
                return seed
        return None

    def ops(
        self, seed_types: Iterable[str] | None = None, skip_patterns: Sequence[str] = ()
    ) -> list[OpRef]:
        """Ops whose seed type is in ``seed_types`` (all ops when None), minus skipped ones.

        An op is skipped when one of ``skip_patterns`` occurs in its name scope (legacy
        ``op_namescope``, PIR ``struct_name``) or in the name of its weight parameter.
        """
        wanted = None if seed_types is None else list(seed_types)
        names = None if wanted is None else {n for s in wanted for n in backend_names(s, self.family)}
        found = []
        for raw in self._raw_ops():
            backend_type = self._op_type(raw)
            if names is not None and backend_type not in names:
                continue
            op = OpRef(raw, backend_type, self._seed_type(raw, backend_type), self._scope_name(raw))
            if wanted is not None and not self._matches(op, wanted):
                continue
            if skip_patterns and self._skipped(op, skip_patterns):
                continue
            found.append(op)
        return found

    def _matches(self, op: OpRef, wanted: list[str]) -> bool:
        for seed in wanted:
            entry = spec(seed)
            if op.type not in backend_names(seed, self.family):
                continue
            if not entry.needs_weight or self.weight_operand(op) is not None:
                return True
        return False

    def _skipped(self, op: OpRef, patterns: Sequence[str]) -> bool:
        weight = self.weight_operand(op)
        haystack = op.scope_name + " " + (weight.name if weight else "")
        return any(p in haystack for p in patterns)

    def weight_operand(self, op: OpRef) -> Operand | None:
        """The parameter ``op`` multiplies by (conv filter, fc weight, table), if any."""
        entry = OP_TABLE.get(op.seed_type or "")
        if entry is None or entry.weight_slot is None:
            return None
        slot = entry.weight_slot[0 if self.family == "legacy" else 1]
        operand = self._operand_in_slot(op, slot)
        return operand if operand is not None and operand.is_param else None

    def lookup_reads_sequences(self, op: OpRef) -> bool:
        """Whether the lookup ``op``'s ids carry sequence lengths (legacy LoD) that its rows pass on to their readers
        (a GRU, a sequence pool); a fused lookup op would drop them. PIR has no LoD."""
        return False

    def activation_operands(self, op: OpRef) -> list[Operand]:
        """The non-parameter float inputs of ``op`` that no rewrite of ours produced."""
        return [o for o in self.operands(op) if not o.is_param and self._key(o.value) not in self._made]

    @abstractmethod
    def _key(self, value: Any) -> Any:
        """A hashable identity of a backend value."""

    def readers(self, ops: Iterable[OpRef]) -> dict[int, list[Operand]]:
        """For each of ``ops`` (keyed by :attr:`OpRef.key`), the float operands of other ops that read its first
        output, in program order (one pass over the program); a model output read by no op has none."""
        outputs = {self._key(self.output(op)): op.key for op in ops}
        found: dict[int, list[Operand]] = {k: [] for k in outputs.values()}
        for reader in self.ops():
            if reader.type in ("feed", "fetch"):  # legacy programs' I/O ops read no tensor as ops do
                continue
            for operand in self.operands(reader):
                owner = outputs.get(self._key(operand.value))
                if owner is not None:
                    found[owner].append(operand)
        return found

    def weight_channel_axis(self, op: OpRef) -> int | None:
        """Output-channel axis of ``op``'s weight (honours a transposed matmul weight)."""
        entry = OP_TABLE.get(op.seed_type or "")
        if entry is None or entry.weight_channel_axis is None:
            return None
        if entry.kind.transposable and self._weight_transposed(op):
            return 0
        return entry.weight_channel_axis

    @abstractmethod
    def _weight_transposed(self, op: OpRef) -> bool: ...

    @abstractmethod
    def added_param(self, add: OpRef) -> Operand | None:
        """The parameter an ``elementwise_add`` adds (directly or through a reshape), if any."""

    @abstractmethod
    def bias_operand(self, op: OpRef) -> Operand | None:
        """The bias parameter added to ``op``'s output by the add that is its only consumer, if any."""

    # ---- parameters -----------------------------------------------------------------
    def get_param(self, name: str) -> np.ndarray:
        """A copy of parameter ``name`` from the model's scope."""
        var = self.model.scope.find_var(name)
        if var is None:
            raise GraphError(f"parameter {name!r} not found in the model; check the name")
        return np.array(var.get_tensor())

    def set_param(self, name: str, value: np.ndarray) -> None:
        """Create or overwrite parameter ``name`` in the scope (does not touch the program)."""
        self.model.scope.var(name).get_tensor().set(np.ascontiguousarray(value), paddle.CPUPlace())

    @abstractmethod
    def param_names(self) -> list[str]:
        """Names of every parameter the program reads (what a save writes)."""

    def drop_param_if_unused(self, name: str) -> None:
        """Remove parameter ``name`` from the program when no op reads it any more (the scope keeps it)."""
        try:
            value = self._param_value(name)
        except KeyError:  # already gone
            return
        self._drop_if_unused(value)

    @abstractmethod
    def _drop_if_unused(self, value: Any) -> None:
        """Remove the parameter ``value`` (a name or a PIR value) from the program if nothing reads it."""

    # ---- editing ops ------------------------------------------------------------------
    @abstractmethod
    def rename_input(self, op: OpRef, old: Any, new: Any) -> None:
        """Make ``op`` read ``new`` wherever it reads ``old`` (backend values: names in legacy programs)."""

    @abstractmethod
    def set_attr(self, op: OpRef, name: str, value: Any) -> None:
        """Set (or add) attribute ``name`` of ``op``."""

    @abstractmethod
    def retype(self, op: OpRef, op_type: str) -> None:
        """Make ``op`` an op of backend type ``op_type`` with the same inputs, outputs and attributes."""

    @contextlib.contextmanager
    def test_mode(self) -> Iterator[None]:
        """For the body, ops that carry ``is_test`` run in test mode; their own values come back afterwards."""
        changed = self._training_ops()
        for raw in changed:
            self._set_is_test(raw, True)
        try:
            yield
        finally:
            for raw in changed:
                self._set_is_test(raw, False)

    @contextlib.contextmanager
    def calibration_run(self) -> Iterator[None]:
        """For the body, :meth:`run` runs as calibration does: in :meth:`test_mode` (an inference program
        means it; oneDNN's conv2d_transpose runs only so), on oneDNN's float kernels (faster) unless the
        executor cannot run one of the program's ops on them."""
        with onednn_kernels() if self._runs_on_onednn() else contextlib.nullcontext(), self.test_mode():
            yield

    def _runs_on_onednn(self) -> bool:
        """Whether ``paddle.static.Executor`` runs every op of the program on oneDNN's float kernels."""
        return True

    @abstractmethod
    def _training_ops(self) -> list[Any]:
        """The backend ops whose ``is_test`` attribute is false."""

    @abstractmethod
    def _set_is_test(self, raw: Any, value: bool) -> None: ...

    @abstractmethod
    def bypass(self, op: OpRef, slot: str) -> None:
        """Remove ``op`` (which passes the tensor of input ``slot`` through to its first output, e.g. a fake
        quantization): its readers read that tensor instead."""

    def inserting_before(self, op: OpRef) -> AbstractContextManager[None]:
        """Ops built with Paddle's API in the body go into this program just before ``op`` (PIR only)."""
        raise GraphError(f"{self.family} programs: ops are built by the graph's own rewrites, not Paddle's API")

    @abstractmethod
    def fake_quant_activation(
        self, before: OpRef, x: Any, state: str, bits: int, moving_rate: float, *, test: bool,
        batch_abs_max: bool = False, initial: float = 0.0,
    ) -> Any:
        """Put a training fake quant-dequant of activation ``x`` (a backend value) just before ``before``; returns
        its output (``before`` still reads ``x``: :meth:`rename_input`).

        A moving average of the abs max, in persistable ``{state}@scale`` / ``@accum`` / ``@state`` variables
        (started at ``initial``; ones that already exist keep their values, so a test program reads what its
        training program learns). ``test``: frozen at the learned scale. ``batch_abs_max`` (PIR, training):
        each batch's abs max instead, the last one kept in ``{state}@scale``.
        """

    @abstractmethod
    def fake_quant_weight(self, before: OpRef, w: Any, bits: int, axis: int | None) -> Any:
        """Put a training fake quant-dequant of weight ``w`` (abs max per channel along ``axis``, or of the
        whole tensor) just before ``before``; returns its output."""

    # ---- rewriting --------------------------------------------------------------------
    def insert_act_qdq(
        self, operand: Operand, threshold: float, bits: int = 8, unsigned: bool = False, offset: float = 0.0,
        zero_point: bool = False,
    ) -> None:
        """Make ``operand``'s op read a quantize->dequantize copy of the activation.

        ``threshold`` is the clipping value (scale = threshold / (2**(bits-1)-1)). A tensor
        read by several ops gets one QDQ pair that all of them share. ``unsigned`` (legacy
        only, for tensors that are never negative) simulates the unsigned codes ``0..2**bits-1``
        oneDNN runs such tensors with (:func:`qcore.deploy.onednn.unsigned_activations`); the stored
        ``bit_length`` and scale stay those of the signed form, which is what deploys.
        A non-zero ``offset`` quantizes ``x - offset`` and adds ``offset`` back (a shift op on each
        side of the pair): the asymmetric grid of :func:`qcore.quant.asymmetric_range`. ``zero_point``
        (legacy only, for runtimes that read it) stores the pair's integer zero point and marks the
        shifts, which the saved program then leaves out (:mod:`qcore.zero_points`).
        """
        if not np.isfinite(threshold) or threshold <= 0:
            raise GraphError(
                f"activation {operand.name!r}: threshold must be a positive finite number, got "
                f"{threshold}; the calibration data never reached this tensor or was all zeros"
            )
        qmax(bits)  # validates the bit width
        with self._editing():
            key = self._key(operand.value)  # PIR value names shift as ops are inserted; ids do not
            if key not in self._act_qdq:
                self._act_qdq[key] = self._build_act_qdq(
                    operand, float(threshold), bits, unsigned, float(offset), zero_point and bool(offset)
                )
                self._made.add(self._key(self._act_qdq[key]))
            self._set_operand(operand, self._act_qdq[key])

    def scale_activation(self, operands: Sequence[Operand], factors: np.ndarray) -> None:
        """Make each of ``operands`` (readers of one activation) read it multiplied by ``factors`` along its
        last axis: one multiply by a new parameter, before the first reader, that they all share. The
        product is an ordinary activation (the readers quantize it); other readers keep the original.
        Activation smoothing (:mod:`qptq.smooth`) divides an activation this way and multiplies the weights."""
        if not operands:
            return
        factors = np.asarray(factors, np.float32)
        if factors.ndim != 1 or not np.all(np.isfinite(factors)) or not np.all(factors > 0):
            raise GraphError(f"activation {operands[0].name!r}: channel factors must be positive and finite")
        with self._editing():
            self._build_channel_scale(list(operands), factors)

    @abstractmethod
    def _build_channel_scale(self, operands: list[Operand], factors: np.ndarray) -> None: ...

    def act_qdq_copy(self, name: str) -> Any:
        """The dequantized copy of activation ``name`` that :meth:`insert_act_qdq` made (what its readers read)."""
        if name not in self._act_qdq:
            raise GraphError(f"activation {name!r} has no QDQ copy in this program; quantize a reader first")
        return self._act_qdq[name]

    def quantize_weight(
        self,
        operand: Operand,
        bits: int = 8,
        axis: int | None = None,
        thresholds: np.ndarray | float | None = None,
        float_dequant: bool = False,
        max_code: int | None = None,
        value: np.ndarray | None = None,
    ) -> QuantizedWeight:
        """Store ``operand``'s parameter as int8/int16 codes read through a dequantize step.

        ``axis`` is the channel axis for per-channel scales (None: one scale). Thresholds
        default to the abs max (per channel). A weight shared by several ops is quantized once.
        ``max_code`` keeps the codes within +-``max_code`` by widening the thresholds (stored
        widened): the overflow fix of :mod:`qcore.deploy.host`. ``value`` is quantized instead of
        the parameter's float weight (same shape; the parameter itself is never changed).
        ``float_dequant`` makes legacy programs use cast -> elementwise_mul instead of
        ``dequantize_linear``, which Paddle Inference's oneDNN int8 passes fold into the op: right
        for ops without int8 kernels (measured: ``c_embedding`` then fails to run).
        """
        if not operand.is_param:
            raise GraphError(f"{operand.name!r} is not a parameter; only weights can be stored quantized")
        weight = self.get_param(operand.name)
        if value is not None:
            if value.shape != weight.shape:
                raise GraphError(f"value for {operand.name!r} has shape {value.shape}, expected {weight.shape}")
            weight = value
        if thresholds is None:
            thresholds = abs_max(weight, axis)
        thr = bounded_thresholds(thresholds, bits, max_code)
        codes = quantize(weight, scale_from_threshold(thr if axis is not None else thr[0], bits), bits, axis)
        quantized = QuantizedWeight(codes, thr, axis, bits, float_dequant)
        with self._editing():
            if operand.name not in self._weight_dq:
                self._weight_dq[operand.name] = self._build_weight_dq(operand, quantized)
                self._made.add(self._key(self._weight_dq[operand.name]))
            self._set_operand(operand, self._weight_dq[operand.name])
        return quantized

    def quantize_lookup(
        self, op: OpRef, codes: np.ndarray, scales: np.ndarray, log_step: float | None = None, *,
        bits: int = 8, offsets: np.ndarray | None = None, fused_op: str | None = None,
    ) -> None:
        """Make the table lookup ``op`` read int8 ``codes`` and dequantize only the rows it looks up.

        The lookup op itself runs on the int8 table (Paddle's CPU embedding kernels accept
        int8 in the executor and in paddle.inference), then its rows are cast to float and
        multiplied by ``scales``: one value for the whole table, or one per row (looked up with
        the same ids). A ``log_step`` reads the codes as :func:`qcore.quant.log_quantize` codes of
        that grid (``sign(c) * exp(log_step * (1 - |c|))`` times the scale, i.e. the abs max; ``ln 2``
        is powers of two). ``offsets`` (one per row, with per-row scales) make the grid affine: the
        codes are then unsigned, ``0 .. 2**bits - 1``, and a row is ``codes * scale + offset``.

        Codes of ``bits`` <= 4 are stored packed (:mod:`qcore.packing`): the lookup reads the packed
        rows and one more lookup, in a 256-row table, turns each byte into its codes' values. A
        table read by several lookups is stored once.

        ``fused_op`` names a registered custom op (qembed's ``qembed_lookup``) that replaces the lookup
        and the whole sequence: it takes ``Ids, Codes, Scale, Offset?, Values?`` and the attributes
        ``dim, packed`` (codes per byte, 1 unpacked), ``pooling`` and ``padding_idx``.

        Per-row ``scales`` (and ``offsets``) given as float16 are stored float16 and widened to float32 after
        their lookup: half their bytes, the same values. A single scale is stored float32.
        """
        weight = self.weight_operand(op)
        if weight is None:
            raise GraphError(f"{op!r} has no parameter table to quantize")
        shape = self.get_param(weight.name).shape
        rows = shape[0]
        scales = np.asarray(scales).reshape(-1)
        if scales.dtype != np.float16 or scales.size == 1:  # one scale: float32 (its lookup-free multiply needs it)
            scales = scales.astype(np.float32)
        if codes.dtype != np.int8 or codes.shape != shape:
            raise GraphError(f"codes for {weight.name!r} must be int8 with the table's shape")
        if scales.size not in (1, rows):
            raise GraphError(f"{weight.name!r} has {rows} rows; pass one scale or one per row, not {scales.size}")
        if offsets is not None and (np.asarray(offsets).size != rows or scales.size != rows or bits > MAX_PACKED_BITS):
            raise GraphError(f"offsets for {weight.name!r} go with per-row scales and codes of <= "
                             f"{MAX_PACKED_BITS} bits: pass one offset per row")
        with self._editing():
            key = weight.name
            if key not in self._weight_dq:
                self._weight_dq[key] = self._lookup_params(op, key, codes, scales, log_step, bits, offsets,
                                                           fused_op is not None)
            if fused_op is None:
                self._build_lookup_dq(op, weight, self._weight_dq[key])
            else:
                self._build_lookup_fused(op, self._weight_dq[key], fused_op)

    def quantize_mixed_lookup(self, op: OpRef, cold: RowSet, hot: RowSet, position_bytes: int) -> None:
        """Make the lookup ``op`` read a table stored as two row sets (qembed's mixed precision).

        ``cold`` covers every row; a row whose cold scale is 0 reads zeros there, and the first ``position_bytes``
        stored bytes of its cold row, read as signed digits ``sum(byte_k * 256**k)``, give its row in ``hot``
        (0 for the others: ``hot`` row 0 is zeros). The lookup is the sum of both sets' dequantized rows, each set
        read like a :meth:`quantize_lookup` table (per-row scales and offsets, packed codes), so one of the two
        terms is zeros and the result is bit-equal to that set's rows.
        """
        weight = self.weight_operand(op)
        if weight is None:
            raise GraphError(f"{op!r} has no parameter table to quantize")
        rows, dim = self.get_param(weight.name).shape
        for part, name in ((cold, "cold"), (hot, "hot")):
            if part.codes.dtype != np.int8 or part.codes.shape[1] != dim or part.scales.size != len(part.codes):
                raise GraphError(f"the {name} rows of {weight.name!r} need int8 codes of {dim} values and one scale "
                                 "per row")
        if len(cold.codes) != rows or not 1 <= position_bytes <= 3:
            raise GraphError(f"the cold rows of {weight.name!r} must cover its {rows} rows and hold a position in "
                             "1 to 3 bytes")
        with self._editing():
            key = weight.name
            if key not in self._weight_dq:
                sets = [self._lookup_params(op, f"{key}.{name}", part.codes, self._row_scales(part.scales), None,
                                            part.bits, part.offsets) for part, name in ((cold, "cold"), (hot, "hot"))]
                weights = self._add_param(self._new_param_name(f"{key}@position_weights"),
                                          256.0 ** np.arange(position_bytes, dtype=np.float32), op)
                self._weight_dq[key] = (*sets, weights)
            self._build_mixed_lookup_dq(op, weight, *self._weight_dq[key])

    @staticmethod
    def _row_scales(scales: np.ndarray) -> np.ndarray:
        scales = np.asarray(scales).reshape(-1)
        return scales if scales.dtype == np.float16 else scales.astype(np.float32)

    @abstractmethod
    def _build_mixed_lookup_dq(self, op: OpRef, weight: Operand, cold: LookupTables, hot: LookupTables,
                               weights: Any) -> None: ...

    def _lookup_params(self, op: OpRef, key: str, codes: np.ndarray, scales: np.ndarray, log_step: float | None,
                       bits: int, offsets: np.ndarray | None, fused: bool = False) -> LookupTables:
        """Add the parameters of a quantized table: its (packed) codes, scales, offsets and byte values
        (``fused``: the value of each unpacked log code too)."""
        rows, dim = codes.shape
        per_row = scales.size > 1
        column = [rows, 1] if per_row else [1]
        half = scales.dtype == np.float16

        def add(suffix: str, value: np.ndarray) -> Any:
            return self._add_param(self._new_param_name(f"{key}{suffix}"), value, op)

        def log_values(c: np.ndarray) -> np.ndarray:  # sign(c) * exp(log_step * (1 - |c|)), 0 for c = 0
            return np.sign(c) * np.exp(log_step * (1 - np.abs(c)))

        if bits > MAX_PACKED_BITS:
            code_values = None
            if fused and log_step is not None:
                code_values = add("@code_values", log_values(np.arange(-128, 128.0)).astype(np.float32))
            return LookupTables(add(".quantized", codes), add("@scale", scales.reshape(column)), dim, per_row,
                                log_step=log_step, code_values=code_values, half=half)
        fields = np.arange(1 << field_bits(bits))
        values = fields if offsets is not None else signed_fields(fields, bits).astype(np.float64)
        if log_step is not None:
            values = log_values(values)
        return LookupTables(
            add(".packed", pack_codes(codes, bits)),
            add("@scale", scales.reshape(column)), dim, per_row,
            offset=None if offsets is None else add("@offset", np.asarray(offsets, scales.dtype).reshape(column)),
            byte_values=add("@byte_values", byte_values(bits, values)),
            padded=dim % codes_per_byte(bits) != 0,
            per_byte=codes_per_byte(bits),
            half=half,
        )

    @abstractmethod
    def _build_lookup_dq(self, op: OpRef, weight: Operand, tables: LookupTables) -> None: ...

    @abstractmethod
    def _build_lookup_fused(self, op: OpRef, tables: LookupTables, op_type: str) -> None: ...

    @staticmethod
    def _fused_attrs(tables: LookupTables, pooling: str, padding_idx: int) -> dict[str, Any]:
        """The attributes of a fused lookup op reading ``tables``."""
        return {"dim": tables.dim, "packed": tables.per_byte, "pooling": pooling, "padding_idx": padding_idx}

    @staticmethod
    def _bag_pooling(reduce: str, axes: Sequence[int], keepdim: bool, rank: int, padding_idx: int) -> str | None:
        """The fused op's pooling for a ``reduce`` ("sum" / "mean") over ``axes`` of a lookup's ``rank``-D rows,
        None when it is not a bag reduction the op does the same way: one axis, the ids' last, dropped. The
        program's mean counts padding rows, the op's does not, so a mean folds only without padding_idx."""
        if keepdim or len(axes) != 1 or axes[0] % rank != rank - 2:
            return None
        return reduce if reduce == "sum" or padding_idx < 0 else None

    def replace_weight(self, operand: Operand, value: np.ndarray, suffix: str = "replaced") -> str:
        """Make ``operand``'s op read a new float parameter holding ``value``; returns its name."""
        if not operand.is_param:
            raise GraphError(f"{operand.name!r} is not a parameter; only weights can be replaced")
        old = self.get_param(operand.name)
        if old.shape != value.shape:
            raise GraphError(f"new value for {operand.name!r} has shape {value.shape}, expected {old.shape}")
        name = self._new_param_name(f"{operand.name}.{suffix}")
        with self._editing():
            self._set_operand(operand, self._add_param(name, value.astype(np.float32), operand.op))
        return name

    def int8_weight_codes(self) -> int:
        """Store as int8 the integer-valued float32 weight codes ``dequantize_linear`` ops read (the form Paddle's
        own QAT ``convert`` saves, which Paddle Inference's oneDNN int8 path runs wrongly); returns how many."""
        raise GraphError(f"{self.family} programs: weight codes are stored by the exporter; nothing to convert")

    def fold_conv_bn(self, *, fusable_biases: bool = True) -> int:
        """Fold every inference batch_norm that directly follows a conv into the conv.

        Returns how many were folded. The conv gets a new scaled filter and bias parameter. Then, with
        ``fusable_biases``, every conv bias gets the form the backend's inference passes fuse
        (:meth:`_fusable_conv_biases`).
        """
        folded = 0
        with self._editing():
            for bn in self.ops(["batch_norm"]):
                match = self._conv_before_bn(bn)
                if match is None:
                    continue
                conv, bias_operand = match
                self._fold_one(conv, bias_operand, bn)
                folded += 1
            if fusable_biases:
                self._fusable_conv_biases()
        return folded

    @abstractmethod
    def _fusable_conv_biases(self) -> None:
        """Rewrite conv bias adds into the form the backend's inference passes fuse."""

    def _fold_one(self, conv: OpRef, bias: Operand | None, bn: OpRef) -> None:
        gamma, beta, mean, var, eps = self._bn_params(bn)
        factor = gamma / np.sqrt(var + eps)
        weight = self.weight_operand(conv)
        assert weight is not None
        w = self.get_param(weight.name)
        axis = self.weight_channel_axis(conv)
        shape = [1] * w.ndim
        shape[axis] = -1
        folded_w = (w * factor.reshape(shape)).astype(w.dtype)
        old_bias = self.get_param(bias.name).reshape(-1) if bias is not None else np.zeros_like(mean)
        folded_b = ((old_bias - mean) * factor + beta).astype(np.float32)
        new_w = self._new_param_name(weight.name + ".bn_folded")
        self._add_param(new_w, folded_w, conv)
        self.bn_folded[weight.name] = (new_w, factor)
        self._set_operand(weight, self._param_value(new_w))
        self._replace_bn(conv, bias, bn, folded_b)

    @abstractmethod
    def _conv_before_bn(self, bn: OpRef) -> tuple[OpRef, Operand | None] | None:
        """The conv feeding ``bn`` (and its bias operand when a bias add sits between)."""

    @abstractmethod
    def _bn_params(self, bn: OpRef) -> tuple[np.ndarray, ...]: ...

    @abstractmethod
    def _replace_bn(self, conv: OpRef, bias: Operand | None, bn: OpRef, folded_bias: np.ndarray) -> None: ...

    @abstractmethod
    def _build_act_qdq(
        self, operand: Operand, threshold: float, bits: int, unsigned: bool, offset: float, zero_point: bool
    ) -> Any: ...

    @abstractmethod
    def _build_weight_dq(self, operand: Operand, weight: QuantizedWeight) -> Any: ...

    @abstractmethod
    def _set_operand(self, operand: Operand, value: Any) -> None: ...

    @abstractmethod
    def _add_param(self, name: str, value: np.ndarray, before: OpRef) -> Any: ...

    @abstractmethod
    def _param_value(self, name: str) -> Any: ...

    def _new_param_name(self, base: str) -> str:
        name, k = base, 1
        while self.model.scope.find_var(name) is not None:
            k += 1
            name = f"{base}_{k}"
        return name

    def _editing(self) -> Any:
        return static_mode(self.model.family, self.model.scope)  # type: ignore[arg-type]

    # ---- reading a quantized program back ---------------------------------------------
    def unquantize(self) -> Unquantized:
        """Turn this (quantized) program into its float form, in place, and return what was taken out.

        Every activation QDQ pair becomes a marker cast, every integer-stored weight a float
        parameter holding the dequantized values (so the float program computes exactly what
        the quantized one does without the rounding). Call it on a :meth:`clone`. Exporters
        (:mod:`qcore.export`) write the returned grids and codes back in their own format.
        """
        with self._editing():
            markers, weights = self._unquantize()
            cast_ids = [id(raw) for raw in self._raw_ops() if self._op_type(raw) == self._CAST]
        grids = {}
        for raw, grid in markers:
            grids[next(k for k, c in enumerate(cast_ids) if c == id(raw))] = grid
        return Unquantized(grids, weights)

    _CAST: str  # the backend's cast op type

    def _float_param_name(self, codes_name: str) -> str:
        """A new name for the float parameter that stands for integer codes ``codes_name`` (``w.quantized``)."""
        base = codes_name[: -len(".quantized")] if codes_name.endswith(".quantized") else codes_name
        return self._new_param_name(f"{base}.float")

    @abstractmethod
    def _unquantize(self) -> tuple[list[tuple[Any, ActivationGrid]], list[StoredWeight]]:
        """Replace QDQ pairs by marker casts and stored weights by float ones; the markers' raw ops."""

    # ---- whole graph ----------------------------------------------------------------
    @abstractmethod
    def clone(self) -> Graph:
        """An independent copy of the program sharing the (never overwritten) parameters."""

    def save(
        self,
        save_dir: str | os.PathLike[str],
        model_filename: str | None = None,
        params_filename: str | None = None,
        extra_files: Mapping[str, bytes] | None = None,
    ) -> ModelFiles:
        """Save atomically in the model's family (see :func:`qcore.model_io.save_model`)."""
        return save_model(self.model, save_dir, model_filename, params_filename, extra_files)

    def run(self, feed: dict[str, np.ndarray], fetch: Sequence[Any] | None = None) -> list[np.ndarray]:
        """Run in the executor; ``fetch`` takes operands' values or the model's outputs."""
        return self.model.run(feed, list(fetch) if fetch is not None else None)

    def op_types(self) -> list[str]:
        """Backend op types in program order (handy for asserting on rewrites)."""
        return [self._op_type(raw) for raw in self._raw_ops()]
