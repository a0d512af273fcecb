"""Why a model does not load: read the files themselves when Paddle's loader fails.

Paddle's errors for a damaged model name its own internals ("In user code:", "Cannot read tensor
desc size"). The program lists the parameters it needs (name, shape, dtype); a params file is
those parameters' tensors, sorted by name, one after another, each stored as::

    uint32 version | uint64 LoD levels, each: uint64 size + data | uint32 version
    | int32 size + a TensorDesc protobuf (field 1: dtype, field 2: dims) | raw data

(one file per parameter holds one such tensor). Walking that layout beside the program's list
says which file is short, too long, missing or of another model, and at which parameter.

One damage Paddle does not notice: a file cut inside the data of its last tensor loads, and that
tensor holds whatever memory was there. So a load that succeeds is checked for truncation too
(:func:`truncation`): a seek past each tensor's data, about 2 ms for ResNet-18's 102 parameters
(3% of its load).
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import paddle

from .model_files import ModelFiles
from .paddle_env import Family, static_mode

#: TensorDesc dtype codes (Paddle's ``VarType`` enum) -> (name, bytes per element).
DTYPES = {
    0: ("bool", 1), 1: ("int16", 2), 2: ("int32", 4), 3: ("int64", 8), 4: ("float16", 2), 5: ("float32", 4),
    6: ("float64", 8), 19: ("size_t", 8), 20: ("uint8", 1), 21: ("int8", 1), 22: ("bfloat16", 2),
    23: ("complex64", 8), 24: ("complex128", 16), 32: ("float8_e4m3fn", 1), 33: ("float8_e5m2", 1),
}  # fmt: skip
_SANE_LIMIT = 1 << 20  # LoD levels and TensorDesc sizes beyond this are not a tensor header


@dataclass(frozen=True)
class TensorSpec:
    """A parameter's shape and dtype name, as the program declares it or a params file stores it."""

    shape: tuple[int, ...]
    dtype: str

    def __str__(self) -> str:
        return f"{list(self.shape)} ({self.dtype})"


@dataclass(frozen=True)
class _Problem:
    """What is wrong with a model's parameters, in one line; ``truncated`` when a file is cut short."""

    message: str
    truncated: bool = False


class _Short(Exception):
    """The file ends inside a tensor: in its data (``need`` bytes from its start), or in its header (``need`` None)."""

    def __init__(self, need: int | None) -> None:
        self.need = need


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while pos < len(buf) and shift < 64:
        byte = buf[pos]
        value |= (byte & 0x7F) << shift
        pos += 1
        if byte < 0x80:
            return value, pos
        shift += 7
    raise ValueError("bad varint")


def _tensor_desc(buf: bytes) -> tuple[TensorSpec, int]:
    """Decode a TensorDesc protobuf (dims packed or not); also its bytes per element."""
    dtype, dims, pos = None, [], 0
    while pos < len(buf):
        key, pos = _varint(buf, pos)
        field, wire = key >> 3, key & 7
        if (field, wire) == (1, 0):
            dtype, pos = _varint(buf, pos)
        elif (field, wire) == (2, 0):
            dim, pos = _varint(buf, pos)
            dims.append(dim)
        elif (field, wire) == (2, 2):
            size, pos = _varint(buf, pos)
            packed, pos = buf[pos : pos + size], pos + size
            at = 0
            while at < len(packed):
                dim, at = _varint(packed, at)
                dims.append(dim)
        else:
            raise ValueError("not a TensorDesc")
    if dtype not in DTYPES or pos != len(buf) or any(d >= 1 << 63 for d in dims):  # a stored tensor has no -1
        raise ValueError("not a TensorDesc")
    name, itemsize = DTYPES[dtype]
    return TensorSpec(tuple(dims), name), itemsize


