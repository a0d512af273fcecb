"""qqat's configs on random input: a QuantConfig or a one-line ConfigError, never another exception."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from qcore.config import DYGRAPH_CONFIG_KEYS, STATIC_CONFIG_KEYS
from qcore.constants import QUANTIZABLE_LAYER_TYPES, SUPPORTED_QUANTIZE_OP_TYPES
from qcore.errors import ConfigError, QuantError
from qqat.config import dygraph_config, static_config

KEYS = sorted(STATIC_CONFIG_KEYS | DYGRAPH_CONFIG_KEYS)
VALID_WORDS = [*KEYS, *SUPPORTED_QUANTIZE_OP_TYPES, *QUANTIZABLE_LAYER_TYPES, "int8", "uint8", "abs_max", "PACT"]
WORDS = st.sampled_from(VALID_WORDS) | st.text(max_size=8)
SHAPES = hnp.array_shapes(min_dims=0, max_dims=2, min_side=0, max_side=3)
LEAVES = (
    st.none() | st.booleans() | st.integers() | st.sampled_from([8, 10**400]) | st.floats() | WORDS
    | st.builds(object) | hnp.arrays(hnp.scalar_dtypes(), SHAPES)
    | hnp.arrays("U32", SHAPES, elements=st.sampled_from(VALID_WORDS))
)
VALUES = st.recursive(
    LEAVES, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(WORDS, inner, max_size=3), max_leaves=6
)
PARSERS = st.sampled_from([dygraph_config, static_config])
FUZZ = settings(max_examples=200, deadline=None)


def _config_or_quant_error(parse: Callable[[Any], Any], config: Any) -> None:
    try:
        parse(config)
    except QuantError as exc:
        assert "\n" not in str(exc), str(exc)


@FUZZ
@given(PARSERS, st.dictionaries(WORDS | st.sampled_from(KEYS), VALUES, max_size=5))
def test_random_dicts(parse, config):
    _config_or_quant_error(parse, config)


@FUZZ
@given(PARSERS, st.dictionaries(st.sampled_from(KEYS), VALUES, max_size=4) | VALUES)
def test_valid_keys_with_random_values_and_non_dicts(parse, config):
    _config_or_quant_error(parse, config)


@pytest.mark.parametrize("parse, config, message", [
    (static_config, {"quantize_op_types": "conv2d"}, "give a list of op types, e.g. ['conv2d']"),
    (static_config, {"quantize_op_types": 3}, "quantize_op_types=3 is not valid"),
    (dygraph_config, {"quantizable_layer_type": "Conv2D"}, "give a list of layer types, e.g. ['Conv2D']"),
    (dygraph_config, {"weight_bits": np.array([8, 8])}, "weight_bits=array([8, 8]) is not valid"),
    (dygraph_config, "weight_bits=8", "config must be a dict, got str"),
])
def test_bad_types_give_one_line(parse, config, message):
    with pytest.raises(ConfigError) as err:
        parse(config)
    assert message in str(err.value) and "\n" not in str(err.value)
