"""Which method packages are installed, and a clear error when a subcommand needs one that is not."""

from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType

#: The packages each subcommand imports, the method package first; ``qdemo`` holds the demo model and data.
PROVIDERS = {"ptq": ("qptq",), "demo": ("qptq", "qdemo"), "qat": ("qqat", "qdemo"), "embed": ("qembed",)}
#: The distribution (what pip installs) of each package qcli may import: the import names are taken on PyPI.
DISTRIBUTIONS = {"qptq": "paddle-quant-ptq", "qqat": "paddle-quant-qat", "qembed": "paddle-quant-embed",
                 "qdemo": "paddle-quant-demo"}


def installed(package: str) -> bool:
    return importlib.util.find_spec(package) is not None


def require(command: str) -> ModuleType:
    """Import the method package behind ``command`` or exit with the pip commands that provide what is missing."""
    missing = [p for p in PROVIDERS[command] if not installed(p)]
    if missing:
        names = " and ".join(f"'{p}'" for p in missing)
        dists = " ".join(DISTRIBUTIONS[p] for p in missing)
        paths = " ".join(f"packages/{p}" for p in missing)
        raise SystemExit(
            f"qcli {command}: {names} {'is' if len(missing) == 1 else 'are'} not installed; install with "
            f"'pip install {dists}' (from a clone of the repository: 'pip install {paths}')"
        )
    return importlib.import_module(PROVIDERS[command][0])
