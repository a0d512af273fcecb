from __future__ import annotations

import os
import shutil

import numpy as np
import pytest

from qcore.diagnose import is_legacy_program, is_onnx_file
from qcore.errors import ModelFormatError, OutputError
from qcore.inference import predict
from qcore.model_io import find_model_files, load_model, save_model
from qdemo.testing import EMBEDDING_INPUT_SPEC, TinyEmbeddingNet, save_tiny_net


def test_every_format_loads_and_matches_float(tiny_model, tiny_net, tiny_input, tiny_reference):
    directory, kwargs, fmt = tiny_model
    model = load_model(directory, **kwargs)
    assert model.family == ("pir" if fmt == "pir" else "legacy")
    assert model.feed_names == ["x"]
    np.testing.assert_allclose(model.run({"x": tiny_input})[0], tiny_reference, atol=1e-5)
    assert model.feed_specs() == {"x": ((-1, *tiny_input.shape[1:]), "float32")}
    resolved = load_model(model.source)  # the ModelFiles a load resolved loads the same model
    np.testing.assert_array_equal(resolved.run({"x": tiny_input})[0], model.run({"x": tiny_input})[0])
    params = sum(int(np.prod(v.shape)) for v in tiny_net.state_dict().values()) * 4
    assert params <= model.source.params_bytes <= params + 4096  # float32 data plus headers


def test_legacy_translates_to_pir_on_request(tiny_model, tiny_input, tiny_reference):
    directory, kwargs, fmt = tiny_model
    model = load_model(directory, **kwargs, family="pir")
    assert model.family == "pir"
    assert "pd_op.conv2d" in [op.name() for op in model.program.global_block().ops]
    np.testing.assert_allclose(model.run({"x": tiny_input})[0], tiny_reference, atol=1e-5)


@pytest.mark.parametrize(
    "names", [(None, None), ("__model__", "__params__"), ("__model__", None), ("net.pdmodel", "net.pdiparams")]
)
def test_legacy_save_round_trip_in_each_layout(tiny_model, tiny_input, tiny_reference, tmp_path, names):
    directory, kwargs, fmt = tiny_model
    if fmt != "legacy_pdmodel":
        pytest.skip("one legacy source is enough for the save layouts")
    files = save_model(load_model(directory, **kwargs), tmp_path / "out", *names)
    assert files.model_file.is_file()
    if names[1] is None and names[0] is not None:
        assert files.params_file is None
        assert (tmp_path / "out" / "conv2d_0.w_0").is_file()  # one file per parameter
    again = load_model(tmp_path / "out", *names)
    np.testing.assert_allclose(again.run({"x": tiny_input})[0], tiny_reference, atol=1e-5)
    out = predict(files if files.params_file else find_model_files(tmp_path / "out", *names), {"x": tiny_input})
    np.testing.assert_allclose(out[0], tiny_reference, atol=1e-4)


def test_pir_save_round_trip_and_inference(tiny_model, tiny_input, tiny_reference, tmp_path):
    directory, kwargs, fmt = tiny_model
    if fmt != "pir":
        pytest.skip("PIR source only")
    files = save_model(load_model(directory), tmp_path / "out")
    assert files.model_file.name == "inference.json"
    np.testing.assert_allclose(predict(files, {"x": tiny_input})[0], tiny_reference, atol=1e-4)


def test_save_never_touches_input_and_replaces_old_output(tiny_model, tmp_path):
    directory, kwargs, fmt = tiny_model
    before = {p: os.path.getmtime(directory / p) for p in os.listdir(directory)}
    model = load_model(directory, **kwargs)
    with pytest.raises(OutputError, match="holds the input"):
        save_model(model, directory)
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    save_model(model, out)
    save_model(model, out)
    assert (out / "notes.txt").read_text() == "keep me"
    assert not [p for p in os.listdir(tmp_path) if ".tmp-" in p or ".old-" in p]
    assert not [p for p in os.listdir(out) if p.startswith(".")]
    assert {p: os.path.getmtime(directory / p) for p in os.listdir(directory)} == before


