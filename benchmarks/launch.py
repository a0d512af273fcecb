"""The command that runs a benchmark's worker script in one process, or as ranks of ``paddle.distributed.launch``
(no dependencies)."""

from __future__ import annotations

import sys
from pathlib import Path


def worker_command(script: list[str], ranks: int, log_dir: Path) -> list[str]:
    """``python SCRIPT...`` for one process, else ``python -m paddle.distributed.launch`` with ``ranks`` CPU
    processes on this machine, no restarts, their logs in ``log_dir``."""
    if ranks == 1:
        return [sys.executable, *script]
    return [sys.executable, "-m", "paddle.distributed.launch", "--nproc_per_node", str(ranks), "--max_restart", "0",
            "--log_dir", str(log_dir), *script]
