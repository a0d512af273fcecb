"""The optional compiled lookup: ``qembed_lookup``, a Paddle custom CPU op (source in ``csrc/lookup.cc``).

It reads a quantized table's codes directly and returns the dequantized rows, or their bag's sum /
mean / sqrt-mean, in one pass: what ``fused_embedding_seq_pool`` did for float tables before Paddle 3
dropped it. Nothing here needs a compiler until :func:`build` is called (``python -m qembed.build_ext``);
the library is built for this machine (``-O3 -march=native``) into a cache directory keyed by the
source, the Paddle version and the CPU's flags, so a home directory shared by AVX2-only and AVX-512
machines keeps one build per CPU. Without it, ``quant_embedding`` writes the op sequence.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from qcore.errors import ConfigError, QuantError

OP_TYPE = "qembed_lookup"
SOURCE = Path(__file__).parent / "csrc" / "lookup.cc"
#: Directory of the built library (default ``$XDG_CACHE_HOME/qembed``, i.e. ``~/.cache/qembed``).
DIR_ENV = "QEMBED_EXT_DIR"
BUILD_COMMAND = "python -m qembed.build_ext"
# -ffp-contract=off: a multiply-add is rounded twice, as in the op sequence, so both give the same bits.
CXXFLAGS = ("-O3", "-march=native", "-ffp-contract=off", "-std=c++17", "-fPIC", "-shared", "-DNDEBUG",
            "-DPADDLE_WITH_CUSTOM_KERNEL", "-D_GLIBCXX_USE_CXX11_ABI=1")
_registered: Path | None = None  # the library this process loaded: Paddle aborts on a second registration


def cache_dir() -> Path:
    if os.environ.get(DIR_ENV):
        return Path(os.environ[DIR_ENV])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "qembed"


def library_path() -> Path:
    """Where this machine's build of the op is (or would be) kept."""
    import paddle

    from qcore.deploy.host import cpu_flags

    key = hashlib.sha256()
    for part in (SOURCE.read_bytes(), paddle.__version__.encode(), " ".join(CXXFLAGS).encode(),
                 " ".join(sorted(cpu_flags() or ())).encode()):
        key.update(part + b"\0")
    return cache_dir() / f"qembed_lookup-{key.hexdigest()[:16]}.so"


def compiler() -> str | None:
    """The C++ compiler :func:`build` would use (``$CXX``, else ``c++`` / ``g++``), None if there is none."""
    names = [os.environ["CXX"]] if os.environ.get("CXX") else ["c++", "g++"]
    return next((found for found in map(shutil.which, names) if found), None)


def build(force: bool = False, verbose: bool = False) -> Path:
    """Compile the op for this machine unless already built; returns the library's path.

    The library appears only complete (compiled to a temporary name, then renamed).
    """
    target = library_path()
    if target.is_file() and not force:
        return target
    cxx = compiler()
    if cxx is None:
        raise QuantError("no C++ compiler found (set $CXX or install g++); qembed keeps working without the "
                         "fused lookup (quant_embedding writes the op sequence)")
    from paddle.utils.cpp_extension import extension_utils as paddle_ext

    includes = [f"-I{d}" for d in (*paddle_ext.find_paddle_includes(), *paddle_ext.find_python_includes())]
    libs = [arg for d in (*paddle_ext.find_paddle_libraries(), paddle_ext._get_base_path())
            for arg in (f"-L{d}", f"-Wl,-rpath,{d}")]
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    os.close(fd)
    command = [cxx, *CXXFLAGS, *includes, str(SOURCE), "-o", tmp, *libs,
               "-Wl,--no-as-needed", "-l:libpaddle.so", "-Wl,--as-needed"]
    try:
        done = subprocess.run(command, capture_output=not verbose, text=True)
        if done.returncode != 0:
            tail = "\n".join((done.stderr or "").strip().splitlines()[-15:])
            raise QuantError(f"building {SOURCE.name} failed ({cxx} exit {done.returncode}); qembed keeps working "
                             f"with the op sequence. Compiler output (end):\n{tail}")
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target


def load() -> bool:
    """Register the op in this process if it is built; True when it is available.

    Load it before creating a ``paddle.inference`` predictor of a model that uses it
    (:func:`qcore.inference.create_predictor` does this itself). Once registered, it stays: Paddle
    aborts the process if a second library registers it again.
    """
    global _registered
    if _registered is not None:
        return True
    path = library_path()
    if not path.is_file():
        return False
    from paddle.utils.cpp_extension.extension_utils import load_op_meta_info_and_register_op

    load_op_meta_info_and_register_op(str(path))
    _registered = path
    return True


def require() -> None:
    """Load the op, or raise ConfigError saying how to build it."""
    if not load():
        raise ConfigError(f"the fused lookup ({OP_TYPE}) is not built for this machine; run `{BUILD_COMMAND}` "
                          f"(needs a C++ compiler) or quantize with fused_lookup=False")
