"""ONNX initializers written to their external data file while the graph is built (:class:`ExternalData`), so that
a model of any size is written in the memory of its largest tensor: the graph keeps references (location, offset,
length), never the bytes. ``onnx.save`` of such a model writes the small graph only.
"""

from __future__ import annotations

import os
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np

#: Tensors at least this large go to the file; smaller ones stay in the graph (shapes, axes, scalars).
THRESHOLD = 1024
#: Offsets of the tensors in the file are multiples of this (a page: a runtime may map them in place).
ALIGN = 4096


class ExternalData:
    """One external data file (``path``; the graph names it by its file name, so the model must be saved beside
    it), appended to as initializers are made: :meth:`array` for a numpy array (written from its buffer, no copy),
    :meth:`tensor` for a ``TensorProto`` made elsewhere (its bytes moved out)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._file = open(self.path, "wb")  # noqa: SIM115 - closed by close() / the context manager

    def __enter__(self) -> ExternalData:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        self._file.close()

    def array(self, value: np.ndarray, name: str) -> Any:
        """The initializer ``name`` holding ``value``: its bytes in the file when they reach :data:`THRESHOLD`."""
        from onnx import TensorProto, helper, numpy_helper

        value = np.ascontiguousarray(value, value.dtype.newbyteorder("<"))  # ONNX stores little-endian
        if value.nbytes < THRESHOLD:
            return numpy_helper.from_array(value, name)
        proto = TensorProto(name=name, data_type=helper.np_dtype_to_tensor_dtype(value.dtype), dims=value.shape)
        self._append(proto, memoryview(value.reshape(-1)).cast("B"))
        return proto

    def tensor(self, proto: Any) -> Any:
        """``proto`` with its raw bytes moved to the file when they reach :data:`THRESHOLD`."""
        if len(proto.raw_data) >= THRESHOLD:
            data = proto.raw_data
            proto.ClearField("raw_data")
            self._append(proto, data)
        return proto

    def _append(self, proto: Any, data: bytes | memoryview) -> None:
        from onnx import TensorProto

        self._file.write(b"\0" * (-self._file.tell() % ALIGN))
        offset = self._file.tell()
        self._file.write(data)
        del proto.external_data[:]
        for key, value in (("location", self.path.name), ("offset", str(offset)), ("length", str(len(data)))):
            entry = proto.external_data.add()
            entry.key, entry.value = key, value
        proto.data_location = TensorProto.EXTERNAL
