"""Output writing that never loses a user's file (qcore.outputs, qcore.model_io.save_model)."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from qcore.errors import OutputError
from qcore.inference import predict
from qcore.model_io import ModelFiles, find_model_files, load_model, save_model
from qcore.outputs import COMPLETE, STAGING_PREFIX, check_file_name, locked, repair, staged_output
from qdemo.testing import make_tiny_net, save_tiny_net


@pytest.fixture(scope="module")
def two_models(tmp_path_factory):
    """Two different tiny nets saved as legacy .pdmodel models, and their outputs on one input."""
    root = tmp_path_factory.mktemp("two")
    x = np.random.default_rng(0).standard_normal((2, 1, 8, 8)).astype(np.float32)
    models = []
    for seed in (0, 1):
        save_tiny_net(make_tiny_net(seed), root / f"m{seed}", "legacy_pdmodel")
        model = load_model(root / f"m{seed}")
        models.append((model, model.run({"x": x})[0]))
    return models, x


def _state(directory: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(directory.iterdir()) if p.is_file()}


def _runs_as(directory: Path, x: np.ndarray, expected: np.ndarray) -> bool:
    return np.allclose(load_model(directory).run({"x": x})[0], expected, atol=1e-6)


def test_the_current_directory_as_output_keeps_its_files_inode_and_mode(two_models, tmp_path, monkeypatch):
    model = two_models[0][0][0]
    work = tmp_path / "work"
    work.mkdir(mode=0o755)
    (work / "notes.txt").write_text("mine")
    before = work.stat()
    monkeypatch.chdir(work)
    files = save_model(model, ".")
    after = work.stat()
    assert (after.st_ino, after.st_mode) == (before.st_ino, before.st_mode)
    assert (work / "notes.txt").read_text() == "mine"
    assert sorted(p.name for p in work.iterdir()) == ["inference.pdiparams", "inference.pdmodel", "notes.txt"]
    assert files.model_file.resolve() == (work / "inference.pdmodel").resolve()


def test_new_files_follow_the_umask(two_models, tmp_path):
    model = two_models[0][0][0]
    old = os.umask(0o027)
    try:
        files = save_model(model, tmp_path / "out")
    finally:
        os.umask(old)
    assert {p.stat().st_mode & 0o777 for p in (files.model_file, files.params_file)} == {0o640}
    assert (tmp_path / "out").stat().st_mode & 0o777 == 0o750


def test_bad_outputs_are_refused_before_anything_is_written(two_models, tmp_path):
    model = two_models[0][0][0]
    existing = tmp_path / "a_file"
    existing.write_text("keep me")
    with pytest.raises(OutputError, match="is an existing file, not a directory"):
        save_model(model, existing)
    assert existing.read_text() == "keep me"
    with pytest.raises(OutputError, match="holds the input"):
        save_model(model, model.source.directory)
    with pytest.raises(OutputError, match="holds the input"):
        save_model(model, model.source.directory.parent)
    for bad in ("../evil.pdiparams", "sub/p.pdiparams", "..", ""):
        with pytest.raises(OutputError, match="plain file name"):
            save_model(model, tmp_path / "out", "m.pdmodel", bad)
    assert not (tmp_path / "evil.pdiparams").exists() and not (tmp_path / "out").exists()
    other = tmp_path / "other"
    other.mkdir()
    (other / "__model__").write_bytes(b"old program")
    with pytest.raises(OutputError, match=r"already holds another model \(__model__\)"):
        save_model(model, other)
    assert sorted(p.name for p in other.iterdir()) == ["__model__"]


def test_saving_twice_gives_the_same_bytes_and_no_litter(two_models, tmp_path):
    model = two_models[0][0][0]
    save_model(model, tmp_path / "out")
    first = _state(tmp_path / "out")
    save_model(model, tmp_path / "out")
    assert _state(tmp_path / "out") == first
    assert not list((tmp_path / "out").glob(".*"))


def test_a_failed_write_changes_nothing(two_models, tmp_path):
    (model0, ref0), _ = two_models[0]
    x = two_models[1]
    save_model(model0, tmp_path / "out")
    before = _state(tmp_path / "out")
    with pytest.raises(RuntimeError, match="disk full"):  # noqa: PT012
        with staged_output(tmp_path / "out", last=["inference.pdmodel"]) as staging:
            (staging / "inference.pdiparams").write_bytes(b"half")
            raise RuntimeError("disk full")
    assert _state(tmp_path / "out") == before and _runs_as(tmp_path / "out", x, ref0)
    assert not list((tmp_path / "out").glob(STAGING_PREFIX + "*"))


KILLER = textwrap.dedent("""
    import os, sys
    import qcore.outputs as outputs
    from qcore.model_io import load_model, save_model
    calls, kill_at = [0], int(sys.argv[3])
    real = os.replace
    def replace(src, dst):
        if calls[0] == kill_at:
            os._exit(9)  # as SIGKILL: no cleanup runs
        calls[0] += 1
        real(src, dst)
    outputs.os.replace = replace
    if kill_at < 0:  # killed while the new files are still being written
        outputs._commit = lambda *args: os._exit(9)
    save_model(load_model(sys.argv[1]), sys.argv[2])
