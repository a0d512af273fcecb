"""qembed: embedding-table quantization.

This first slice is the table-level numpy API (:mod:`qembed.table`): whole-table or per-row
abs_max and log quantization, row lookups that dequantize only the rows asked for, and chunked
processing of ``.npy`` tables larger than memory. The program rewrite ``quant_embedding``
(issue 4) is not implemented yet.
"""

from .table import QuantizedTable, quantize_npy, quantize_table

__version__ = "0.1.0"
__all__ = ["QuantizedTable", "quantize_npy", "quantize_table"]