def test_failed_save_leaves_old_model_intact(tiny_model, tmp_path, monkeypatch):
    directory, kwargs, fmt = tiny_model
    model = load_model(directory, **kwargs)
    out = tmp_path / "out"
    files = save_model(model, out)
    old = files.model_file.read_bytes()
    import qcore.model_io as io

    def boom(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(io, "_write_legacy", boom)
    monkeypatch.setattr(io, "_write_pir", boom)
    with pytest.raises(OSError, match="disk full"):
        save_model(model, out)
    assert files.model_file.read_bytes() == old
    assert sorted(os.listdir(tmp_path)) == ["out"]


def test_pir_output_name_must_end_in_json(tiny_model, tmp_path):
    directory, kwargs, fmt = tiny_model
    if fmt != "pir":
        pytest.skip("PIR source only")
    with pytest.raises(ModelFormatError, match=r"must end in \.json"):
        save_model(load_model(directory), tmp_path / "o", "__model__", "__params__")


def test_bad_paths_give_one_line_errors(tmp_path):
    with pytest.raises(ModelFormatError, match="model not found"):
        load_model(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelFormatError, match="no model in"):
        load_model(tmp_path / "empty")
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "m.pdmodel").write_bytes(b"not a program")
    with pytest.raises(ModelFormatError, match="could not load"):
        load_model(tmp_path / "junk")
    (tmp_path / "two").mkdir()
    for n in ("a.json", "b.json"):
        (tmp_path / "two" / n).write_text("{}")
    with pytest.raises(ModelFormatError, match="several"):
        load_model(tmp_path / "two")


def test_onnx_files_are_told_apart_from_paddle_programs(tiny_model, tmp_path):
    """By suffix or by ModelProto's first bytes (ir_version, then another field); no Paddle program file of any
    format starts that way, so every one still loads."""
    directory, kwargs, _ = tiny_model
    files = find_model_files(directory, kwargs["model_filename"], kwargs["params_filename"])
    assert not is_onnx_file(files.model_file)
    for head in (b"\x08\x07\x3a\x04", b"\x08\x08\x12\x05paddle", b"\x08\x0a\x42\x02"):
        (tmp_path / "model.bin").write_bytes(head + bytes(8))
        assert is_onnx_file(tmp_path / "model.bin"), head
        with pytest.raises(ModelFormatError, match="model.bin is an ONNX model: this toolkit quantizes Paddle"):
            find_model_files(tmp_path / "model.bin")
    for head in (b"\x0a\x10", b"{", b"\x08\x07\x99"):
        (tmp_path / "model.bin").write_bytes(head + bytes(8))
        assert not is_onnx_file(tmp_path / "model.bin"), head


@pytest.fixture(scope="module")
def other_model(tmp_path_factory):
    """A different net (an embedding lookup) saved as PIR and as a legacy .pdmodel: {format: directory}."""
    root = tmp_path_factory.mktemp("other")
    net = TinyEmbeddingNet()
    for fmt in ("pir", "legacy_pdmodel"):
        save_tiny_net(net, root / fmt, fmt, EMBEDDING_INPUT_SPEC)
    return {fmt: root / fmt for fmt in ("pir", "legacy_pdmodel")}


def _broken_copy(tiny_model, tmp_path):
    """A copy of the tiny model's directory to break, and its load kwargs."""
    directory, kwargs, fmt = tiny_model
    copy = tmp_path / fmt
    shutil.copytree(directory, copy)
    return copy, kwargs


#: The tiny net's parameters in the order Paddle stores them; linear_0.w_0 ([512, 10] float32) is
#: the last and takes 20507 bytes (27 of header), starting at byte 980 of the params file.
TINY_PARAMS = 9


@pytest.mark.parametrize(
    ("tiny_model", "params", "program"),
    [
        ("legacy_combined", "__params__", "__model__"),
        ("legacy_pdmodel", "inference.pdiparams", "inference.pdmodel"),
        ("pir", "inference.pdiparams", "inference.json"),
    ],
    indirect=["tiny_model"],
)
def test_truncated_params_name_the_parameter_that_does_not_fit(tiny_model, tmp_path, params, program):
    copy, kwargs = _broken_copy(tiny_model, tmp_path)
    whole = (copy / params).read_bytes()
    for cut, problem in [
        (2000, "parameter 'linear_0.w_0' needs 20507 bytes, 1020 left"),
        (1000, "in the header of parameter 'linear_0.w_0' (20 bytes left)"),
        (980, f"it ends after 8 of the {TINY_PARAMS} parameters {program} needs ('linear_0.w_0' is the first missing)"),
    ]:
        (copy / params).write_bytes(whole[:cut])
        with pytest.raises(ModelFormatError) as info:
            load_model(copy, **kwargs)
        assert str(info.value).startswith(f"{copy / params} is truncated: {problem}")
        assert str(info.value).endswith("; copy the params file again from where the model was saved")


