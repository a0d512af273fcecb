"""The ``quant_embedding`` config: the seeds' two dict forms, validated into one object.

Newer form (per op type)::

    {"quantize_op_types": ["lookup_table"], "lookup_table": {"quantize_type": "log", "quantize_bits": 8}}

Older form (flat keys, one table named by ``params_name``)::

    {"params_name": "emb", "quantize_type": "abs_max", "threshold": 0.5}

Flat per-table keys also act as defaults for every op type, so both forms mix. ``per_row``
(False, True or "auto") is ours, not the seeds'; it defaults to False, the seeds' whole-table scale.
``scale_dtype`` ("float32" or "float16", ours) is how per-row scales and offsets are stored.
``bytes_budget`` (ours, a fraction of the float32 table's bytes) stores the rows read most often in the calibration
ids passed to ``quant_embedding`` at ``mixed_bits[0]`` bits and the others at ``mixed_bits[1]`` (:mod:`qembed.mixed`);
the tables of one call pool their budgets.
``fused_lookup`` (False, True or "auto") is ours too: read the tables with the compiled ``qembed_lookup``
op (:mod:`qembed.ext`) instead of the op sequence; the default "auto" does where the op loads (the Linux x86-64
wheel ships it; elsewhere ``python -m qembed.build_ext`` builds it); PaddleSlim (no such op) behaves as False.
``weights`` (ours) also stores the model's other weights weight-only (``{"weights": {"weight_bits": 8}}``:
every fc / matmul / conv / gru weight as int8 per output channel, ``quant_post_dynamic``'s keys and meaning) in
the same call.
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Union

import numpy as np

from qcore.config import short_repr, validate_bits, validate_choice, validate_names
from qcore.constants import EMBEDDING_OP_TYPES, EMBEDDING_QUANTIZE_TYPES, WEIGHT_ONLY_OP_TYPES
from qcore.errors import ConfigError, did_you_mean

from .mixed import MIXED_BITS, check_bytes_budget, check_mixed_bits
from .table import DEFAULT_MAX_ERROR, SCALE_DTYPES

PerRow = Union[bool, str]  # True, False or "auto"
TABLE_KEYS = ("quantize_type", "quantize_bits", "dtype", "threshold", "per_row", "asymmetric", "max_error",
              "scale_dtype", "bytes_budget", "mixed_bits")
TOP_KEYS = ("quantize_op_types", "params_name", "fused_lookup", "weights")
WEIGHTS_KEYS = ("quantizable_op_type", "weight_bits")  # quant_post_dynamic's names
WEIGHT_BITS = (8, 16)
BITS_RANGE = (2, 8)  # codes are stored as int8 whatever the bit width
DTYPES = ("int8",)
PER_ROW_CHOICES = (False, True, "auto")
ASYMMETRIC_CHOICES = (False, True, "auto")
FUSED_CHOICES = (False, True, "auto")
THRESHOLD_MAX = float(np.finfo(np.float32).max)  # tables are float32


@dataclass(frozen=True)
class TableConfig:
    """How the tables of one op type are quantized."""

    quantize_type: str = "abs_max"
    quantize_bits: int | str = 8  # or "auto": the smallest of 2, 4, 8 within max_error
    dtype: str = "int8"
    threshold: float | None = None
    per_row: PerRow = False
    asymmetric: bool | str = "auto"  # per-row offsets for <= 4-bit rows: where they help ("auto")
    max_error: float = DEFAULT_MAX_ERROR  # quantize_bits="auto"'s budget (relative RMS error of the table)
    scale_dtype: str = "float32"  # per-row scales and offsets: "float16" halves their bytes (one scale stays float32)
    bytes_budget: float | None = None  # mixed precision (qembed.mixed): stored bytes as a fraction of float32's
    mixed_bits: tuple[int, int] = MIXED_BITS  # (hot, cold) widths under bytes_budget

    @classmethod
    def from_dict(cls, values: Mapping[str, Any], where: str) -> TableConfig:
        for key in values:
            if key not in TABLE_KEYS:
                hint = did_you_mean(str(key), TABLE_KEYS)
                raise ConfigError(
                    f"unknown key {short_repr(key)} in {where}{hint}; valid keys: {', '.join(TABLE_KEYS)}"
                )
        merged = {**cls().__dict__, **values}
        budget = check_bytes_budget(merged["bytes_budget"])
        if budget is not None:
            clashing = [f"{k}={short_repr(v)}" for k, v in values.items()
                        if (k, v) in (("quantize_type", "log"), ("per_row", False))
                        or (k in ("quantize_bits", "threshold") and v is not None)]
            if clashing:
                raise ConfigError(f"bytes_budget chooses each row's bits on per-row abs_max grids, so {clashing[0]} "
                                  f"in {where} does not apply; drop it (mixed_bits sets the widths)")
        return cls(
            quantize_type=validate_choice("quantize_type", merged["quantize_type"], EMBEDDING_QUANTIZE_TYPES),
            quantize_bits=_bits(merged["quantize_bits"]),
            dtype=validate_choice("dtype", merged["dtype"], DTYPES),
            threshold=_threshold(merged["threshold"]),
            per_row=validate_choice("per_row", merged["per_row"], PER_ROW_CHOICES),
            asymmetric=validate_choice("asymmetric", merged["asymmetric"], ASYMMETRIC_CHOICES),
            max_error=_max_error(merged["max_error"]),
            scale_dtype=validate_choice("scale_dtype", merged["scale_dtype"], SCALE_DTYPES),
            bytes_budget=budget,
            mixed_bits=check_mixed_bits(merged["mixed_bits"]),
        )


def _bits(value: Any) -> int | str:
    if isinstance(value, str) and value == "auto":
        return value
    try:
        return validate_bits("quantize_bits", value, *BITS_RANGE)
    except ConfigError:
        raise ConfigError(f"quantize_bits={short_repr(value)} is not valid; valid choices: an int from "
                          f"{BITS_RANGE[0]} to {BITS_RANGE[1]}, or 'auto'") from None


def _max_error(value: Any) -> float:
    if isinstance(value, numbers.Real) and not isinstance(value, bool) and 0 < value < 1:
        return float(value)
    raise ConfigError(f"max_error={short_repr(value)} is not valid; valid choices: a fraction in (0, 1), e.g. 0.02")


def _threshold(value: Any) -> float | None:
    """None, or a number in (0, float32 max] as float."""
    if value is None:
        return None
    if isinstance(value, numbers.Real) and not isinstance(value, bool) and 0 < value <= THRESHOLD_MAX:
        return float(value)
    raise ConfigError(f"threshold={short_repr(value)} is not valid; valid choices: None or a finite number > 0")


@dataclass(frozen=True)
class WeightsConfig:
    """The ``weights`` key: which other ops' weights are stored weight-only, and in how many bits."""

    op_types: tuple[str, ...] = WEIGHT_ONLY_OP_TYPES
    bits: int = 8

    @classmethod
    def from_value(cls, value: Any) -> WeightsConfig | None:
        """None (or False): tables only; True: the defaults; a dict of :data:`WEIGHTS_KEYS`."""
        if value is None or value is False:
            return None
        if value is True:
            return cls()
        if not isinstance(value, Mapping):
            raise ConfigError(f"weights={short_repr(value)} is not valid; valid choices: None, True or a dict of "
                              f"{', '.join(WEIGHTS_KEYS)}, e.g. {{'weight_bits': 8}}")
        for key in value:
            if key not in WEIGHTS_KEYS:
                raise ConfigError(f"unknown key {short_repr(key)} in config['weights']"
                                  f"{did_you_mean(str(key), WEIGHTS_KEYS)}; valid keys: {', '.join(WEIGHTS_KEYS)}")
        op_types = validate_names("weights.quantizable_op_type", value.get("quantizable_op_type", cls.op_types),
                                  WEIGHT_ONLY_OP_TYPES, allow_str=True)
        return cls(op_types, validate_choice("weights.weight_bits", value.get("weight_bits", cls.bits), WEIGHT_BITS))


