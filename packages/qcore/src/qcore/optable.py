"""The op table: every seed op type, its kind, and its op names in each IR.

Method packages speak seed names (``conv2d``, ``mul``, ``lookup_table``, ``elementwise_add``,
...); each graph backend looks the name up here. ``mul`` is what Paddle 1.x called a fully
connected layer; Paddle 2+ exports ``Linear`` as ``matmul_v2`` (legacy) / ``pd_op.matmul``
(PIR), so ``mul`` matches those matmuls whose second operand is a parameter.

An entry's :class:`OpKind` says how ops of that kind are quantized (which inputs, the weight's
output-channel axis, the input's channel axis for bias correction). Every op-type list of q*
is derived from this table (:mod:`qcore.constants`, the graph's conv+BN folding, bias
correction, oneDNN's fc and conv rules, ``quant_post_dynamic``), so supporting a new op is
one new entry. Pure Python: importing it needs no Paddle.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from .errors import GraphError, did_you_mean


@dataclass(frozen=True)
class OpKind:
    """How every op of one kind is quantized."""

    name: str
    quantizes_activations: bool = True  # its float inputs get a quantize/dequantize pair
    weight_channel_axis: int | None = None  # output-channel axis of its weight (per-channel scales)
    transposable: bool = False  # a transposed weight (matmul ``trans_y``) moves that axis to 0
    bias_axis: int | None = None  # channel axis of its input for bias correction; None: not corrected


CONV = OpKind("conv", weight_channel_axis=0, bias_axis=1)
DEPTHWISE = OpKind("depthwise", weight_channel_axis=0, bias_axis=1)
CONV_TRANSPOSE = OpKind("conv_transpose", weight_channel_axis=1)
FC = OpKind("fc", weight_channel_axis=1, transposable=True, bias_axis=-1)
LOOKUP = OpKind("lookup", quantizes_activations=False)  # the table is the weight; ids are integers
ELTWISE = OpKind("eltwise")
POOL = OpKind("pool")
ACTIVATION = OpKind("activation")
LAYOUT = OpKind("layout")  # moves or selects values: concat, reshape, slice, interpolation, ...
COMPARE = OpKind("compare")
REDUCE = OpKind("reduce")
NORM = OpKind("norm", quantizes_activations=False)  # batch norm: folded into the conv before it
# A recurrent cell's weight ([hidden, gates * hidden], one column per gate unit): weight-only, never QDQ.
RECURRENT = OpKind("recurrent", quantizes_activations=False, weight_channel_axis=1)

#: Kinds whose weight sits in a convolution filter.
CONV_KINDS = (CONV, DEPTHWISE, CONV_TRANSPOSE)


@dataclass(frozen=True)
class OpSpec:
    """One seed op type: its kind, its names in each IR and which operand holds its weight."""

    kind: OpKind
    legacy: tuple[str, ...]
    pir: tuple[str, ...]
    weight_slot: tuple[str, str] | None = None  # (legacy slot, PIR input name)
    needs_weight: bool = False  # only matches ops whose weight operand is a parameter
    seed: bool = True  # a name of the seeds' op-type tables (False: accepted besides them)

    @property
    def weight_channel_axis(self) -> int | None:
        """Output-channel axis of the weight (of an untransposed one)."""
        return self.kind.weight_channel_axis


def _same(
    kind: OpKind, name: str, pir: str | None = None, weight_slot: tuple[str, str] | None = None, seed: bool = True
) -> OpSpec:
    """An entry whose PIR name is ``pd_op.`` + its legacy name (or ``pir``)."""
    return OpSpec(kind, (name,), (f"pd_op.{pir or name}",), weight_slot, seed=seed)


_FILTER = ("Filter", "filter")
_MATMUL = (("mul", "matmul", "matmul_v2"), ("pd_op.matmul",))

#: In the seeds' order: the seeds' tables in :mod:`qcore.constants` are read off it.
OP_TABLE: dict[str, OpSpec] = {
    "conv2d": _same(CONV, "conv2d", weight_slot=_FILTER),
    "depthwise_conv2d": _same(DEPTHWISE, "depthwise_conv2d", weight_slot=_FILTER),
    "mul": OpSpec(FC, *_MATMUL, weight_slot=("Y", "y"), needs_weight=True),
    "matmul": OpSpec(FC, *_MATMUL, weight_slot=("Y", "y"), seed=False),
    "matmul_v2": OpSpec(FC, *_MATMUL, weight_slot=("Y", "y"), seed=False),
    "conv2d_transpose": _same(CONV_TRANSPOSE, "conv2d_transpose", weight_slot=_FILTER),
    "lookup_table": OpSpec(LOOKUP, ("lookup_table", "lookup_table_v2"), ("pd_op.embedding",), ("W", "weight")),
    "fused_embedding_seq_pool": _same(LOOKUP, "fused_embedding_seq_pool", weight_slot=("W", "w")),
    "pyramid_hash": _same(LOOKUP, "pyramid_hash", weight_slot=("W", "w")),
    # Paddle 3's other table lookups (not seed names): nn.Embedding(scale_grad_by_freq=True) and the
    # model-parallel vocabulary shard (ids outside [start_index, start_index + rows) give zeros).
    "embedding_with_scaled_gradient": _same(LOOKUP, "embedding_with_scaled_gradient",
                                            weight_slot=("weight", "weight"), seed=False),
    "c_embedding": _same(LOOKUP, "c_embedding", weight_slot=("W", "weight"), seed=False),
    "gru": _same(RECURRENT, "gru", weight_slot=("Weight", "weight"), seed=False),  # Paddle 1.x dynamic_gru
    "pool2d": _same(POOL, "pool2d"),
    "elementwise_add": _same(ELTWISE, "elementwise_add", "add"),
    "concat": _same(LAYOUT, "concat"),
    "softmax": _same(ACTIVATION, "softmax"),
    "argmax": OpSpec(REDUCE, ("arg_max",), ("pd_op.argmax",)),
    "transpose": OpSpec(LAYOUT, ("transpose", "transpose2"), ("pd_op.transpose",)),
    "equal": _same(COMPARE, "equal"),
    "gather": _same(LAYOUT, "gather"),
    "greater_equal": _same(COMPARE, "greater_equal"),
    "greater_than": _same(COMPARE, "greater_than"),
    "less_equal": _same(COMPARE, "less_equal"),
    "less_than": _same(COMPARE, "less_than"),
    "mean": _same(REDUCE, "mean"),
    "not_equal": _same(COMPARE, "not_equal"),
    "reshape": OpSpec(LAYOUT, ("reshape",), ("pd_op.reshape",)),
    "reshape2": OpSpec(LAYOUT, ("reshape2",), ("pd_op.reshape",)),
    "bilinear_interp": OpSpec(LAYOUT, ("bilinear_interp", "bilinear_interp_v2"), ("pd_op.bilinear_interp",)),
    "nearest_interp": OpSpec(LAYOUT, ("nearest_interp", "nearest_interp_v2"), ("pd_op.nearest_interp",)),
    "trilinear_interp": OpSpec(LAYOUT, ("trilinear_interp", "trilinear_interp_v2"), ("pd_op.trilinear_interp",)),
    "slice": _same(LAYOUT, "slice"),
    "squeeze": OpSpec(LAYOUT, ("squeeze", "squeeze2"), ("pd_op.squeeze",)),
    "elementwise_sub": _same(ELTWISE, "elementwise_sub", "subtract"),
    "relu": _same(ACTIVATION, "relu"),
    "relu6": _same(ACTIVATION, "relu6"),
    "leaky_relu": _same(ACTIVATION, "leaky_relu"),
    "tanh": _same(ACTIVATION, "tanh"),
    "swish": _same(ACTIVATION, "swish"),
    "batch_norm": OpSpec(NORM, ("batch_norm",), ("pd_op.batch_norm", "pd_op.batch_norm_")),
}


def seed_types(*kinds: OpKind, seed: bool | None = None) -> tuple[str, ...]:
    """The op types of ``kinds``, in table order; ``seed``: only (True) or never (False) seed names."""
    return tuple(t for t, s in OP_TABLE.items() if s.kind in kinds and (seed is None or s.seed == seed))


def weighted_kinds() -> tuple[OpKind, ...]:
    """The kinds whose weight and activation inputs are both quantized (conv, fc, ...)."""
    return tuple(dict.fromkeys(s.kind for s in OP_TABLE.values()
                               if s.weight_slot is not None and s.kind.quantizes_activations))


def activation_kinds() -> tuple[OpKind, ...]:
    """The kinds without a weight whose activation inputs are quantized (add, pool, relu, ...)."""
    return tuple(dict.fromkeys(s.kind for s in OP_TABLE.values()
                               if s.weight_slot is None and s.kind.quantizes_activations))


def spec(seed_type: str) -> OpSpec:
    """The :class:`OpSpec` for a seed op type; raises GraphError naming the known types."""
    try:
        return OP_TABLE[seed_type]
    except KeyError:
        raise GraphError(
            f"unknown op type {seed_type!r}{did_you_mean(seed_type, OP_TABLE)}; "
            f"known types: {', '.join(sorted(OP_TABLE))}"
        ) from None


def kind_of(seed_type: str | None) -> OpKind | None:
    """The kind of a seed op type, or None for an op outside the table."""
    entry = OP_TABLE.get(seed_type or "")
    return None if entry is None else entry.kind


def backend_names(seed_type: str, family: str) -> tuple[str, ...]:
    """The op names ``seed_type`` has in ``family`` ('legacy' or 'pir')."""
    entry = spec(seed_type)
    return entry.legacy if family == "legacy" else entry.pir


def backend_names_of(seed_types_: Iterable[str], family: str) -> frozenset[str]:
    """The op names all of ``seed_types_`` have in ``family``."""
    return frozenset(n for t in seed_types_ for n in backend_names(t, family))


#: Convolutions (legacy op types; PIR: ``pd_op.`` + these), whose batch norm can be folded.
CONV_TYPES = seed_types(*CONV_KINDS)
