"""The deployment targets by name: what ``deploy_backend`` / ``backend`` accept."""

from __future__ import annotations

from ..errors import ConfigError, did_you_mean
from . import native, onednn, onnxruntime, openvino, openvino_runtime, tensorrt
from .base import DeployTarget

TARGETS: dict[str, DeployTarget] = {
    t.name: t for t in (onednn.TARGET, openvino.TARGET, tensorrt.TARGET, native.TARGET, onnxruntime.TARGET,
                        openvino_runtime.TARGET)
}
_BY_NAME = {alias: t for t in TARGETS.values() for alias in (t.name, *t.aliases)}
#: The backend names ``deploy_backend`` / ``backend`` accept (aliases included).
BACKEND_NAMES = tuple(_BY_NAME)


def get_target(name: str | DeployTarget | None) -> DeployTarget:
    """The target called ``name`` (case-insensitive, aliases such as ``mkldnn`` included);
    None gives the default (oneDNN's rules, correct everywhere)."""
    if isinstance(name, DeployTarget):
        return name
    if name is None:
        return onednn.TARGET
    key = str(name).lower()
    if key not in _BY_NAME:
        raise ConfigError(
            f"unknown deploy backend {name!r}{did_you_mean(key, _BY_NAME)}; valid: {', '.join(BACKEND_NAMES)}"
        )
    return _BY_NAME[key]


def available_targets() -> list[DeployTarget]:
    """The targets that can run on this machine and Paddle build (tensorrt needs a GPU)."""
    return [t for t in TARGETS.values() if t.unavailable() is None]
