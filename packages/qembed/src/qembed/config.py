"""The ``quant_embedding`` config: the seeds' two dict forms, validated into one object.

Newer form (per op type)::

    {"quantize_op_types": ["lookup_table"], "lookup_table": {"quantize_type": "log", "quantize_bits": 8}}

Older form (flat keys, one table named by ``params_name``)::

    {"params_name": "emb", "quantize_type": "abs_max", "threshold": 0.5}

Flat per-table keys also act as defaults for every op type, so both forms mix. ``per_row``
(False, True or "auto") is ours, not the seeds'; it defaults to False, the seeds' whole-table scale.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Union

from qcore.config import validate_bits, validate_choice
from qcore.constants import EMBEDDING_OP_TYPES, EMBEDDING_QUANTIZE_TYPES
from qcore.errors import ConfigError, did_you_mean

PerRow = Union[bool, str]  # True, False or "auto"
TABLE_KEYS = ("quantize_type", "quantize_bits", "dtype", "threshold", "per_row")
TOP_KEYS = ("quantize_op_types", "params_name")
BITS_RANGE = (2, 8)  # codes are stored as int8 whatever the bit width
DTYPES = ("int8",)
PER_ROW_CHOICES = (False, True, "auto")


@dataclass(frozen=True)
class TableConfig:
    """How the tables of one op type are quantized."""

    quantize_type: str = "abs_max"
    quantize_bits: int = 8
    dtype: str = "int8"
    threshold: float | None = None
    per_row: PerRow = False

    @classmethod
    def from_dict(cls, values: Mapping[str, Any], where: str) -> TableConfig:
        for key in values:
            if key not in TABLE_KEYS:
                hint = did_you_mean(key, TABLE_KEYS)
                raise ConfigError(f"unknown key {key!r} in {where}{hint}; valid keys: {', '.join(TABLE_KEYS)}")
        merged = {**cls().__dict__, **values}
        validate_choice("quantize_type", merged["quantize_type"], EMBEDDING_QUANTIZE_TYPES)
        validate_bits("quantize_bits", merged["quantize_bits"], *BITS_RANGE)
        validate_choice("dtype", merged["dtype"], DTYPES)
        validate_choice("per_row", merged["per_row"], PER_ROW_CHOICES)
        threshold = merged["threshold"]
        if threshold is not None and (isinstance(threshold, bool) or not isinstance(threshold, (int, float))
                                      or not threshold > 0):
            raise ConfigError(f"threshold={threshold!r} is not valid; valid choices: None or a number > 0")
        return cls(**merged)


@dataclass(frozen=True)
class EmbeddingConfig:
    """The validated config: which op types, which tables (None: all) and how, per op type."""

    op_types: tuple[str, ...]
    params_names: tuple[str, ...] | None
    tables: Mapping[str, TableConfig]

    @classmethod
    def from_dict(cls, config: Mapping[str, Any] | None) -> EmbeddingConfig:
        config = dict(config or {})
        op_types = config.get("quantize_op_types", list(EMBEDDING_OP_TYPES))
        if isinstance(op_types, str):
            op_types = [op_types]
        for op_type in op_types:
            validate_choice("quantize_op_types entry", op_type, EMBEDDING_OP_TYPES)
        valid = TOP_KEYS + TABLE_KEYS + EMBEDDING_OP_TYPES
        for key in config:
            if key not in valid:
                hint = did_you_mean(key, valid)
                raise ConfigError(f"unknown quant_embedding config key {key!r}{hint}; valid keys: {', '.join(valid)}")
        defaults = {k: config[k] for k in TABLE_KEYS if k in config}
        tables = {}
        for op_type in op_types:
            per_op = config.get(op_type, {})
            if not isinstance(per_op, Mapping):
                raise ConfigError(f"config[{op_type!r}] must be a dict of {', '.join(TABLE_KEYS)}; got {per_op!r}")
            tables[op_type] = TableConfig.from_dict({**defaults, **per_op}, f"config[{op_type!r}]")
        names = config.get("params_name")
        if isinstance(names, str):
            names = [names]
        if names is not None and (not names or not all(isinstance(n, str) and n for n in names)):
            raise ConfigError(f"params_name={names!r} is not valid; valid choices: a table name or a list of them")
        return cls(tuple(op_types), tuple(names) if names is not None else None, tables)
