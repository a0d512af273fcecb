"""Which method packages are installed, and a clear error when a subcommand needs one that is not."""

from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType

PROVIDERS = {"ptq": "qptq", "demo": "qptq", "qat": "qqat", "embed": "qembed"}


def installed(package: str) -> bool:
    return importlib.util.find_spec(package) is not None


def require(command: str) -> ModuleType:
    """Import the package behind ``command`` or exit with the pip command that provides it."""
    package = PROVIDERS[command]
    if not installed(package):
        raise SystemExit(
            f"qcli {command}: the '{package}' package is not installed; install it with "
            f"'pip install packages/{package}' (or 'pip install qcli[all]')"
        )
    return importlib.import_module(package)