def _read_tensor(f: BinaryIO, size: int) -> TensorSpec:
    """Read the header of the tensor at ``f``'s position (in a file of ``size`` bytes) and skip its data.

    Raises :class:`_Short` when the file ends inside it, :class:`ValueError` when the bytes are no tensor.
    """
    start, used = f.tell(), 0

    def take(n: int) -> bytes:
        nonlocal used
        used += n
        data = f.read(n) if start + used <= size else b""
        if len(data) < n:
            raise _Short(None)
        return data

    (version,) = struct.unpack("<I", take(4))
    (levels,) = struct.unpack("<Q", take(8))
    if version != 0 or levels > _SANE_LIMIT:
        raise ValueError("not a tensor header")
    for _ in range(levels):
        (lod_bytes,) = struct.unpack("<Q", take(8))
        take(lod_bytes)
    version, desc_size = struct.unpack("<Ii", take(8))
    if version != 0 or not 0 < desc_size < _SANE_LIMIT:
        raise ValueError("not a tensor header")
    spec, itemsize = _tensor_desc(take(desc_size))
    used += math.prod(spec.shape) * itemsize
    if start + used > size:
        raise _Short(used)
    f.seek(start + used)
    return spec


def parameter_specs(program: Any, family: Family) -> dict[str, TensorSpec]:
    """The parameters ``program`` (loaded, of ``family``) needs, sorted by name: the order of a params file."""
    if family == "legacy":
        dense = paddle.base.core.VarDesc.VarType.DENSE_TENSOR
        specs = {v.name: (v.shape, v.dtype) for v in program.list_vars() if v.persistable and v.type == dense}
    else:
        specs = {
            op.attrs()["parameter_name"]: (op.result(0).shape, op.result(0).dtype)
            for op in program.global_block().ops
            if op.name() == "builtin.parameter" and op.result(0).persistable
        }
    return {name: TensorSpec(tuple(shape), str(dtype).split(".")[-1]) for name, (shape, dtype) in sorted(specs.items())}


def _read_program(files: ModelFiles) -> Any:
    if files.family == "legacy":
        return paddle.static.Program.parse_from_string(files.model_file.read_bytes())
    program = paddle.static.Program()
    paddle.base.core.deserialize_pir_program(str(files.model_file), program)
    return program


def is_legacy_program(path: Path) -> bool:
    """Whether ``path`` holds a legacy ProgramDesc (a protobuf with at least one op)."""
    try:
        with static_mode("legacy"):
            program = paddle.static.Program.parse_from_string(path.read_bytes())
            return bool(program.blocks and program.global_block().ops)
    except (ValueError, RuntimeError):
        return False


#: Tags of the ModelProto fields an ONNX file has after ``ir_version`` (field 1, a varint, written first):
#: producer_name .. opset_import, metadata_props, training_info, functions. A Paddle program starts otherwise:
#: ``0x0a`` (ProgramDesc's field 1, its blocks) or ``{`` (PIR's JSON).
_ONNX_TAGS = frozenset({0x12, 0x1A, 0x22, 0x28, 0x32, 0x3A, 0x42, 0x72, 0xA2, 0xCA})


def is_onnx_file(path: Path) -> bool:
    """Whether ``path`` is an ONNX model: its suffix, or its first bytes (``ir_version``, then another field)."""
    if path.suffix.lower() == ".onnx":
        return True
    with open(path, "rb") as f:
        head = f.read(16)
    if head[:1] != b"\x08":
        return False
    try:
        _, pos = _varint(head, 1)
    except ValueError:
        return False
    return pos < len(head) and head[pos] in _ONNX_TAGS


def onnx_input(path: Path) -> str:
    """The one line for an ONNX file given where a Paddle model is expected."""
    return (f"{path} is an ONNX model: this toolkit quantizes Paddle inference models (.json / .pdmodel) and "
            "writes ONNX files from them (qcli export onnx, the ONNX deployment targets); give the Paddle model it "
            "was exported from, or quantize the ONNX file with onnxruntime.quantization (quantize_static / "
            "quantize_dynamic)")


