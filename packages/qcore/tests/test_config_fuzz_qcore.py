"""QuantConfig on random input: a config or a one-line ConfigError, never another exception."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from qcore.config import (
    DYGRAPH_CONFIG_KEYS,
    STATIC_CONFIG_KEYS,
    QuantConfig,
    validate_choice,
)
from qcore.constants import QUANT_DTYPES, QUANTIZABLE_LAYER_TYPES, SUPPORTED_QUANTIZE_OP_TYPES, WEIGHT_QUANTIZE_TYPES
from qcore.errors import ConfigError, QuantError

KEYS = sorted(STATIC_CONFIG_KEYS | DYGRAPH_CONFIG_KEYS)
VALID_WORDS = [
    *KEYS, *SUPPORTED_QUANTIZE_OP_TYPES, *WEIGHT_QUANTIZE_TYPES, *QUANT_DTYPES, *QUANTIZABLE_LAYER_TYPES, "PACT",
]
WORDS = st.sampled_from(VALID_WORDS) | st.text(max_size=8)
SHAPES = hnp.array_shapes(min_dims=0, max_dims=2, min_side=0, max_side=3)
ARRAYS = hnp.arrays(hnp.scalar_dtypes(), SHAPES) | hnp.arrays("U32", SHAPES, elements=st.sampled_from(VALID_WORDS))
LEAVES = (
    st.none() | st.booleans() | st.integers() | st.sampled_from([2, 8, 16, 10**400, -(10**400)]) | st.floats()
    | WORDS | st.binary(max_size=4) | st.complex_numbers() | st.builds(object) | ARRAYS
)
VALUES = st.recursive(
    LEAVES, lambda inner: st.lists(inner, max_size=3) | st.tuples(inner) | st.dictionaries(WORDS, inner, max_size=3),
    max_leaves=6,
)
FUZZ = settings(max_examples=200, deadline=None)


def _config_or_quant_error(parse: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
    try:
        parse(*args, **kwargs)
    except QuantError as exc:
        assert "\n" not in str(exc), str(exc)


@FUZZ
@given(st.dictionaries(WORDS | st.integers(), VALUES, max_size=5),
       st.sampled_from([None, STATIC_CONFIG_KEYS, DYGRAPH_CONFIG_KEYS]))
def test_from_dict_on_random_dicts(config, allowed):
    _config_or_quant_error(QuantConfig.from_dict, config, allowed=allowed)


@FUZZ
@given(st.dictionaries(st.sampled_from(KEYS), VALUES, max_size=4))
def test_every_key_with_random_values(config):
    _config_or_quant_error(QuantConfig.from_dict, config)
    _config_or_quant_error(QuantConfig, **config)


@FUZZ
@given(VALUES)
def test_from_dict_on_random_non_dicts(config):
    _config_or_quant_error(QuantConfig.from_dict, config)


@pytest.mark.parametrize("key, value, message", [
    ("quantize_op_types", "conv2d", "quantize_op_types='conv2d' is a single str; give a list of op types, "
                                    "e.g. ['conv2d']"),
    ("quantize_op_types", "nonsense", "e.g. ['conv2d']"),
    ("quantizable_layer_type", "Linear", "give a list of layer types, e.g. ['Linear']"),
    ("quantize_op_types", 5, "quantize_op_types=5 is not valid; valid choices: a list of str"),
    ("quantize_op_types", np.array(["conv2d"]), "valid choices: a list of str"),
    ("dtype", np.array(["int8", "uint8"]), "dtype=array(['int8', 'uint8'], dtype='<U5') is not valid"),
    ("dtype", np.zeros((4, 4)), "dtype=array([[0., 0., 0., 0.], [0., 0., 0., 0.],"),
    ("weight_preprocess_type", np.array([]), "weight_preprocess_type=array([], dtype=float64)"),
    ("weight_bits", np.array(8), "weight_bits=array(8)"),
    ("not_quant_pattern", {"skip": 1}, "not_quant_pattern={'skip': 1} is not valid"),
])
def test_bad_types_give_one_line_naming_key_value_and_fix(key, value, message):
    with pytest.raises(ConfigError) as err:
        QuantConfig.from_dict({key: value})
    assert message in str(err.value) and "\n" not in str(err.value)


def test_choices_match_by_value_and_kind():
    assert type(validate_choice("algo", np.str_("KL"), ("KL", "abs_max"))) is str
    assert validate_choice("per_row", True, (False, True, "auto")) is True
    for bad in (1, 0.0, np.bool_(True), np.array([True]), [True]):
        with pytest.raises(ConfigError, match="per_row="):
            validate_choice("per_row", bad, (False, True, "auto"))
    assert QuantConfig.from_dict({"quantize_op_types": [np.str_("mul")]}).quantize_op_types == ("mul",)
