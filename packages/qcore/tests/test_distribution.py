"""Install hints name qcore's own distribution: PyPI's ``qcore`` is another project, with no ``onnx`` extra."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

import qcore

PYPROJECT = (Path(__file__).resolve().parents[1] / "pyproject.toml").read_text(encoding="utf-8")


def test_the_onnx_install_hint_names_this_distribution_and_an_extra_it_has():
    """Both commands of the hint work before publication: the wheels through --find-links, or the clone's path."""
    wheels, clone = re.fullmatch(r"from the built wheels: (pip install --find-links dist .+); from a clone: "
                                 r"(pip install .+)", qcore.ONNX_INSTALL).groups()
    name = re.search(r'^name = "(.+)"$', PYPROJECT, re.M).group(1)
    assert wheels == f"pip install --find-links dist '{name}[onnx]'" and clone == "pip install 'packages/qcore[onnx]'"
    assert name == "paddle-quant-core" and re.search(r"^onnx = \[", PYPROJECT, re.M)


def test_missing_onnx_modules_are_reported_with_the_install_hint(monkeypatch):
    from qcore.deploy import get_target
    from qcore.errors import ExportError
    from qcore.export.paddle2onnx_float import require_onnx

    monkeypatch.setitem(sys.modules, "paddle2onnx", None)  # None in sys.modules: the import raises ImportError
    assert get_target("onnxruntime").unavailable() == (
        f"paddle2onnx is not installed, so no Paddle model can be exported ({qcore.ONNX_INSTALL})"
    )
    with pytest.raises(ExportError, match=re.escape(f"install it with: {qcore.ONNX_INSTALL}")):
        require_onnx()
    monkeypatch.setitem(sys.modules, "onnxruntime", None)
    hint = get_target("onnxruntime").unavailable()
    assert hint == f"onnxruntime is not installed ({qcore.ONNX_INSTALL})"
