"""Config validation for qqat: the seeds' dicts through :class:`qcore.config.QuantConfig`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from qcore.config import DYGRAPH_CONFIG_KEYS, STATIC_CONFIG_KEYS, QuantConfig
from qcore.errors import ConfigError


def dygraph_config(config: Mapping[str, Any] | QuantConfig | None) -> QuantConfig:
    """Validate a dygraph ``QAT`` config (the keys of ``DYGRAPH_CONFIG_DEFAULT``)."""
    return _checked(config, DYGRAPH_CONFIG_KEYS)


def static_config(config: Mapping[str, Any] | QuantConfig | None) -> QuantConfig:
    """Validate a ``quant_aware`` / ``convert`` config (the keys of ``QUANT_CONFIG_DEFAULT``)."""
    return _checked(config, STATIC_CONFIG_KEYS)


def _checked(config: Mapping[str, Any] | QuantConfig | None, allowed: frozenset[str]) -> QuantConfig:
    cfg = config if isinstance(config, QuantConfig) else QuantConfig.from_dict(config, allowed=allowed)
    if cfg.dtype != "int8":
        raise ConfigError(f"dtype={cfg.dtype!r} is not supported by qqat; use 'int8' (weights are stored as int8)")
    return cfg
