"""``examples/ppocr_int8.py`` holds no per-model recipe: every model goes through ``quant_post_static(...,
algo="auto")`` and the decision comes back from the report (read here by recording the calls, without RapidOCR
or any model); ``--help`` says what the script does."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "ppocr_int8.py"


@pytest.fixture(scope="module")
def example():
    spec = importlib.util.spec_from_file_location("ppocr_int8", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_model_gets_auto_and_a_float_decision_uses_the_float_file(example, monkeypatch, tmp_path):
    used = {}
    whole_float = {"algo": "auto", "deploy_backend": "onnxruntime",
                   "auto": {"model": "float", "why": "onnxruntime: int8 cannot be faster than float"}}
    some_float = {"algo": "auto", "deploy_backend": "onnxruntime", "auto": {
        "held_out": {"mean": 0.01, "standard_error": 0.001, "batches": 5, "of": 20, "unseen": True},
        "budget": {"metric": "top-1 changed", "max": 0.01, "met": True},
        "float_layers": {"3 depthwise_conv2d a": "onnxruntime: slower in int8", "7 conv2d b": "accuracy: ..."}}}

    def quantize_model(model, batches, runtime, out, **options):
        used[model.name] = options
        return out / "inference.onnx", whole_float if "cls" in model.name else some_float

    monkeypatch.setattr(example, "quantize_model", quantize_model)
    monkeypatch.setattr(example, "package_dir", lambda name: tmp_path / name)  # no RapidOCR installed here
    files, decisions = example.quantize_ppocr({role: [] for role in example.MODELS}, "onnxruntime", tmp_path)
    assert all(options == {"algo": "auto"} for options in used.values()) and len(used) == 3
    assert files["cls"] == example.float_onnx("cls") and files["rec"] == tmp_path / "rec" / "inference.onnx"
    assert decisions["cls"] == ("float", "onnxruntime: int8 cannot be faster than float")
    result, why = decisions["rec"]
    assert result == "int8, 2 layers float" and why.startswith(
        "1 for speed, 1 for accuracy; top-1 changed 0.01 +- 0.001 on 5 held-out batches (budget 0.01)")


def test_the_example_holds_no_table_of_model_names(example):
    source = EXAMPLE.read_text()
    assert not hasattr(example, "RECIPE") and "quantizable_op_type" not in source
    assert not re.search(r"\(\s*\"(det|cls|rec)\"\s*,\s*\"(onnxruntime|openvino)", source)


def test_every_option_has_a_help_text(example):
    parser = example.build_parser()
    assert all(action.help for action in parser._actions), [a.dest for a in parser._actions if not a.help]
    text = subprocess.run([sys.executable, str(EXAMPLE), "--help"], capture_output=True, text=True, timeout=300,
                          check=True).stdout
    assert "default: auto" in " ".join(text.split())
