"""Install hints name qcore's own distribution: PyPI's ``qcore`` is another project, with no ``onnx`` extra."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

import qcore

PYPROJECT = (Path(__file__).resolve().parents[1] / "pyproject.toml").read_text(encoding="utf-8")


def test_the_onnx_install_hint_names_this_distribution_and_an_extra_it_has():
    match = re.fullmatch(r"pip install '([a-z-]+)\[([a-z]+)\]'", qcore.ONNX_INSTALL)
    assert match is not None, qcore.ONNX_INSTALL
    assert match.group(1) == re.search(r'^name = "(.+)"$', PYPROJECT, re.M).group(1) == "paddle-quant-core"
    assert re.search(rf"^{match.group(2)} = \[", PYPROJECT, re.M)


def test_missing_onnx_modules_are_reported_with_the_install_hint(monkeypatch):
    from qcore.deploy import get_target
    from qcore.errors import ExportError
    from qcore.export.paddle2onnx_float import require_onnx

    monkeypatch.setitem(sys.modules, "paddle2onnx", None)  # None in sys.modules: the import raises ImportError
    assert get_target("onnxruntime").unavailable() == (
        "paddle2onnx is not installed, so no Paddle model can be exported (pip install 'paddle-quant-core[onnx]')"
    )
    with pytest.raises(ExportError, match=re.escape("install it with: pip install 'paddle-quant-core[onnx]'")):
        require_onnx()
    monkeypatch.setitem(sys.modules, "onnxruntime", None)
    hint = get_target("onnxruntime").unavailable()
    assert hint == "onnxruntime is not installed (pip install 'paddle-quant-core[onnx]')"
