"""EmbeddingConfig on random input: a config or a one-line ConfigError, never another exception."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from qcore.constants import EMBEDDING_OP_TYPES, EMBEDDING_QUANTIZE_TYPES
from qcore.errors import ConfigError, QuantError
from qembed.config import TABLE_KEYS, TOP_KEYS, EmbeddingConfig

KEYS = [*TOP_KEYS, *TABLE_KEYS, *EMBEDDING_OP_TYPES]
VALID_WORDS = [*KEYS, *EMBEDDING_QUANTIZE_TYPES, "int8", "auto", "emb"]
WORDS = st.sampled_from(VALID_WORDS) | st.text(max_size=8)
SHAPES = hnp.array_shapes(min_dims=0, max_dims=2, min_side=0, max_side=3)
LEAVES = (
    st.none() | st.booleans() | st.integers() | st.sampled_from([2, 8, 10**400]) | st.floats() | WORDS
    | st.builds(object) | st.complex_numbers() | hnp.arrays(hnp.scalar_dtypes(), SHAPES)
    | hnp.arrays("U32", SHAPES, elements=st.sampled_from(VALID_WORDS))
)
VALUES = st.recursive(
    LEAVES, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(WORDS, inner, max_size=3), max_leaves=6
)
TABLES = st.dictionaries(st.sampled_from(TABLE_KEYS), VALUES, max_size=3)
CONFIGS = st.dictionaries(st.sampled_from(KEYS), VALUES | TABLES, max_size=5)
FUZZ = settings(max_examples=200, deadline=None)


def _config_or_quant_error(config: Any) -> None:
    try:
        EmbeddingConfig.from_dict(config)
    except QuantError as exc:
        assert "\n" not in str(exc), str(exc)


@FUZZ
@given(CONFIGS)
def test_valid_keys_with_random_values(config):
    _config_or_quant_error(config)


@FUZZ
@given(st.dictionaries(WORDS | st.integers(), VALUES, max_size=4) | VALUES)
def test_random_dicts_and_non_dicts(config):
    _config_or_quant_error(config)


@pytest.mark.parametrize("config, message", [
    ({"quantize_op_types": 5}, "quantize_op_types=5 is not valid; valid choices: a str or a list of str"),
    ({"quantize_op_types": np.array(["lookup_table"])}, "quantize_op_types=array(['lookup_table']"),
    ({"quantize_op_types": []}, "at least one non-empty str"),
    ({"params_name": 5}, "params_name=5 is not valid"),
    ({"params_name": ["emb", 1]}, "params_name=['emb', 1] is not valid"),
    ({"params_name": np.array(["emb", "b"])}, "params_name=array(['emb', 'b'], dtype='<U3') is not valid"),
    ({"per_row": 1}, "per_row=1 is not valid"),
    ({"per_row": np.array([True, False])}, "per_row=array([ True, False]) is not valid"),
    ({"threshold": 10**400}, "threshold=1000"),
    ({"threshold": float("inf")}, "threshold=inf is not valid; valid choices: None or a finite number > 0"),
    ({"threshold": "0.5"}, "threshold='0.5'"),
    (["quantize_op_types"], "the quant_embedding config must be a dict, got list"),
    ({"scale_dtype": "fp16"}, "scale_dtype='fp16' is not valid; valid choices: 'float32', 'float16'"),
])
def test_bad_values_give_one_line_naming_key_value_and_fix(config, message):
    with pytest.raises(ConfigError) as err:
        EmbeddingConfig.from_dict(config)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_values_are_normalised():
    cfg = EmbeddingConfig.from_dict({"quantize_op_types": "lookup_table", "params_name": "emb",
                                     "threshold": np.float32(0.5), "quantize_bits": np.int64(4)})
    table = cfg.tables["lookup_table"]
    assert cfg.op_types == ("lookup_table",) and cfg.params_names == ("emb",)
    assert type(table.threshold) is float and type(table.quantize_bits) is int and table.threshold == 0.5
    assert table.scale_dtype == "float32"  # the default: today's format
    half = EmbeddingConfig.from_dict({"lookup_table": {"scale_dtype": "float16"}}).tables["lookup_table"]
    assert half.scale_dtype == "float16"
