"""``examples/ppocr_int8.py --help`` says what the script does: every option has a help text, and ``--algo``'s
default is what ``quantize_ppocr`` passes to ``quant_post_static`` for each model and runtime (read here by
recording the calls, without RapidOCR or any model)."""

from __future__ import annotations

import importlib.util
import inspect
import subprocess
import sys
from pathlib import Path

import pytest

from qptq import quant_post_static

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "ppocr_int8.py"


@pytest.fixture(scope="module")
def example():
    spec = importlib.util.spec_from_file_location("ppocr_int8", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _algos(example, monkeypatch, tmp_path, runtime: str, algo: str | None) -> dict[str, str]:
    """{role: the algo quant_post_static gets, or 'float' for a model written as it is} for one run."""
    default = inspect.signature(quant_post_static).parameters["algo"].default
    used = {}
    monkeypatch.setattr(example, "quantize_model", lambda model, batches, rt, out, **options: used.setdefault(
        model.name, options.get("algo", default)))
    monkeypatch.setattr(example, "export_onnx", lambda model, path: used.setdefault(model.name, "float"))
    example.quantize_ppocr({role: [] for role in example.MODELS}, runtime, tmp_path / "out", models=tmp_path,
                           algo=algo)
    return {role: used[folder] for role, (folder, _, _) in example.MODELS.items()}


def test_the_help_states_the_algo_each_model_gets(example, monkeypatch, tmp_path):
    ort = _algos(example, monkeypatch, tmp_path, "onnxruntime", None)
    ov = _algos(example, monkeypatch, tmp_path, "openvino-runtime", None)
    assert ort == {"det": "auto", "cls": "KL", "rec": "KL"} and ov == {"det": "auto", "cls": "float", "rec": "KL"}
    assert example.algo_defaults() == "det auto; cls KL on onnxruntime, float on openvino-runtime; rec KL"
    given = _algos(example, monkeypatch, tmp_path, "openvino-runtime", "mse")
    assert given == {"det": "mse", "cls": "float", "rec": "mse"}  # --algo: every model quantized; float stays


def test_every_option_has_a_help_text(example):
    parser = example.build_parser()
    assert all(action.help for action in parser._actions), [a.dest for a in parser._actions if not a.help]
    text = subprocess.run([sys.executable, str(EXAMPLE), "--help"], capture_output=True, text=True, timeout=300,
                          check=True).stdout
    flat = " ".join(text.split())
    assert f"default: {example.algo_defaults()}" in flat
    assert "its default" not in flat  # the old text, wrong for det
