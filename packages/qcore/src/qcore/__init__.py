"""qcore: quantization math, observers, threshold search, config and model graph utilities."""

__version__ = "0.1.0"
#: The command that installs the optional ONNX export and ONNX runtimes (the ``onnx`` extra of this distribution).
ONNX_INSTALL = "pip install 'paddle-quant-core[onnx]'"
