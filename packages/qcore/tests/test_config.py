"""QuantConfig: seed defaults, validation of every key, effective op types, round trip."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from qcore.config import (
    DYGRAPH_CONFIG_DEFAULT,
    DYGRAPH_CONFIG_KEYS,
    QUANT_CONFIG_DEFAULT,
    STATIC_CONFIG_KEYS,
    QuantConfig,
    _quant_config_default,
    validate_bits,
    validate_choice,
)
from qcore.constants import (
    QUANT_DEQUANT_PASS_OP_TYPES,
    TENSORRT_OP_TYPES,
    TRANSFORM_PASS_OP_TYPES,
)
from qcore.errors import ConfigError

# The seeds' `_quant_config_default`, written out.
SEED_QUANT_CONFIG_DEFAULT = {
    "weight_quantize_type": "channel_wise_abs_max",
    "activation_quantize_type": "moving_average_abs_max",
    "weight_bits": 8,
    "activation_bits": 8,
    "not_quant_pattern": ["skip_quant"],
    "quantize_op_types": ["conv2d", "depthwise_conv2d", "mul"],
    "dtype": "int8",
    "window_size": 10000,
    "moving_rate": 0.9,
    "for_tensorrt": False,
    "is_full_quantize": False,
}

# The seeds' dygraph QAT quant_config, written out.
SEED_DYGRAPH_CONFIG = {
    "weight_preprocess_type": None,
    "activation_preprocess_type": None,
    "weight_quantize_type": "channel_wise_abs_max",
    "activation_quantize_type": "moving_average_abs_max",
    "weight_bits": 8,
    "activation_bits": 8,
    "dtype": "int8",
    "window_size": 10000,
    "moving_rate": 0.9,
    "quantizable_layer_type": ["Conv2D", "Linear"],
}

ALL_KEYS = set(SEED_QUANT_CONFIG_DEFAULT) | set(SEED_DYGRAPH_CONFIG)


# --- defaults ---------------------------------------------------------------------------


def test_static_default_equals_the_seed_dict_literally():
    assert QUANT_CONFIG_DEFAULT == SEED_QUANT_CONFIG_DEFAULT
    assert dict(QUANT_CONFIG_DEFAULT) == SEED_QUANT_CONFIG_DEFAULT
    assert list(QUANT_CONFIG_DEFAULT) == list(SEED_QUANT_CONFIG_DEFAULT)  # same order
    assert {k: type(v) for k, v in QUANT_CONFIG_DEFAULT.items()} == {
        k: type(v) for k, v in SEED_QUANT_CONFIG_DEFAULT.items()
    }
    assert _quant_config_default is QUANT_CONFIG_DEFAULT


def test_dygraph_default_equals_the_seed_dict_literally():
    assert dict(DYGRAPH_CONFIG_DEFAULT) == SEED_DYGRAPH_CONFIG
    assert list(DYGRAPH_CONFIG_DEFAULT) == list(SEED_DYGRAPH_CONFIG)
    assert STATIC_CONFIG_KEYS == set(SEED_QUANT_CONFIG_DEFAULT)
    assert DYGRAPH_CONFIG_KEYS == set(SEED_DYGRAPH_CONFIG)


def test_default_dicts_cannot_be_changed_by_callers():
    with pytest.raises(TypeError):
        QUANT_CONFIG_DEFAULT["weight_bits"] = 4  # type: ignore[index]
    QUANT_CONFIG_DEFAULT["quantize_op_types"].append("relu")
    DYGRAPH_CONFIG_DEFAULT["quantizable_layer_type"].append("Conv2DTranspose")
    assert QUANT_CONFIG_DEFAULT["quantize_op_types"] == ["conv2d", "depthwise_conv2d", "mul"]
    assert DYGRAPH_CONFIG_DEFAULT["quantizable_layer_type"] == ["Conv2D", "Linear"]


def test_quant_config_defaults_are_the_seed_values():
    assert QuantConfig().to_dict() == {**SEED_QUANT_CONFIG_DEFAULT, **SEED_DYGRAPH_CONFIG}
    assert QuantConfig.from_dict(None) == QuantConfig()
    assert QuantConfig.from_dict({}) == QuantConfig()
    assert {f.name for f in dataclasses.fields(QuantConfig)} == ALL_KEYS


def test_from_dict_merges_with_defaults_and_normalises():
    cfg = QuantConfig.from_dict(
        {
            "weight_bits": np.int64(4),
            "not_quant_pattern": "head",
            "quantize_op_types": ["conv2d", "matmul_v2", "conv2d"],
            "moving_rate": 0.5,
        }
    )
    assert cfg.weight_bits == 4 and type(cfg.weight_bits) is int
    assert cfg.not_quant_pattern == ("head",)
    assert cfg.quantize_op_types == ("conv2d", "matmul_v2")
    assert cfg.activation_quantize_type == "moving_average_abs_max"  # untouched default
    assert QuantConfig.from_dict({"not_quant_pattern": ["a", "b"]}).not_quant_pattern == ("a", "b")
    assert QuantConfig.from_dict({"not_quant_pattern": []}).not_quant_pattern == ()
    assert (
        QuantConfig.from_dict({"weight_preprocess_type": "PACT"}).weight_preprocess_type == "PACT"
    )


def test_config_is_frozen():
    cfg = QuantConfig()
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.weight_bits = 4  # type: ignore[misc]


# --- validation -------------------------------------------------------------------------

# key -> (bad value, words every error message must contain besides the key)
WEIGHT_TYPES = [
    "'abs_max'",
    "'channel_wise_abs_max'",
    "'range_abs_max'",
    "'moving_average_abs_max'",
]
ACT_TYPES = ["'abs_max'", "'range_abs_max'", "'moving_average_abs_max'"]
BAD_VALUES = {
    "weight_quantize_type": ("chanel_wise_abs_max", [*WEIGHT_TYPES, "did you mean"]),
    "activation_quantize_type": ("channel_wise_abs_max", ACT_TYPES),
    "weight_bits": (1, ["2", "16"]),
    "activation_bits": (17, ["2", "16"]),
    "not_quant_pattern": (["skip", 3], ["list of str"]),
    "quantize_op_types": (
        ["conv2d", "conv2D"],
        ["did you mean 'conv2d'", "'matmul_v2'", "'swish'"],
    ),
    "dtype": ("int4", ["'int8'", "'uint8'"]),
    "window_size": (0, ["greater than 0"]),
    "moving_rate": (1.0, ["between 0 and 1"]),
    "for_tensorrt": ("yes", ["True, False"]),
    "is_full_quantize": (1, ["True, False"]),
    "weight_preprocess_type": ("pact", ["None", "'PACT'", "did you mean 'PACT'"]),
    "activation_preprocess_type": ("LSQ", ["None", "'PACT'"]),
    "quantizable_layer_type": (
        ["Conv2D", "Linaer"],
        ["did you mean 'Linear'", "'Conv2DTranspose'"],
    ),
}


def test_every_key_has_a_bad_value_case():
    assert set(BAD_VALUES) == ALL_KEYS


@pytest.mark.parametrize("key", sorted(BAD_VALUES))
def test_bad_value_names_the_key_and_the_valid_choices(key):
    bad, words = BAD_VALUES[key]
    with pytest.raises(ConfigError) as err:
        QuantConfig.from_dict({key: bad})
    msg = str(err.value)
    assert key in msg and "valid choices" in msg
    for word in words:
        assert word in msg


@pytest.mark.parametrize(
    "key, bad",
    [
        ("weight_bits", 8.0),
        ("weight_bits", True),
        ("activation_bits", "8"),
        ("window_size", -5),
        ("window_size", 1.5),
        ("window_size", True),
        ("moving_rate", 0),
        ("moving_rate", float("nan")),
        ("moving_rate", True),
        ("not_quant_pattern", ""),
        ("not_quant_pattern", [""]),
        ("not_quant_pattern", None),
        ("quantize_op_types", []),
        ("quantize_op_types", "conv2d"),
        ("quantize_op_types", ["lookup_table"]),
        ("quantizable_layer_type", []),
        ("for_tensorrt", None),
        ("is_full_quantize", np.bool_(True)),
        ("dtype", None),
    ],
)
def test_more_bad_values_are_rejected(key, bad):
    with pytest.raises(ConfigError, match=key):
        QuantConfig.from_dict({key: bad})


def test_direct_construction_and_replace_are_validated():
    with pytest.raises(ConfigError, match="weight_bits"):
        QuantConfig(weight_bits=99)
    with pytest.raises(ConfigError, match="dtype"):
        dataclasses.replace(QuantConfig(), dtype="fp16")


def test_unknown_key_suggests_the_closest_and_lists_valid_keys():
    with pytest.raises(ConfigError) as err:
        QuantConfig.from_dict({"weigth_bits": 8})
    msg = str(err.value)
    assert "unknown config key 'weigth_bits' (did you mean 'weight_bits'?)" in msg
    assert "valid keys:" in msg
    for key in ALL_KEYS:
        assert key in msg


def test_unknown_key_without_close_match_still_lists_valid_keys():
    with pytest.raises(ConfigError) as err:
        QuantConfig.from_dict({"zzz": 1})
    msg = str(err.value)
    assert "unknown config key 'zzz'" in msg and "did you mean" not in msg
    assert "weight_quantize_type" in msg


def test_allowed_restricts_the_keys():
    cfg = QuantConfig.from_dict({"weight_preprocess_type": "PACT"}, allowed=DYGRAPH_CONFIG_KEYS)
    assert cfg.weight_preprocess_type == "PACT"
    with pytest.raises(ConfigError) as err:
        QuantConfig.from_dict({"for_tensorrt": True}, allowed=DYGRAPH_CONFIG_KEYS)
    msg = str(err.value)
    assert "'for_tensorrt' is not accepted here" in msg
    assert "quantizable_layer_type" in msg and "not_quant_pattern" not in msg
    with pytest.raises(ConfigError, match="weight_preprocess_type"):
        QuantConfig.from_dict({"weight_preprocess_type": "PACT"}, allowed=STATIC_CONFIG_KEYS)
    with pytest.raises(ConfigError, match="unknown config keys"):
        QuantConfig.from_dict({}, allowed={"weight_bits", "nonsense"})


def test_config_must_be_a_dict():
    with pytest.raises(ConfigError, match="must be a dict"):
        QuantConfig.from_dict([("weight_bits", 8)])  # type: ignore[arg-type]


# --- effective op types -----------------------------------------------------------------


def test_effective_op_types_default_to_quantize_op_types():
    assert QuantConfig().effective_op_types == ("conv2d", "depthwise_conv2d", "mul")
    cfg = QuantConfig.from_dict({"quantize_op_types": ["matmul_v2", "relu"]})
    assert cfg.effective_op_types == ("matmul_v2", "relu")


def test_effective_op_types_for_full_quantize():
    cfg = QuantConfig.from_dict({"is_full_quantize": True, "quantize_op_types": ["relu"]})
    assert cfg.effective_op_types == TRANSFORM_PASS_OP_TYPES + QUANT_DEQUANT_PASS_OP_TYPES


def test_effective_op_types_for_tensorrt_win_over_full_quantize():
    cfg = QuantConfig.from_dict({"for_tensorrt": True})
    assert cfg.effective_op_types == TENSORRT_OP_TYPES
    both = QuantConfig.from_dict({"for_tensorrt": True, "is_full_quantize": True})
    assert both.effective_op_types == TENSORRT_OP_TYPES


# --- round trip -------------------------------------------------------------------------


def test_round_trip_through_a_seed_style_dict():
    cfg = QuantConfig.from_dict(
        {
            "weight_quantize_type": "abs_max",
            "activation_quantize_type": "range_abs_max",
            "weight_bits": 4,
            "activation_bits": 16,
            "not_quant_pattern": ["a", "b"],
            "quantize_op_types": ["conv2d", "matmul"],
            "dtype": "uint8",
            "window_size": 7,
            "moving_rate": 0.25,
            "for_tensorrt": True,
            "is_full_quantize": True,
            "weight_preprocess_type": "PACT",
            "activation_preprocess_type": "PACT",
            "quantizable_layer_type": ["Linear"],
        }
    )
    d = cfg.to_dict()
    assert d["not_quant_pattern"] == ["a", "b"] and isinstance(d["quantize_op_types"], list)
    assert QuantConfig.from_dict(d) == cfg
    assert QuantConfig.from_dict(d).to_dict() == d
    d["quantize_op_types"].append("relu")  # a copy: the config is unchanged
    assert cfg.quantize_op_types == ("conv2d", "matmul")


# --- reusable validators ----------------------------------------------------------------


def test_validate_choice():
    assert validate_choice("algo", "KL", ("KL", "abs_max")) == "KL"
    with pytest.raises(ConfigError) as err:
        validate_choice("algo", "kl", ("KL", "abs_max"))
    assert (
        str(err.value)
        == "algo='kl' is not valid (did you mean 'KL'?); valid choices: 'KL', 'abs_max'"
    )
    with pytest.raises(ConfigError, match="did you mean 'abs_max'"):
        validate_choice("algo", "absmax", ("KL", "abs_max"))


def test_validate_bits():
    assert validate_bits("quantize_bits", 8, 8, 8) == 8
    assert validate_bits("weight_bits", 16) == 16
    assert validate_bits("weight_bits", 2) == 2
    with pytest.raises(
        ConfigError, match="quantize_bits=4 is not valid; valid choices: an int from 8 to 8"
    ):
        validate_bits("quantize_bits", 4, 8, 8)
    with pytest.raises(ConfigError, match="weight_bits"):
        validate_bits("weight_bits", False)
