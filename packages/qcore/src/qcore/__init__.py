"""qcore: quantization math, observers, threshold search, config and model graph utilities."""

__version__ = "0.1.0"
