"""qembed: embedding-table quantization for Paddle 3 programs and for raw numpy tables.

* :func:`quant_embedding` (the seeds' API) rewrites a program in memory; :func:`quant_embedding_model`
  does the same for a saved model directory. Tables become int8 codes plus scale(s), read by a
  lookup that dequantizes only the looked-up rows.
* :mod:`qembed.table` quantizes tables held as arrays or ``.npy`` files, in chunks for tables
  larger than memory.
"""

from typing import Any

from .config import EmbeddingConfig, TableConfig
from .table import QuantizedTable, TableChoice, choose_table_quantization, quantize_npy, quantize_table

__version__ = "0.1.0"
_PROGRAM_API = ("TableReport", "quant_embedding", "quant_embedding_model", "quantize_tables")


def __getattr__(name: str) -> Any:
    """The program API imports paddle; load it on first use so table-only users never pay for it."""
    if name in _PROGRAM_API:
        from . import program

        return getattr(program, name)
    raise AttributeError(f"module 'qembed' has no attribute {name!r}")


__all__ = [
    "EmbeddingConfig",
    "QuantizedTable",
    "TableChoice",
    "TableConfig",
    "TableReport",
    "choose_table_quantization",
    "quant_embedding",
    "quant_embedding_model",
    "quantize_npy",
    "quantize_table",
    "quantize_tables",
]
