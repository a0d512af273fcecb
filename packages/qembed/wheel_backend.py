"""PEP 517 backend of paddle-quant-embed: setuptools', plus the compiled ``qembed_lookup`` when asked.

``uv build --wheel -C ship-op=true`` (what ``nox -s build`` runs on the sdist) installs the Paddle that the
``fused`` extra pins into the build environment, compiles ``src/qembed/csrc/lookup.cc`` against it with
``src/qembed/cxx.py`` (no ``-march``: AVX-512, AVX2 and baseline code paths, one chosen at run time) and puts
``qembed/lib/qembed_lookup.so`` and ``qembed_lookup.json`` (the Paddle version it is built for) into a wheel
tagged for the building Python and ``linux_x86_64``. Without the setting the wheel is pure Python, like the sdist.
"""

from __future__ import annotations

import importlib.util
import json
import platform
import shutil
import sys
from pathlib import Path
from types import ModuleType
from typing import Any, Optional

from setuptools import build_meta
from setuptools.build_meta import (  # noqa: F401  (hooks used as setuptools has them: sdist, editable installs)
    build_editable,
    build_sdist,
    get_requires_for_build_editable,
    get_requires_for_build_sdist,
    prepare_metadata_for_build_editable,
    prepare_metadata_for_build_wheel,
)

SETTING = "ship-op"
ROOT = Path(__file__).resolve().parent
LIB = ROOT / "src" / "qembed" / "lib"
# The wheel's library sits in site-packages/qembed/lib/, Paddle's in site-packages/paddle/{base,libs}/.
RPATH = ("$ORIGIN/../../paddle/base", "$ORIGIN/../../paddle/libs")
Settings = Optional[dict]


def _ship(config_settings: Settings) -> bool:
    value = (config_settings or {}).get(SETTING, "false")
    if value not in ("true", "false"):
        raise ValueError(f"{SETTING}={value!r}: give true or false")
    if value == "true" and (sys.platform != "linux" or platform.machine() != "x86_64"):
        raise RuntimeError(f"{SETTING}=true builds the Linux x86-64 wheel; this is {sys.platform} "
                           f"{platform.machine()}")
    return value == "true"


def _ours_removed(config_settings: Settings) -> Settings:
    return {k: v for k, v in (config_settings or {}).items() if k != SETTING} or None


def paddle_pin() -> str:
    """The ``fused`` extra's requirement, ``paddlepaddle==X.Y.Z``: the Paddle the shipped op is built for."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python < 3.11 (the build requires tomli there)
        import tomli as tomllib
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    (pin,) = project["optional-dependencies"]["fused"]
    return pin


def get_requires_for_build_wheel(config_settings: Settings = None) -> list[str]:
    ours = [paddle_pin()] if _ship(config_settings) else []
    return build_meta.get_requires_for_build_wheel(_ours_removed(config_settings)) + ours


def build_wheel(wheel_directory: str, config_settings: Settings = None, metadata_directory: str | None = None) -> str:
    if not _ship(config_settings):
        return build_meta.build_wheel(wheel_directory, _ours_removed(config_settings), metadata_directory)
    _compile_into_lib()
    try:
        return build_meta.build_wheel(wheel_directory, _ours_removed(config_settings), metadata_directory)
    finally:
        shutil.rmtree(LIB)  # the source tree stays as it was (setup.py tags the wheel by this folder)


def _cxx() -> ModuleType:
    """``qembed.cxx`` loaded by path (importing the package would need qcore)."""
    spec = importlib.util.spec_from_file_location("qembed_cxx", ROOT / "src" / "qembed" / "cxx.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _compile_into_lib() -> None:
    import paddle

    wanted = paddle_pin().split("==", 1)[1]
    if paddle.__version__ != wanted:
        raise RuntimeError(f"the build environment has Paddle {paddle.__version__}, the fused extra pins {wanted} "
                           "(build with isolation: uv build / python -m build)")
    cxx = _cxx()
    compiler = cxx.compiler()
    if compiler is None:
        raise RuntimeError(f"{SETTING}=true needs a C++17 compiler (set $CXX or install g++)")
    LIB.mkdir(exist_ok=True)
    done = cxx.compile_library(compiler, LIB / "qembed_lookup.so", RPATH, verbose=True)
    if done.returncode != 0:
        shutil.rmtree(LIB)
        raise RuntimeError(f"compiling {cxx.SOURCE.name} failed ({compiler} exit {done.returncode})")
    manifest: dict[str, Any] = {"paddle": paddle.__version__, "python": platform.python_version(),
                                "flags": list(cxx.CXXFLAGS), "code_paths": ["avx512", "avx2", "x86-64"]}
    (LIB / "qembed_lookup.json").write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")