@dataclass(frozen=True)
class EmbeddingConfig:
    """The validated config: which op types, which tables (None: all) and how, per op type."""

    op_types: tuple[str, ...]
    params_names: tuple[str, ...] | None
    tables: Mapping[str, TableConfig]
    fused_lookup: bool | str = "auto"  # True: the compiled op (required), "auto": where it loads
    weights: WeightsConfig | None = None  # the other weights, stored weight-only; None: tables only

    @classmethod
    def from_dict(cls, config: Mapping[str, Any] | None) -> EmbeddingConfig:
        if config is None:
            config = {}
        if not isinstance(config, Mapping):
            raise ConfigError(
                f"the quant_embedding config must be a dict, got {type(config).__name__}: {short_repr(config)}"
            )
        valid = TOP_KEYS + TABLE_KEYS + EMBEDDING_OP_TYPES
        for key in config:
            if key not in valid:
                hint = did_you_mean(str(key), valid)
                raise ConfigError(
                    f"unknown quant_embedding config key {short_repr(key)}{hint}; valid keys: {', '.join(valid)}"
                )
        op_types = validate_names("quantize_op_types", config.get("quantize_op_types", EMBEDDING_OP_TYPES),
                                  EMBEDDING_OP_TYPES, allow_str=True)
        defaults = {k: config[k] for k in TABLE_KEYS if k in config}
        tables = {}
        for op_type in op_types:
            per_op = config.get(op_type, {})
            if not isinstance(per_op, Mapping):
                raise ConfigError(
                    f"config[{op_type!r}] must be a dict of {', '.join(TABLE_KEYS)}; got {short_repr(per_op)}"
                )
            tables[op_type] = TableConfig.from_dict({**defaults, **per_op}, f"config[{op_type!r}]")
        names = config.get("params_name")
        if names is not None:
            names = validate_names("params_name", names, allow_str=True)
        fused = validate_choice("fused_lookup", config.get("fused_lookup", "auto"), FUSED_CHOICES)
        return cls(op_types, names, tables, fused, WeightsConfig.from_value(config.get("weights")))