_COPY_AGAIN = "copy the params file again from where the model was saved"
_OTHER_MODEL = "use the params file saved with the program"


def _tensor_problem(f: BinaryIO, size: int, path: Path, name: str, want: TensorSpec, program: str) -> _Problem | None:
    """Whether the tensor at ``f``'s position is parameter ``name`` as ``program`` declares it."""
    start = f.tell()
    try:
        got = _read_tensor(f, size)
    except _Short as short:
        left = size - start
        cut = (
            f"in the header of parameter '{name}' ({left} bytes left)"
            if short.need is None
            else f"parameter '{name}' needs {short.need} bytes, {left} left"
        )
        return _Problem(f"{path} is truncated: {cut}; {_COPY_AGAIN}", truncated=True)
    except ValueError:
        return _Problem(f"{path} does not hold parameter '{name}' of {program} at byte {start}; {_OTHER_MODEL}")
    if got != want:
        return _Problem(
            f"parameter '{name}' in {path} has shape {got}, {program} expects {want}: "
            "the params file belongs to another model; use the one saved with the program"
        )
    return None


def _combined_problem(params: Path, program: str, needed: dict[str, TensorSpec]) -> _Problem | None:
    size = params.stat().st_size
    with open(params, "rb") as f:
        for count, (name, want) in enumerate(needed.items()):
            if f.tell() == size:
                return _Problem(
                    f"{params} is truncated: it ends after {count} of the {len(needed)} parameters {program} needs "
                    f"('{name}' is the first missing); {_COPY_AGAIN}",
                    truncated=True,
                )
            problem = _tensor_problem(f, size, params, name, want, program)
            if problem is not None:
                return problem
        extra = size - f.tell()
    if extra:
        return _Problem(
            f"{params} has {extra} bytes after the last of the program's {len(needed)} parameters "
            f"(is it from another model?); {_OTHER_MODEL}"
        )
    return None


def _separate_problem(files: ModelFiles, needed: dict[str, TensorSpec]) -> _Problem | None:
    directory, program = files.directory, files.model_file.name
    missing = [name for name in needed if not (directory / name).is_file()]
    if missing and len(missing) == len(needed):
        expected = directory / ("__params__" if program == "__model__" else Path(program).stem + ".pdiparams")
        return _Problem(
            f"params file {expected} is missing: {program} needs {len(needed)} parameters and {directory} holds "
            "neither that file nor one file per parameter; copy the params file saved with the program next to it"
        )
    if missing:
        shown = ", ".join(f"'{name}'" for name in missing[:5]) + (" ..." if len(missing) > 5 else "")
        verb = "is" if len(missing) == 1 else "are"
        return _Problem(
            f"{len(missing)} of the {len(needed)} parameter files {program} needs {verb} missing in {directory}: "
            f"{shown}; copy the files saved with the program next to it"
        )
    for name, want in needed.items():
        path = directory / name
        with open(path, "rb") as f:
            problem = _tensor_problem(f, path.stat().st_size, path, name, want, program)
        if problem is not None:
            return problem
    return None


def _problem(files: ModelFiles, needed: dict[str, TensorSpec]) -> _Problem | None:
    if files.params_file is None:
        return _separate_problem(files, needed)
    return _combined_problem(files.params_file, files.model_file.name, needed)


def load_problem(files: ModelFiles) -> str | None:
    """Why Paddle could not load ``files``, in one line, or None when their parameters fit the program."""
    try:
        with static_mode(files.family):
            needed = parameter_specs(_read_program(files), files.family)
        problem = _problem(files, needed)
    except (ValueError, RuntimeError, OSError):
        return None  # the program does not parse, or a file cannot be read: Paddle's own message says more
    return problem.message if problem is not None else None


def truncation(files: ModelFiles, program: Any) -> str | None:
    """Whether a params file of ``files``, which Paddle loaded as ``program``, is cut short (one line), else None."""
    problem = _problem(files, parameter_specs(program, files.family))
    return problem.message if problem is not None and problem.truncated else None
