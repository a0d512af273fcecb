"""The compiled lookup: ``qembed_lookup``, a Paddle custom CPU op (source in ``csrc/lookup.cc``).

It reads a quantized table's codes directly and returns the dequantized rows, or their bag's sum /
mean / sqrt-mean, in one pass: what ``fused_embedding_seq_pool`` did for float tables before Paddle 3
dropped it. :func:`load` takes, in this order, the library the platform wheel ships (``lib/``, built for
the one Paddle version its ``lib/qembed_lookup.json`` names, refused under any other) and this machine's
build (:func:`build`, ``python -m qembed.build_ext``: needs a C++ compiler; cached in a directory keyed
by the source, the Paddle version and the flags). Nothing compiles at import or on first use. Both
libraries hold AVX-512, AVX2 and baseline code paths chosen at run time (``$QEMBED_ISA`` forces one).
Without either, ``quant_embedding`` writes the op sequence.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import tempfile
import warnings
from pathlib import Path

from qcore.errors import ConfigError, QuantError

from . import cxx

OP_TYPE = "qembed_lookup"
#: Directory of this machine's build (default ``$XDG_CACHE_HOME/qembed``, i.e. ``~/.cache/qembed``).
DIR_ENV = "QEMBED_EXT_DIR"
BUILD_COMMAND = "python -m qembed.build_ext"
INSTALL_HINT = ("pip install --find-links dist paddle-quant-embed (the Linux x86-64 wheel `nox -s build` writes "
                f"ships the op) or run `{BUILD_COMMAND}` (needs a C++ compiler)")
#: The library a platform wheel ships, and its manifest (``{"paddle": version, ...}``).
SHIPPED = Path(__file__).parent / "lib" / f"{OP_TYPE}.so"
MANIFEST = SHIPPED.with_suffix(".json")
_registered: Path | None = None  # the library this process loaded: Paddle aborts on a second registration


def cache_dir() -> Path:
    if os.environ.get(DIR_ENV):
        return Path(os.environ[DIR_ENV])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "qembed"


def library_path() -> Path:
    """Where this machine's build of the op is (or would be) kept."""
    import paddle

    key = hashlib.sha256()
    for part in (cxx.SOURCE.read_bytes(), paddle.__version__.encode(), " ".join(cxx.CXXFLAGS).encode()):
        key.update(part + b"\0")
    return cache_dir() / f"{OP_TYPE}-{key.hexdigest()[:16]}.so"


def shipped_paddle() -> str | None:
    """The Paddle version the shipped library is built for; None when this install ships none (an sdist's)."""
    if not SHIPPED.is_file():
        return None
    return json.loads(MANIFEST.read_text(encoding="utf-8"))["paddle"]


def shipped() -> Path | None:
    """The shipped library if it is built for the installed Paddle (warns once when it is not)."""
    import paddle

    built_for = shipped_paddle()
    if built_for is None:
        return None
    if built_for == paddle.__version__:
        return SHIPPED
    warnings.warn(_mismatch(built_for), stacklevel=3)
    return None


def _mismatch(built_for: str) -> str:
    import paddle

    return (f"the {OP_TYPE} op this wheel ships is built for Paddle {built_for}, not the installed "
            f"{paddle.__version__}: pip install paddlepaddle=={built_for} (or paddle-quant-embed[fused]), or run "
            f"`{BUILD_COMMAND}` (needs a C++ compiler)")


def compiler() -> str | None:
    """The C++ compiler :func:`build` would use (``$CXX``, else ``c++`` / ``g++``), None if there is none."""
    return cxx.compiler()


def build(force: bool = False, verbose: bool = False) -> Path:
    """Compile the op for this machine unless already built; returns the library's path.

    The library appears only complete (compiled to a temporary name, then renamed).
    """
    target = library_path()
    if target.is_file() and not force:
        return target
    compiler_path = compiler()
    if compiler_path is None:
        raise QuantError("no C++ compiler found (set $CXX or install g++); qembed keeps working without the "
                         "fused lookup (quant_embedding writes the op sequence)")
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    os.close(fd)
    try:
        done = cxx.compile_library(compiler_path, Path(tmp), cxx.paddle_dirs(), verbose)
        if done.returncode != 0:
            tail = "\n".join((done.stderr or "").strip().splitlines()[-15:])
            raise QuantError(f"building {cxx.SOURCE.name} failed ({compiler_path} exit {done.returncode}); qembed "
                             f"keeps working with the op sequence. Compiler output (end):\n{tail}")
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target


def load() -> bool:
    """Register the op in this process, from the shipped library or this machine's build; True when it is
    available.

    Load it before creating a ``paddle.inference`` predictor of a model that uses it
    (:func:`qcore.inference.create_predictor` does this itself). Once registered, it stays: Paddle
    aborts the process if a second library registers it again.
    """
    global _registered
    if _registered is not None:
        return True
    path = shipped() or library_path()
    if not path.is_file():
        return False
    from paddle.utils.cpp_extension.extension_utils import load_op_meta_info_and_register_op

    load_op_meta_info_and_register_op(str(path))
    _registered = path
    return True


def loaded() -> Path | None:
    """The library registered in this process (the shipped one or this machine's build), None before :func:`load`."""
    return _registered


def isa() -> str:
    """The code path the loaded op runs on this CPU: ``"avx512"``, ``"avx2"`` or ``"x86-64"`` (or why
    ``$QEMBED_ISA`` cannot be honoured)."""
    require()
    function = ctypes.CDLL(str(_registered)).qembed_lookup_isa  # the handle Paddle opened: the same choice
    function.restype = ctypes.c_char_p
    return function().decode()


def require() -> None:
    """Load the op, or raise ConfigError saying in one line what to install."""
    if load():
        return
    built_for = shipped_paddle()
    if built_for is not None:
        raise ConfigError(_mismatch(built_for))
    raise ConfigError(f"the fused lookup ({OP_TYPE}) is not available here; {INSTALL_HINT}, or quantize with "
                      "fused_lookup=False")
