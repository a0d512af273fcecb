"""The quantization config: the seeds' default dicts and one validated, immutable object.

``QuantConfig.from_dict(user_dict)`` merges a PaddleSlim-style config dict with the defaults
and checks every value; a wrong key or value raises ``ConfigError`` naming the key and the
valid choices. ``validate_choice`` and ``validate_bits`` are the same checks for function
arguments elsewhere (for example the PTQ ``algo``).
"""

from __future__ import annotations

import numbers
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

from .constants import (
    ACTIVATION_QUANTIZE_TYPES,
    PREPROCESS_TYPES,
    QUANT_DEQUANT_PASS_OP_TYPES,
    QUANT_DTYPES,
    QUANTIZABLE_LAYER_TYPES,
    SUPPORTED_QUANTIZE_OP_TYPES,
    TENSORRT_OP_TYPES,
    TRANSFORM_PASS_OP_TYPES,
    WEIGHT_QUANTIZE_TYPES,
)
from .errors import ConfigError, did_you_mean

# The seeds allow 1-8 bits for quantization-aware training because the stored type is int8.
# We accept 2-16: with the symmetric scale threshold / (2**(bits-1) - 1), one bit leaves no
# non-zero level, and 9-16 bits are stored as int16 (quant_post_dynamic's weight_bits=16).
BITS_MIN, BITS_MAX = 2, 16


class _ReadOnlyDefaults(Mapping):
    """A read-only dict view. List values are handed out as new lists, so the view equals
    the seed dict (``==``) but no caller can change the defaults another caller sees."""

    def __init__(self, data: Mapping[str, Any]) -> None:
        self._data = {k: tuple(v) if isinstance(v, list) else v for k, v in data.items()}

    def __getitem__(self, key: str) -> Any:
        value = self._data[key]
        return list(value) if isinstance(value, tuple) else value

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __repr__(self) -> str:
        return repr(dict(self))


# quant_aware / convert (static graph): the seeds' `_quant_config_default`.
QUANT_CONFIG_DEFAULT: Mapping[str, Any] = _ReadOnlyDefaults({
    "weight_quantize_type": "channel_wise_abs_max",
    "activation_quantize_type": "moving_average_abs_max",
    "weight_bits": 8,
    "activation_bits": 8,
    "not_quant_pattern": ["skip_quant"],  # ops whose name_scope contains one are skipped
    "quantize_op_types": ["conv2d", "depthwise_conv2d", "mul"],
    "dtype": "int8",
    "window_size": 10000,  # for 'range_abs_max'
    "moving_rate": 0.9,  # for 'moving_average_abs_max'
    "for_tensorrt": False,  # if True, the quantized op types are TENSORRT_OP_TYPES
    "is_full_quantize": False,  # if True, TRANSFORM_PASS_OP_TYPES + QUANT_DEQUANT_PASS_OP_TYPES
})  # fmt: skip
_quant_config_default = QUANT_CONFIG_DEFAULT  # the seeds' name

# Dygraph QAT: the quant_config of the seeds' dygraph QAT page.
DYGRAPH_CONFIG_DEFAULT: Mapping[str, Any] = _ReadOnlyDefaults({
    "weight_preprocess_type": None,  # None or 'PACT'
    "activation_preprocess_type": None,  # None or 'PACT'
    "weight_quantize_type": "channel_wise_abs_max",
    "activation_quantize_type": "moving_average_abs_max",
    "weight_bits": 8,
    "activation_bits": 8,
    "dtype": "int8",
    "window_size": 10000,
    "moving_rate": 0.9,
    "quantizable_layer_type": ["Conv2D", "Linear"],
})  # fmt: skip

# For QuantConfig.from_dict(..., allowed=...): the keys each API documents.
STATIC_CONFIG_KEYS: frozenset[str] = frozenset(QUANT_CONFIG_DEFAULT)
DYGRAPH_CONFIG_KEYS: frozenset[str] = frozenset(DYGRAPH_CONFIG_DEFAULT)


def _choices_text(choices: Iterable[Any]) -> str:
    return ", ".join(repr(c) for c in choices)


def short_repr(value: Any, limit: int = 120) -> str:
    """``repr(value)`` on one line, cut to ``limit`` characters (for one-line error messages)."""
    text = re.sub(r"\s*\n\s*", " ", repr(value))
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _is_choice(value: Any, choice: Any) -> bool:
    """``value == choice`` without surprises: arrays and containers never match, bools only bools."""
    if value is choice:
        return True
    if isinstance(value, bool) or isinstance(choice, bool) or not isinstance(value, (str, numbers.Number)):
        return False
    return bool(value == choice)


