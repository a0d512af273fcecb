"""Config validation for qqat: the seeds' dicts through :class:`qcore.config.QuantConfig`.

``quant_aware`` / ``convert`` configs may also hold the keys PaddleSlim 2.6 added to the seeds' dict
(:data:`PADDLESLIM26_KEYS`): ``onnx_format`` (True: the QDQ form, the only one written here; False writes it
too and warns once per process, see :data:`ONNX_FORMAT_FALSE`),
``deploy_backend`` (``convert``'s target when its keyword is not given), ``quant_post_first`` and
``scale_trainable`` (no effect here: scales always start from 0 or ``scale_dict`` and train; a value asking
otherwise is warned about).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from qcore.config import DYGRAPH_CONFIG_KEYS, STATIC_CONFIG_KEYS, QuantConfig, check_paddleslim_keywords
from qcore.errors import ConfigError

log = logging.getLogger(__name__)
#: PaddleSlim 2.6's quant_aware config keys beyond the seeds' dict, with its defaults.
PADDLESLIM26_KEYS: Mapping[str, Any] = {"onnx_format": True, "quant_post_first": False, "scale_trainable": True,
                                        "deploy_backend": None}
#: The one line ``onnx_format=False`` warns (once per process): what is written instead, and why.
ONNX_FORMAT_FALSE = (
    "config['onnx_format']=False: writing the QDQ form (quantize_linear/dequantize_linear) all the same; Paddle 2's "
    "fake-quant form (fake_quantize_*/fake_dequantize_* ops) is not written here because OpenVINO's Paddle reader "
    "has no converter for those ops and every deployment target here reads QDQ; pass True to drop this line")
_warned: set[str] = set()


def dygraph_config(config: Mapping[str, Any] | QuantConfig | None) -> QuantConfig:
    """Validate a dygraph ``QAT`` config (the keys of ``DYGRAPH_CONFIG_DEFAULT``)."""
    return _checked(config, DYGRAPH_CONFIG_KEYS)


def static_config(config: Mapping[str, Any] | QuantConfig | None) -> QuantConfig:
    """Validate a ``quant_aware`` / ``convert`` config (the keys of ``QUANT_CONFIG_DEFAULT`` and
    :data:`PADDLESLIM26_KEYS`, see :func:`paddleslim26_settings`)."""
    if isinstance(config, Mapping):
        paddleslim26_settings(config)
        config = {k: v for k, v in config.items() if k not in PADDLESLIM26_KEYS}
    return _checked(config, STATIC_CONFIG_KEYS)


def paddleslim26_settings(config: Mapping[str, Any] | QuantConfig | None) -> dict[str, Any]:
    """The :data:`PADDLESLIM26_KEYS` of ``config`` (defaults filled in), checked; warns where one has no effect."""
    given = dict(config) if isinstance(config, Mapping) else {}
    settings = {k: given.get(k, default) for k, default in PADDLESLIM26_KEYS.items()}
    if settings["onnx_format"] is False:  # PaddleSlim 2.6's own QAT scripts pass it
        if "onnx_format" not in _warned:
            _warned.add("onnx_format")
            log.warning(ONNX_FORMAT_FALSE)
        settings["onnx_format"] = True
    check_paddleslim_keywords(settings["onnx_format"], "round")
    for key, default in (("quant_post_first", False), ("scale_trainable", True)):
        if not isinstance(settings[key], bool):
            raise ConfigError(f"config[{key!r}]={settings[key]!r} is not valid; valid choices: True, False")
        if settings[key] is not default:
            log.warning("config[%r]=%r has no effect here: activation scales start from 0 (or scale_dict) and "
                        "train; drop the key", key, settings[key])
    backend = settings["deploy_backend"]
    if backend is not None and not isinstance(backend, str):
        raise ConfigError(f"config['deploy_backend']={backend!r} is not valid; give a target name such as "
                          "'onednn' (PaddleSlim's 'mkldnn'), 'tensorrt' or None")
    return settings


def _checked(config: Mapping[str, Any] | QuantConfig | None, allowed: frozenset[str]) -> QuantConfig:
    cfg = config if isinstance(config, QuantConfig) else QuantConfig.from_dict(config, allowed=allowed)
    if cfg.dtype != "int8":
        raise ConfigError(f"dtype={cfg.dtype!r} is not supported by qqat; use 'int8' (weights are stored as int8)")
    return cfg