@pytest.mark.parametrize(
    ("tiny_model", "params", "program"),
    [("legacy_combined", "__params__", "__model__"), ("legacy_pdmodel", "inference.pdiparams", "inference.pdmodel")],
    indirect=["tiny_model"],
)
def test_a_missing_params_file_is_named(tiny_model, tmp_path, params, program):
    copy, kwargs = _broken_copy(tiny_model, tmp_path)
    (copy / params).unlink()
    with pytest.raises(ModelFormatError) as info:
        load_model(copy)
    assert str(info.value) == (
        f"params file {copy / params} is missing: {program} needs {TINY_PARAMS} parameters and {copy} holds "
        "neither that file nor one file per parameter; copy the params file saved with the program next to it"
    )


@pytest.mark.parametrize("tiny_model", ["legacy_separate"], indirect=True)
def test_a_missing_parameter_file_is_named(tiny_model, tmp_path):
    copy, kwargs = _broken_copy(tiny_model, tmp_path)
    (copy / "conv2d_0.w_0").unlink()
    with pytest.raises(ModelFormatError) as info:
        load_model(copy, **kwargs)
    assert str(info.value) == (
        f"1 of the {TINY_PARAMS} parameter files __model__ needs is missing in {copy}: 'conv2d_0.w_0'; "
        "copy the files saved with the program next to it"
    )


@pytest.mark.parametrize("tiny_model", ["legacy_pdmodel", "pir"], indirect=True)
def test_params_of_another_model_name_the_first_parameter_that_differs(tiny_model, other_model, tmp_path):
    copy, kwargs = _broken_copy(tiny_model, tmp_path)
    fmt = tiny_model[2]
    shutil.copy(other_model[fmt] / "inference.pdiparams", copy / "inference.pdiparams")
    program = "inference.json" if fmt == "pir" else "inference.pdmodel"
    with pytest.raises(ModelFormatError) as info:
        load_model(copy, **kwargs)
    assert str(info.value) == (
        f"parameter 'batch_norm2d_0.b_0' in {copy / 'inference.pdiparams'} has shape [64, 16] (float32), "
        f"{program} expects [8] (float32): the params file belongs to another model; "
        "use the one saved with the program"
    )


@pytest.mark.parametrize("tiny_model", ["pir", "legacy_pdmodel"], indirect=True)
def test_bytes_after_the_last_parameter_are_named(tiny_model, tmp_path):
    copy, kwargs = _broken_copy(tiny_model, tmp_path)
    params = copy / "inference.pdiparams"
    params.write_bytes(params.read_bytes() + bytes(1024))
    with pytest.raises(ModelFormatError) as info:
        load_model(copy, **kwargs)
    assert str(info.value) == (
        f"{params} has 1024 bytes after the last of the program's {TINY_PARAMS} parameters "
        "(is it from another model?); use the params file saved with the program"
    )


@pytest.mark.parametrize("tiny_model", ["legacy_pdmodel"], indirect=True)
def test_a_legacy_program_under_a_json_name_is_named(tiny_model, tmp_path):
    copy, kwargs = _broken_copy(tiny_model, tmp_path)
    (copy / "inference.pdmodel").rename(copy / "inference.json")
    with pytest.raises(ModelFormatError) as info:
        load_model(copy)
    assert str(info.value) == (
        f"{copy / 'inference.json'} is a legacy ProgramDesc, not a PIR program: rename it to inference.pdmodel "
        "(Paddle picks the IR from the suffix)"
    )


@pytest.mark.parametrize(
    ("tiny_model", "program"), [("pir", "inference.json"), ("legacy_pdmodel", "inference.pdmodel")],
    indirect=["tiny_model"],
)
def test_an_empty_program_file_is_one_line(tiny_model, tmp_path, program):
    copy, _ = _broken_copy(tiny_model, tmp_path)
    (copy / program).write_bytes(b"")
    with pytest.raises(ModelFormatError) as info:
        load_model(copy)
    assert str(info.value) == (
        f"{copy / program} is empty (0 bytes); copy the model file again from where the model was saved")


def test_an_empty_file_is_no_legacy_program(tmp_path):
    (tmp_path / "inference.json").write_bytes(b"")
    assert is_legacy_program(tmp_path / "inference.json") is False
