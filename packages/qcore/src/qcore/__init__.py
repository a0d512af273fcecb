"""qcore: quantization math, observers, threshold search, config and model graph utilities."""

__version__ = "0.1.0"
#: How to install the optional ONNX export and ONNX runtimes (the ``onnx`` extra of this distribution). No
#: distribution of this toolkit is on PyPI yet: from the wheels ``python3 -m nox -s build`` writes, or from a clone.
ONNX_INSTALL = ("from the built wheels: pip install --find-links dist 'paddle-quant-core[onnx]'; "
                "from a clone: pip install 'packages/qcore[onnx]'")
