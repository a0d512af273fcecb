"""The op-type tables and option sets equal the seeds' values and cannot be mutated."""

from __future__ import annotations

import pytest

from qcore import constants as c
from qcore.thresholds import ALGOS, LAYERWISE_ALGOS, PTQ_ALGO_CHOICES, canonical_algo

# Written out from the seeds (section "量化训练方法的参数配置").
SEED_TENSORRT_OP_TYPES = [
    "mul",
    "conv2d",
    "pool2d",
    "depthwise_conv2d",
    "elementwise_add",
    "leaky_relu",
]
SEED_000_TRANSFORM_PASS_OP_TYPES = ["conv2d", "depthwise_conv2d", "mul", "conv2d_transpose"]
SEED_001_TRANSFORM_PASS_OP_TYPES = ["conv2d", "depthwise_conv2d", "mul"]
SEED_QUANT_DEQUANT_PASS_OP_TYPES = [
    "pool2d", "elementwise_add", "concat", "softmax", "argmax", "transpose",
    "equal", "gather", "greater_equal", "greater_than", "less_equal",
    "less_than", "mean", "not_equal", "reshape", "reshape2",
    "bilinear_interp", "nearest_interp", "trilinear_interp", "slice",
    "squeeze", "elementwise_sub", "relu", "relu6", "leaky_relu", "tanh", "swish",
]  # fmt: skip
SEED_PTQ_ALGOS = ["KL", "abs_max", "direct", "hist", "mse", "avg", "emd"]

ALL_TABLES = [
    "TENSORRT_OP_TYPES",
    "TRANSFORM_PASS_OP_TYPES",
    "QUANT_DEQUANT_PASS_OP_TYPES",
    "MATMUL_OP_TYPES",
    "SUPPORTED_QUANTIZE_OP_TYPES",
    "WEIGHT_QUANTIZE_TYPES",
    "ACTIVATION_QUANTIZE_TYPES",
    "QUANT_DTYPES",
    "PREPROCESS_TYPES",
    "QUANTIZABLE_LAYER_TYPES",
    "PTQ_ALGOS",
    "EMBEDDING_OP_TYPES",
    "EMBEDDING_QUANTIZE_TYPES",
]


def test_op_type_tables_equal_the_seeds():
    assert list(c.TENSORRT_OP_TYPES) == SEED_TENSORRT_OP_TYPES
    assert list(c.TRANSFORM_PASS_OP_TYPES) == SEED_000_TRANSFORM_PASS_OP_TYPES
    assert list(c.QUANT_DEQUANT_PASS_OP_TYPES) == SEED_QUANT_DEQUANT_PASS_OP_TYPES


def test_transform_pass_ops_follow_seed_000_which_extends_seed_001():
    assert "conv2d_transpose" in c.TRANSFORM_PASS_OP_TYPES
    assert list(c.TRANSFORM_PASS_OP_TYPES[:3]) == SEED_001_TRANSFORM_PASS_OP_TYPES


def test_option_sets_equal_the_seeds():
    assert c.WEIGHT_QUANTIZE_TYPES == (
        "abs_max",
        "channel_wise_abs_max",
        "range_abs_max",
        "moving_average_abs_max",
    )
    assert c.ACTIVATION_QUANTIZE_TYPES == ("abs_max", "range_abs_max", "moving_average_abs_max")
    assert sorted(c.PTQ_ALGOS) == sorted(SEED_PTQ_ALGOS)  # in qcore.thresholds' order, which it is read off
    assert c.EMBEDDING_OP_TYPES == ("lookup_table", "fused_embedding_seq_pool", "pyramid_hash")
    assert c.EMBEDDING_QUANTIZE_TYPES == ("abs_max", "log")
    assert c.QUANT_DTYPES == ("int8", "uint8")
    assert c.PREPROCESS_TYPES == (None, "PACT")


def test_ptq_algos_are_the_one_vocabulary_less_layerwise_algos():
    assert [a.lower() for a in c.PTQ_ALGOS] == [a for a in PTQ_ALGO_CHOICES if a not in LAYERWISE_ALGOS]
    assert {canonical_algo(a, extra=LAYERWISE_ALGOS) for a in (*c.PTQ_ALGOS, *LAYERWISE_ALGOS)} == {
        *ALGOS, *LAYERWISE_ALGOS
    }


def test_quantizable_layer_types_cover_the_dygraph_default_and_transpose_conv():
    assert {"Conv2D", "Linear", "Conv2DTranspose"} <= set(c.QUANTIZABLE_LAYER_TYPES)


def test_supported_quantize_op_types_are_both_passes_plus_matmul():
    assert c.MATMUL_OP_TYPES == ("matmul", "matmul_v2")
    assert c.SUPPORTED_QUANTIZE_OP_TYPES == (
        c.TRANSFORM_PASS_OP_TYPES + c.QUANT_DEQUANT_PASS_OP_TYPES + c.MATMUL_OP_TYPES
    )
    assert set(c.TENSORRT_OP_TYPES) <= set(c.SUPPORTED_QUANTIZE_OP_TYPES)


@pytest.mark.parametrize("name", ALL_TABLES)
def test_tables_are_immutable_tuples_without_duplicates(name):
    table = getattr(c, name)
    assert isinstance(table, tuple)
    assert len(set(table)) == len(table)
    assert name in c.__all__
