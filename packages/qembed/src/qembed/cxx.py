"""The one command that compiles ``csrc/lookup.cc`` into the ``qembed_lookup`` library.

Used by :func:`qembed.ext.build` (this machine's cache) and by the platform wheel's build (``wheel_backend.py``,
which loads this file by path: it needs Paddle and a C++ compiler, never qcore). No ``-march``: the x86-64
library holds AVX-512, AVX2 and baseline code paths and picks one at run time, so one build serves every
x86-64 CPU.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

SOURCE = Path(__file__).parent / "csrc" / "lookup.cc"
# -ffp-contract=off: a multiply-add is rounded twice, as in the op sequence, so both give the same bits.
CXXFLAGS = ("-O3", "-ffp-contract=off", "-std=c++17", "-fPIC", "-shared", "-DNDEBUG", "-DPADDLE_WITH_CUSTOM_KERNEL",
            "-D_GLIBCXX_USE_CXX11_ABI=1")


def compiler() -> str | None:
    """The C++ compiler to use (``$CXX``, else ``c++`` / ``g++``), None if there is none."""
    names = [os.environ["CXX"]] if os.environ.get("CXX") else ["c++", "g++"]
    return next((found for found in map(shutil.which, names) if found), None)


def paddle_dirs() -> list[str]:
    """The installed Paddle's library directories (``libpaddle.so`` is in one of them)."""
    from paddle.utils.cpp_extension import extension_utils as paddle_ext

    return list(dict.fromkeys((*paddle_ext.find_paddle_libraries(), paddle_ext._get_base_path())))


def compile_library(cxx: str, target: Path, rpath: Sequence[str], verbose: bool = False
                    ) -> subprocess.CompletedProcess:
    """Compile the op against the installed Paddle into ``target``; ``rpath``: where it finds ``libpaddle.so``
    at run time. Returns the finished process (its output captured unless ``verbose``)."""
    from paddle.utils.cpp_extension import extension_utils as paddle_ext

    includes = [f"-I{d}" for d in (*paddle_ext.find_paddle_includes(), *paddle_ext.find_python_includes())]
    links = [f"-L{d}" for d in paddle_dirs()] + [f"-Wl,-rpath,{d}" for d in rpath]
    command = [cxx, *CXXFLAGS, *includes, str(SOURCE), "-o", str(target), *links,
               "-Wl,--no-as-needed", "-l:libpaddle.so", "-Wl,--as-needed"]
    return subprocess.run(command, capture_output=not verbose, text=True)
