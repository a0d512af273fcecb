"""Where a model lives on disk: :class:`ModelFiles`, the one file layout :mod:`qcore.model_io` loads and saves and
:mod:`qcore.diagnose` reads when a load fails (so neither needs the other for it)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .paddle_env import Family


@dataclass(frozen=True)
class ModelFiles:
    """Where a model lives on disk. ``params_file`` is None for one-file-per-parameter models."""

    model_file: Path
    params_file: Path | None
    family: Family

    @property
    def directory(self) -> Path:
        return self.model_file.parent

    @property
    def params_bytes(self) -> int:
        """Bytes of parameter data: the combined params file, or every other file of the directory."""
        if self.params_file is not None:
            return self.params_file.stat().st_size
        return sum(p.stat().st_size for p in self.directory.iterdir() if p.is_file() and p != self.model_file)
