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


class MissingPackageError(Exception):
    """A subcommand's package is not installed; the message says how to install it (``qcli`` exits with 9)."""


def installed(package: str) -> bool:
    return importlib.util.find_spec(package) is not None


def install_hint(packages: list[str]) -> str:
    """The two ways to install ``packages`` (import names) while none is on PyPI: from a clone, or from the wheels
    ``python3 -m nox -s build`` writes to ``dist/``."""
    paths = " ".join(f"packages/{p}" for p in packages)
    dists = " ".join(DISTRIBUTIONS[p] for p in packages)
    return (f"from a clone of the repository: pip install {paths}; from the wheels python3 -m nox -s build writes: "
            f"pip install --find-links dist {dists}")


def require(command: str) -> ModuleType:
    """Import the method package behind ``command``, or raise :class:`MissingPackageError` saying how to install
    what is missing."""
    missing = [p for p in PROVIDERS[command] if not installed(p)]
    if missing:
        names = " and ".join(f"'{p}'" for p in missing)
        raise MissingPackageError(f"{names} {'is' if len(missing) == 1 else 'are'} not installed (none of this "
                                  f"toolkit's packages is on PyPI yet); {install_hint(missing)}")
    return importlib.import_module(PROVIDERS[command][0])