""")


# os.replace calls of a save: 0 the staging's completion marker, 1 the params, 2 the program
@pytest.mark.parametrize("kill_at", [-1, 0, 1, 2])  # while staging, at the marker, before the params, the program
def test_a_run_killed_at_any_step_never_leaves_a_mixed_model(two_models, tmp_path, kill_at):
    (model0, ref0), (model1, ref1) = two_models[0]
    x = two_models[1]
    out = tmp_path / "out"
    save_model(model0, out)
    script = tmp_path / "killer.py"
    script.write_text(KILLER)
    run = subprocess.run(
        [sys.executable, str(script), str(model1.source.directory), str(out), str(kill_at)],
        capture_output=True,
        text=True,
    )
    assert run.returncode == 9, run.stderr
    staged = list(out.glob(STAGING_PREFIX + "*"))
    assert len(staged) == 1  # the killed run's staging is left ...
    if kill_at <= 0:
        assert _runs_as(out, x, ref0)  # nothing moved yet: the old model is whole, the staging discarded
    else:
        assert (staged[0] / COMPLETE).is_file()
        assert not (out / "inference.pdmodel").exists()  # the old program went before any new file landed
        assert _runs_as(out, x, ref1)  # the next reader finished the moves
    assert not list(out.glob(STAGING_PREFIX + "*"))  # ... and the next touch removes it
    save_model(model1, out)
    assert _runs_as(out, x, ref1)


def _interrupt_the_moves(monkeypatch, model, out: Path) -> Path:
    """Save ``model`` into ``out`` with the program's move failing, as a kill there would stop it."""
    real, calls = os.replace, []

    def replace(src, dst):
        calls.append(dst)
        if len(calls) == 3:  # the marker, the params, then the program
            raise KeyboardInterrupt
        real(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    with pytest.raises(KeyboardInterrupt):
        save_model(model, out)
    monkeypatch.undo()
    (staging,) = out.glob(STAGING_PREFIX + "*")
    assert (staging / COMPLETE).is_file() and (staging / "inference.pdmodel").is_file()
    assert sorted(p.name for p in out.iterdir()) == [staging.name, "inference.pdiparams"]  # no loadable model
    return staging


@pytest.mark.parametrize("touch", ["load_model", "create_predictor", "writer"])
def test_the_next_touch_finishes_an_interrupted_commit(two_models, tmp_path, monkeypatch, touch):
    (model0, _), (model1, ref1) = two_models[0]
    x = two_models[1]
    out = tmp_path / "out"
    save_model(model0, out)
    _interrupt_the_moves(monkeypatch, model1, out)
    if touch == "load_model":
        np.testing.assert_allclose(load_model(out).run({"x": x})[0], ref1, atol=1e-6)
    elif touch == "create_predictor":
        files = ModelFiles(out / "inference.pdmodel", out / "inference.pdiparams", "legacy")
        np.testing.assert_allclose(predict(files, {"x": x}, backend="native")[0], ref1, atol=1e-4)
    else:
        with staged_output(out) as staging:
            (staging / "notes.txt").write_text("another output")
        assert (out / "notes.txt").read_text() == "another output"
        assert _runs_as(out, x, ref1)
    assert sorted(p.name for p in out.iterdir()) == ["inference.pdiparams", "inference.pdmodel"] + (
        ["notes.txt"] if touch == "writer" else []
    )


def test_a_half_written_staging_is_discarded_and_the_old_model_stays(two_models, tmp_path):
    (model0, ref0), _ = two_models[0]
    x = two_models[1]
    out = tmp_path / "out"
    save_model(model0, out)
    before = _state(out)
    staging = out / (STAGING_PREFIX + "killed")
    staging.mkdir()
    (staging / "inference.pdiparams").write_bytes(b"half")  # killed while writing: no marker
    assert _runs_as(out, x, ref0)
    assert not staging.exists() and _state(out) == before


def test_a_live_writers_staging_is_left_alone(two_models, tmp_path, monkeypatch):
    (model0, ref0), (model1, ref1) = two_models[0]
    x = two_models[1]
    out = tmp_path / "out"
    save_model(model0, out)
    staging = _interrupt_the_moves(monkeypatch, model1, out)
    with locked(out):  # a writer at work holds the lock: its staging is not a killed run's
        repair(out)
        assert staging.is_dir() and not (out / "inference.pdmodel").exists()
    repair(out)
    assert not staging.exists() and _runs_as(out, x, ref1)


WRITER = textwrap.dedent("""
    import sys
    from qcore.model_io import load_model, save_model
    model = load_model(sys.argv[1])
    for _ in range(int(sys.argv[3])):
        save_model(model, sys.argv[2])
""")


def test_concurrent_writers_take_turns(two_models, tmp_path):
    (model0, ref0), (model1, ref1) = two_models[0]
    x = two_models[1]
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    out = tmp_path / "out"
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), str(m.source.directory), str(out), "3"], stderr=subprocess.PIPE, text=True
        )
        for m in (model0, model1)
    ]
    for proc in procs:
        assert proc.wait(timeout=300) == 0, proc.stderr.read()
    files = find_model_files(out)
    assert _runs_as(out, x, ref0) or _runs_as(out, x, ref1), files
    assert sorted(p.name for p in out.iterdir()) == ["inference.pdiparams", "inference.pdmodel"]


def test_file_names_must_stay_inside_the_output():
    assert check_file_name("inference.pdiparams", "params_filename") == "inference.pdiparams"
    with pytest.raises(OutputError, match=r"params_filename='/tmp/x' must be a plain file name"):
        check_file_name("/tmp/x", "params_filename")
