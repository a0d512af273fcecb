"""The one table that maps the seeds' op-type names to each backend's op names.

Method packages speak seed names (``conv2d``, ``mul``, ``lookup_table``, ``elementwise_add``,
...); each graph backend looks the name up here. ``mul`` is what Paddle 1.x called a fully
connected layer; Paddle 2+ exports ``Linear`` as ``matmul_v2`` (legacy) / ``pd_op.matmul``
(PIR), so ``mul`` matches those matmuls whose second operand is a parameter.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class OpSpec:
    """How one seed op type appears in each IR and which operand holds its weight."""

    legacy: tuple[str, ...]
    pir: tuple[str, ...]
    weight_slot: tuple[str, str] | None = None  # (legacy slot, PIR input name)
    weight_channel_axis: int | None = None  # output-channel axis of the weight
    needs_weight: bool = False  # only matches ops whose weight operand is a parameter


def _same(name: str, pir: str | None = None) -> tuple[tuple[str, ...], tuple[str, ...]]:
    return (name,), (f"pd_op.{pir or name}",)


_MATMUL = (("mul", "matmul", "matmul_v2"), ("pd_op.matmul",))

OP_TABLE: dict[str, OpSpec] = {
    "conv2d": OpSpec(*_same("conv2d"), weight_slot=("Filter", "filter"), weight_channel_axis=0),
    "depthwise_conv2d": OpSpec(
        *_same("depthwise_conv2d"), weight_slot=("Filter", "filter"), weight_channel_axis=0
    ),
    "conv2d_transpose": OpSpec(
        *_same("conv2d_transpose"), weight_slot=("Filter", "filter"), weight_channel_axis=1
    ),
    "mul": OpSpec(*_MATMUL, weight_slot=("Y", "y"), weight_channel_axis=1, needs_weight=True),
    "matmul": OpSpec(*_MATMUL, weight_slot=("Y", "y"), weight_channel_axis=1),
    "matmul_v2": OpSpec(*_MATMUL, weight_slot=("Y", "y"), weight_channel_axis=1),
    "lookup_table": OpSpec(
        ("lookup_table", "lookup_table_v2"), ("pd_op.embedding",), weight_slot=("W", "weight")
    ),
    "fused_embedding_seq_pool": OpSpec(
        ("fused_embedding_seq_pool",), ("pd_op.fused_embedding_seq_pool",), weight_slot=("W", "w")
    ),
    "pyramid_hash": OpSpec(("pyramid_hash",), ("pd_op.pyramid_hash",), weight_slot=("W", "w")),
    # Paddle 3's other table lookups (not seed names): nn.Embedding(scale_grad_by_freq=True) and the
    # model-parallel vocabulary shard (ids outside [start_index, start_index + rows) give zeros).
    "embedding_with_scaled_gradient": OpSpec(
        *_same("embedding_with_scaled_gradient"), weight_slot=("weight", "weight")
    ),
    "c_embedding": OpSpec(*_same("c_embedding"), weight_slot=("W", "weight")),
    "elementwise_add": OpSpec(*_same("elementwise_add", "add")),
    "elementwise_sub": OpSpec(*_same("elementwise_sub", "subtract")),
    "pool2d": OpSpec(*_same("pool2d")),
    "concat": OpSpec(*_same("concat")),
    "softmax": OpSpec(*_same("softmax")),
    "argmax": OpSpec(("arg_max",), ("pd_op.argmax",)),
    "transpose": OpSpec(("transpose", "transpose2"), ("pd_op.transpose",)),
    "equal": OpSpec(*_same("equal")),
    "gather": OpSpec(*_same("gather")),
    "greater_equal": OpSpec(*_same("greater_equal")),
    "greater_than": OpSpec(*_same("greater_than")),
    "less_equal": OpSpec(*_same("less_equal")),
    "less_than": OpSpec(*_same("less_than")),
    "mean": OpSpec(*_same("mean")),
    "not_equal": OpSpec(*_same("not_equal")),
    "reshape": OpSpec(("reshape",), ("pd_op.reshape",)),
    "reshape2": OpSpec(("reshape2",), ("pd_op.reshape",)),
    "bilinear_interp": OpSpec(("bilinear_interp", "bilinear_interp_v2"), ("pd_op.bilinear_interp",)),
    "nearest_interp": OpSpec(("nearest_interp", "nearest_interp_v2"), ("pd_op.nearest_interp",)),
    "trilinear_interp": OpSpec(
        ("trilinear_interp", "trilinear_interp_v2"), ("pd_op.trilinear_interp",)
    ),
    "slice": OpSpec(*_same("slice")),
    "squeeze": OpSpec(("squeeze", "squeeze2"), ("pd_op.squeeze",)),
    "relu": OpSpec(*_same("relu")),
    "relu6": OpSpec(*_same("relu6")),
    "leaky_relu": OpSpec(*_same("leaky_relu")),
    "tanh": OpSpec(*_same("tanh")),
    "swish": OpSpec(*_same("swish")),
    "batch_norm": OpSpec(("batch_norm",), ("pd_op.batch_norm", "pd_op.batch_norm_")),
}

CONV_TYPES = ("conv2d", "depthwise_conv2d", "conv2d_transpose")


def spec(seed_type: str) -> OpSpec:
    """The :class:`OpSpec` for a seed op type; raises GraphError naming the known types."""
    from ..errors import GraphError, did_you_mean

    try:
        return OP_TABLE[seed_type]
    except KeyError:
        raise GraphError(
            f"unknown op type {seed_type!r}{did_you_mean(seed_type, OP_TABLE)}; "
            f"known types: {', '.join(sorted(OP_TABLE))}"
        ) from None


def backend_names(seed_type: str, family: str) -> tuple[str, ...]:
    """The op names ``seed_type`` has in ``family`` ('legacy' or 'pir')."""
    entry = spec(seed_type)
    return entry.legacy if family == "legacy" else entry.pir