def validate_choice(name: str, value: Any, choices: Sequence[Any]) -> Any:
    """Return the choice equal to ``value``; else raise ConfigError naming ``name``, the closest
    choice (case-insensitive match first) and all valid choices."""
    for choice in choices:
        if _is_choice(value, choice):
            return choice
    hint = ""
    if isinstance(value, str):
        names = [c for c in choices if isinstance(c, str)]
        same_letters = [c for c in names if c.lower() == value.lower()]
        hint = (
            f" (did you mean {same_letters[0]!r}?)" if same_letters else did_you_mean(value, names)
        )
    raise ConfigError(
        f"{name}={short_repr(value)} is not valid{hint}; valid choices: {_choices_text(choices)}"
    )


ROUND_TYPES = ("round", "adaround")


def check_paddleslim_keywords(onnx_format: bool | None, round_type: str) -> None:
    """Accept PaddleSlim 2.6's ``onnx_format`` and ``round_type`` where they describe what we do.

    Every model written here is in the QDQ ("ONNX") format, so ``onnx_format`` may be None or
    True; ``round_type`` is ``"round"`` or ``"adaround"`` (learned weight rounding, ``qptq.adaround``).
    """
    if onnx_format is not None and onnx_format is not True:
        raise ConfigError(
            f"onnx_format={onnx_format!r} is not supported: this toolkit writes only the QDQ format "
            "(quantize_linear/dequantize_linear, what onnx_format=True writes); drop the argument or pass True"
        )
    validate_choice("round_type", round_type, ROUND_TYPES)


def effective_op_types(
    op_types: Sequence[str], is_full_quantize: bool, for_tensorrt: bool = False
) -> tuple[str, ...]:
    """The op types that get quantized: TENSORRT_OP_TYPES if ``for_tensorrt``, else all of
    TRANSFORM_PASS_OP_TYPES + QUANT_DEQUANT_PASS_OP_TYPES if ``is_full_quantize``, else
    ``op_types`` (the seeds' order of precedence)."""
    if for_tensorrt:
        return TENSORRT_OP_TYPES
    if is_full_quantize:
        return TRANSFORM_PASS_OP_TYPES + QUANT_DEQUANT_PASS_OP_TYPES
    return tuple(op_types)


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def validate_bits(name: str, value: Any, lo: int = BITS_MIN, hi: int = BITS_MAX) -> int:
    """Return ``value`` as int if it is an integer (not a bool) in ``lo..hi``, else raise."""
    if _is_int(value) and lo <= value <= hi:
        return int(value)
    raise ConfigError(f"{name}={short_repr(value)} is not valid; valid choices: an int from {lo} to {hi}")


