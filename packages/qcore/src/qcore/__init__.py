"""qcore: quantization math, observers, threshold search, config and model graph utilities."""

import warnings as _warnings

# Importing Paddle warns "No ccache found", a note for compiling C++ extensions that has nothing to do with
# quantizing; every q* package imports qcore before Paddle, so the import it makes does not print it. (A script
# that imports Paddle first sees it from its own import.)
_warnings.filterwarnings("ignore", message="No ccache found", category=UserWarning,
                         module=r"paddle\.utils\.cpp_extension")

__version__ = "0.1.0"
#: How to install the optional ONNX export and ONNX runtimes (the ``onnx`` extra of this distribution). No
#: distribution of this toolkit is on PyPI yet: from the wheels ``python3 -m nox -s build`` writes, or from a clone.
ONNX_INSTALL = ("from the built wheels: pip install --find-links dist 'paddle-quant-core[onnx]'; "
                "from a clone: pip install 'packages/qcore[onnx]'")