def _bool(name: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    raise ConfigError(f"{name}={short_repr(value)} is not valid; valid choices: True, False")


def validate_positive_int(name: str, value: Any) -> int:
    """Return ``value`` as int if it is an integer (not a bool) greater than 0, else raise."""
    if _is_int(value) and value > 0:
        return int(value)
    raise ConfigError(f"{name}={short_repr(value)} is not valid; valid choices: an int greater than 0")


def _rate(name: str, value: Any) -> float:
    if isinstance(value, numbers.Real) and not isinstance(value, bool) and 0 < value < 1:
        return float(value)
    raise ConfigError(
        f"{name}={short_repr(value)} is not valid; valid choices: a number strictly between 0 and 1"
    )


def validate_names(
    name: str,
    value: Any,
    choices: Sequence[str] | None = None,
    *,
    allow_str: bool = False,
    allow_empty: bool = False,
    noun: str = "names",
) -> tuple[str, ...]:
    """A list (or tuple) of non-empty str, each in ``choices`` when given; duplicates dropped.

    A lone str is one name when ``allow_str``, else refused (it would be read letter by letter).
    """
    if isinstance(value, str):
        if not allow_str:
            example = value if choices is None or value in choices else choices[0]
            raise ConfigError(f"{name}={short_repr(value)} is a single str; give a list of {noun}, e.g. [{example!r}]")
        value = [value]
    ok = isinstance(value, (list, tuple)) and (allow_empty or len(value) > 0)
    if not ok or not all(isinstance(v, str) and v for v in value):
        expected = "a str or a list of str" if allow_str else "a list of str"
        what = "non-empty str" if allow_empty else "at least one non-empty str"
        raise ConfigError(f"{name}={short_repr(value)} is not valid; valid choices: {expected} ({what})")
    if choices is not None:
        value = [validate_choice(f"{name}[{i}]", item, choices) for i, item in enumerate(value)]
    return tuple(dict.fromkeys(value))


# key -> function(key, value) returning the normalised value or raising ConfigError.
_VALIDATORS: dict[str, Callable[[str, Any], Any]] = {
    "weight_quantize_type": lambda k, v: validate_choice(k, v, WEIGHT_QUANTIZE_TYPES),
    "activation_quantize_type": lambda k, v: validate_choice(k, v, ACTIVATION_QUANTIZE_TYPES),
    "weight_bits": validate_bits,
    "activation_bits": validate_bits,
    "not_quant_pattern": lambda k, v: validate_names(k, v, allow_str=True, allow_empty=True),
    "quantize_op_types": lambda k, v: validate_names(k, v, SUPPORTED_QUANTIZE_OP_TYPES, noun="op types"),
    "dtype": lambda k, v: validate_choice(k, v, QUANT_DTYPES),
    "window_size": validate_positive_int,
    "moving_rate": _rate,
    "for_tensorrt": _bool,
    "is_full_quantize": _bool,
    "weight_preprocess_type": lambda k, v: validate_choice(k, v, PREPROCESS_TYPES),
    "activation_preprocess_type": lambda k, v: validate_choice(k, v, PREPROCESS_TYPES),
    "quantizable_layer_type": lambda k, v: validate_names(k, v, QUANTIZABLE_LAYER_TYPES, noun="layer types"),
}

_S, _D = QUANT_CONFIG_DEFAULT, DYGRAPH_CONFIG_DEFAULT


@dataclass(frozen=True)
class QuantConfig:
    """One field per config key; list values are stored as tuples.

    Every construction (``QuantConfig(...)``, ``from_dict``, ``dataclasses.replace``) is
    validated. Build it from a seed-style dict with ``from_dict``; ``to_dict`` gives one back.
    """

    weight_quantize_type: str = _S["weight_quantize_type"]
    activation_quantize_type: str = _S["activation_quantize_type"]
    weight_bits: int = _S["weight_bits"]
    activation_bits: int = _S["activation_bits"]
    not_quant_pattern: tuple[str, ...] = tuple(_S["not_quant_pattern"])
    quantize_op_types: tuple[str, ...] = tuple(_S["quantize_op_types"])
    dtype: str = _S["dtype"]
    window_size: int = _S["window_size"]
    moving_rate: float = _S["moving_rate"]
    for_tensorrt: bool = _S["for_tensorrt"]
    is_full_quantize: bool = _S["is_full_quantize"]
    # dygraph QAT only
    weight_preprocess_type: str | None = _D["weight_preprocess_type"]
    activation_preprocess_type: str | None = _D["activation_preprocess_type"]
    quantizable_layer_type: tuple[str, ...] = tuple(_D["quantizable_layer_type"])

    def __post_init__(self) -> None:
        for f in fields(self):
            object.__setattr__(self, f.name, _VALIDATORS[f.name](f.name, getattr(self, f.name)))

    @classmethod
    def from_dict(
        cls, d: Mapping[str, Any] | None = None, *, allowed: Iterable[str] | None = None
    ) -> QuantConfig:
        """Merge ``d`` with the defaults and validate. ``allowed`` restricts the accepted keys
        (e.g. ``DYGRAPH_CONFIG_KEYS``); keys outside it raise ConfigError like unknown keys."""
        d = {} if d is None else d
        if not isinstance(d, Mapping):
            raise ConfigError(f"config must be a dict, got {type(d).__name__}: {short_repr(d)}")
        known = [f.name for f in fields(cls)]
        valid = known
        if allowed is not None:
            allowed = set(allowed)
            if allowed - set(known):
                raise ConfigError(
                    f"allowed= names unknown config keys {sorted(allowed - set(known))}"
                )
            valid = [k for k in known if k in allowed]
        for key in d:
            if key not in valid:
                what = (
                    f"config key {short_repr(key)} is not accepted here"
                    if key in known
                    else f"unknown config key {short_repr(key)}"
                )
                raise ConfigError(
                    f"{what}{did_you_mean(str(key), valid)}; valid keys: {', '.join(valid)}"
                )
        return cls(**d)

    def to_dict(self) -> dict[str, Any]:
        """A new seed-style dict of every key (tuples become lists); ``from_dict`` reads it back."""
        return {f.name: _listify(getattr(self, f.name)) for f in fields(self)}

    @property
    def effective_op_types(self) -> tuple[str, ...]:
        """The op types that get quantized (:func:`effective_op_types`)."""
        return effective_op_types(self.quantize_op_types, self.is_full_quantize, self.for_tensorrt)


def _listify(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


__all__ = [
    "BITS_MAX",
    "BITS_MIN",
    "DYGRAPH_CONFIG_DEFAULT",
    "DYGRAPH_CONFIG_KEYS",
    "QUANT_CONFIG_DEFAULT",
    "STATIC_CONFIG_KEYS",
    "QuantConfig",
    "_quant_config_default",
    "effective_op_types",
    "short_repr",
    "validate_bits",
    "validate_choice",
    "validate_names",
]
