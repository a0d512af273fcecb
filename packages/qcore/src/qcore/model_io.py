"""Loading and saving Paddle inference models in every on-disk format a Paddle user has.

Formats (``model_filename`` / ``params_filename`` keep PaddleSlim's meaning):

* PIR: ``*.json`` + ``*.pdiparams`` (Paddle 3's default).
* Legacy ProgramDesc: ``*.pdmodel`` + ``*.pdiparams``; ``__model__`` + ``__params__``;
  ``__model__`` + one file per parameter (``params_filename=None``).

A loaded :class:`Model` owns its own scope, so loading never touches another model's
parameters, and nothing here ever writes to the input files. :func:`save_model` writes through
:func:`qcore.outputs.staged_output`: the output directory always holds the old model or the new one.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import paddle

from .custom_ops import register_custom_ops
from .diagnose import is_legacy_program, is_onnx_file, load_problem, onnx_input, truncation
from .errors import ModelFormatError, OutputError
from .model_files import ModelFiles
from .outputs import check_file_name, check_output_dir, repair, staged_output
from .paddle_env import FAMILIES, Family, cpu_executor, load_notice_hidden, static_mode
from .zero_points import park_zero_points, unfold_zero_points, unpark_zero_points

PARAMS_SUFFIX = ".pdiparams"
MODEL_SUFFIX = {"pir": ".json", "legacy": ".pdmodel"}


@dataclass
class Model:
    """An inference program, its feed names and fetch targets, and the scope holding its weights."""

    program: Any
    feed_names: list[str]
    fetch_targets: list[Any]
    scope: paddle.static.Scope
    family: Family
    source: ModelFiles | None = None
    executor: paddle.static.Executor = field(default_factory=cpu_executor)

    def run(self, feed: dict[str, np.ndarray], fetch_list: list[Any] | None = None) -> list[np.ndarray]:
        """Run the program in ``paddle.static.Executor``; returns the fetched arrays."""
        with static_mode(self.family, self.scope):
            return self.executor.run(
                self.program, feed=feed, fetch_list=fetch_list or self.fetch_targets, return_numpy=True
            )

    def feed_specs(self) -> dict[str, tuple[tuple[int, ...], str]]:
        """``{feed_name: (shape, dtype)}`` as the program declares them (-1 for a free dimension)."""
        specs = {}
        for name, var in zip(self.feed_names, _feed_vars(self)):
            dtype = str(var.dtype).split(".")[-1].replace("paddle.", "")
            specs[name] = (tuple(int(d) for d in var.shape), dtype)
        return specs


def _family_of(model_file: Path) -> Family:
    with open(model_file, "rb") as f:
        head = f.read(64).lstrip()
    if head.startswith(b"{"):
        return "pir"
    if model_file.suffix == ".json" and is_legacy_program(model_file):
        raise ModelFormatError(
            f"{model_file} is a legacy ProgramDesc, not a PIR program: rename it to {model_file.stem}.pdmodel "
            "(Paddle picks the IR from the suffix)"
        )
    return "pir" if model_file.suffix == ".json" else "legacy"


def _only(candidates: list[Path], what: str, where: Path) -> Path | None:
    if len(candidates) > 1:
        names = ", ".join(sorted(p.name for p in candidates))
        raise ModelFormatError(f"{where} holds several {what} files ({names}); pass model_filename to choose one")
    return candidates[0] if candidates else None


def find_model_files(
    path: str | os.PathLike[str], model_filename: str | None = None, params_filename: str | None = None
) -> ModelFiles:
    """Resolve a model directory, path prefix or model file to the files to load.

    A save a kill interrupted in that directory is finished first (:func:`qcore.outputs.repair`).
    """
    path = Path(path)
    repair(path if path.is_dir() else path.parent)
    if model_filename is not None:
        model_file = path / model_filename
        for suffix in (".pdmodel", ".json"):
            if not model_file.exists() and (path / (model_filename + suffix)).exists():
                model_file = path / (model_filename + suffix)
    elif path.is_file():
        model_file = path
    elif not path.is_dir():
        prefixed = [Path(str(path) + s) for s in (".json", ".pdmodel")]
        found = [p for p in prefixed if p.exists()]
        if not found and Path(str(path) + ".onnx").is_file():
            raise ModelFormatError(onnx_input(Path(str(path) + ".onnx")))
        if not found:
            raise ModelFormatError(
                f"model not found: {path} is neither a directory, a model file nor a path prefix "
                "of <prefix>.json / <prefix>.pdmodel; check the path"
            )
        model_file = found[0]
    else:
        model_file = (
            (path / "__model__" if (path / "__model__").exists() else None)
            or _only(sorted(path.glob("*.json")), "*.json model", path)
            or _only(sorted(path.glob("*.pdmodel")), "*.pdmodel model", path)
        )
        if model_file is None:
            onnx = sorted(path.glob("*.onnx"))
            if onnx:
                raise ModelFormatError(f"no Paddle model in {path}; " + onnx_input(onnx[0]))
            raise ModelFormatError(
                f"no model in {path}: expected *.json, *.pdmodel or __model__; "
                "pass model_filename if the model file has another name"
            )
    if not model_file.is_file():
        raise ModelFormatError(f"model file not found: {model_file}; check model_dir and model_filename")
    if model_file.stat().st_size and is_onnx_file(model_file):
        raise ModelFormatError(onnx_input(model_file))
    if model_file.stat().st_size == 0:
        raise ModelFormatError(
            f"{model_file} is empty (0 bytes); copy the model file again from where the model was saved"
        )
    family = _family_of(model_file)
    if params_filename is not None:
        params_file: Path | None = model_file.parent / params_filename
        if not params_file.exists() and Path(str(params_file) + PARAMS_SUFFIX).exists():
            params_file = Path(str(params_file) + PARAMS_SUFFIX)
        if not params_file.is_file():
            raise ModelFormatError(f"params file not found: {params_file}; check params_filename")
    else:
        guesses = [model_file.with_suffix(PARAMS_SUFFIX), model_file.parent / "__params__"]
        params_file = next((g for g in guesses if g.is_file()), None)
        if params_file is None and family == "pir":
            raise ModelFormatError(f"no {model_file.stem}{PARAMS_SUFFIX} next to {model_file}; pass params_filename")
    return ModelFiles(model_file, params_file, family)


def _strip_pir_fetch_ops(program: Any) -> None:
    """Remove ``pd_op.fetch`` ops so other values can be fetched; save adds them back."""
    block = program.global_block()
    for op in list(block.ops):
        if op.name() == "pd_op.fetch":
            block.remove_op(op)


def translate_to_pir(legacy_program: Any) -> tuple[Any, list[Any]]:
    """Translate a loaded legacy inference program to PIR; returns it and its fetch targets.

    Feed ops become ``pd_op.data`` ops and fetch ops are removed, as for a loaded PIR model.
    Parameter names are kept, so the model's scope serves both programs.
    """
    program = paddle.pir.translate_to_pir(legacy_program.desc)
    block = program.global_block()
    fetch_targets = []
    for op in list(block.ops):
        if op.name() == "pd_op.feed":
            fed = op.result(0)
            with block:
                data = paddle.static.data(op.attrs()["name"], fed.shape, fed.dtype)
            fed.replace_all_uses_with(data)
            data.get_defining_op().move_before(op)
            block.remove_op(op)
        elif op.name() == "pd_op.fetch":
            fetch_targets.append(op.operand_source(0))
            block.remove_op(op)
    return program, fetch_targets


def load_model(
    path: str | os.PathLike[str] | ModelFiles,
    model_filename: str | None = None,
    params_filename: str | None = None,
    *,
    family: Family | None = None,
) -> Model:
    """Load an inference model in any supported format.

    ``path`` may also be the :class:`ModelFiles` :func:`find_model_files` resolved. A legacy
    model loads as a legacy program; pass ``family='pir'`` to translate it to PIR. A save a kill
    interrupted in the model's directory is finished first (:func:`qcore.outputs.repair`).
    """
    if isinstance(path, ModelFiles):
        repair(path.directory)
    files = path if isinstance(path, ModelFiles) else find_model_files(path, model_filename, params_filename)
    target = family or files.family
    if target not in FAMILIES:
        raise ModelFormatError(f"unknown family {target!r}; choose one of {FAMILIES}")
    if files.family == "pir" and target == "legacy":
        raise ModelFormatError(
            f"{files.model_file} is a PIR model; Paddle 3 cannot translate PIR back to a legacy "
            "ProgramDesc, so load it as family='pir'"
        )
    register_custom_ops(files.model_file)
    scope = paddle.static.Scope()
    exe = cpu_executor()
    with static_mode(files.family, scope), load_notice_hidden():
        try:
            program, feed_names, fetch_targets = paddle.static.load_inference_model(
                str(files.directory),
                exe,
                model_filename=files.model_file.name,
                params_filename=files.params_file.name if files.params_file else None,
            )
        except Exception as exc:  # Paddle raises bare RuntimeError/ValueError here
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise ModelFormatError(
                load_problem(files)
                or f"Paddle could not load {files.model_file} ({first}); is it a Paddle inference model "
                "and do model_filename/params_filename match the files?"
            ) from exc
        cut = truncation(files, program)  # Paddle loads a file cut inside its last tensor's data
        if cut is not None:
            raise ModelFormatError(cut)
        if files.family == "pir":
            _strip_pir_fetch_ops(program)
        elif not unpark_zero_points(program):  # saved with its shifts, or (earlier versions) without
            unfold_zero_points(program, scope)
    if files.family != target:
        with static_mode("pir", scope):
            program, fetch_targets = translate_to_pir(program)
    return Model(program, list(feed_names), list(fetch_targets), scope, target, files, exe)


def _feed_vars(model: Model) -> list[Any]:
    if model.family == "legacy":
        block = model.program.global_block()
        return [block.var(name) for name in model.feed_names]
    data_ops = {
        op.attrs()["name"]: op.result(0) for op in model.program.global_block().ops if op.name() == "pd_op.data"
    }
    return [data_ops[name] for name in model.feed_names]


#: Op attributes a saved inference program does not need: Python call stacks of the code that
#: built each op (1.1 of PP-OCR v2 cls's 1.6 MB program file). ``op_namescope`` stays: skip
#: patterns match it.
DEBUG_ATTRS = ("op_callstack",)


def _strip_debug_attrs(program: Any) -> None:
    for block in program.blocks:
        for op in block.ops:
            for name in DEBUG_ATTRS:
                if op.desc.has_attr(name):
                    op.desc.remove_attr(name)


def _write_legacy(model: Model, out_dir: Path, model_name: str, params_name: str | None) -> None:
    feeds, fetches = _feed_vars(model), model.fetch_targets
    program = paddle.static.normalize_program(model.program, feeds, fetches)  # a copy: the model keeps its attrs
    _strip_debug_attrs(program)
    park_zero_points(program, model.scope)
    (out_dir / model_name).write_bytes(paddle.static.io._serialize_program(program))
    if params_name is not None:
        blob = paddle.static.io._serialize_persistables(program, model.executor)
        (out_dir / params_name).write_bytes(blob)
    else:
        persistables = [v for v in program.list_vars() if v.persistable and v.name not in ("feed", "fetch")]
        paddle.static.io.save_vars(model.executor, str(out_dir), program, vars=persistables)


def _write_pir(model: Model, out_dir: Path, model_name: str, params_name: str) -> None:
    stem = out_dir / "model"
    paddle.static.save_inference_model(
        str(stem), _feed_vars(model), model.fetch_targets, model.executor, program=model.program
    )
    os.replace(str(stem) + ".json", out_dir / model_name)
    os.replace(str(stem) + PARAMS_SUFFIX, out_dir / params_name)


def output_filenames(family: Family, model_filename: str | None, params_filename: str | None) -> tuple[str, str | None]:
    """Default and validate the output file names for ``family``."""
    if model_filename is None:
        model_filename = "inference" + MODEL_SUFFIX[family]
        params_filename = params_filename or "inference" + PARAMS_SUFFIX
    if family == "pir":
        if not model_filename.endswith(".json"):
            raise ModelFormatError(
                f"a PIR model file must end in .json (got {model_filename!r}); Paddle decides the IR "
                "from the suffix. Use e.g. 'inference.json', or save in the legacy family"
            )
        params_filename = params_filename or Path(model_filename).stem + PARAMS_SUFFIX
    return model_filename, params_filename


def model_files_in(directory: Path) -> list[str]:
    """Names of the files in ``directory`` a loader could take for a model program."""
    if not directory.is_dir():
        return []
    names = [p.name for p in directory.iterdir() if p.is_file()]
    return sorted(
        n for n in names
        if n == "__model__" or n.endswith(".pdmodel") or (n.endswith(".json") and n[:-5] + PARAMS_SUFFIX in names)
    )  # fmt: skip


def check_model_output(
    save_dir: str | os.PathLike[str],
    family: Family,
    model_filename: str | None = None,
    params_filename: str | None = None,
    source: ModelFiles | None = None,
) -> tuple[str, str | None]:
    """Refuse, before any work, a model output that cannot be written safely; returns the file names.

    Refused (:class:`OutputError`): file names that leave the directory, an output that is a file,
    the input's directory or one holding it, and a directory holding another model under other
    names (a loader could pick the wrong one).
    """
    model_name, params_name = output_filenames(family, model_filename, params_filename)
    check_file_name(model_name, "model_filename")
    if params_name is not None:
        check_file_name(params_name, "params_filename")
    out = check_output_dir(save_dir, [source.directory] if source is not None else [])
    others = [n for n in model_files_in(out) if n != model_name]
    if others:
        raise OutputError(
            f"{out} already holds another model ({', '.join(others)}); remove it or choose another output directory"
        )
    return model_name, params_name


def save_model(
    model: Model,
    save_dir: str | os.PathLike[str],
    model_filename: str | None = None,
    params_filename: str | None = None,
    extra_files: Mapping[str, bytes] | None = None,
) -> ModelFiles:
    """Save ``model`` into ``save_dir`` safely (:mod:`qcore.outputs`) and return where it went.

    ``params_filename=None`` with a ``model_filename`` writes one file per parameter (legacy
    family only, as in PaddleSlim). The parameters are moved into place first, the program file
    last; other files in ``save_dir`` are left alone. :func:`check_model_output` runs first.
    ``extra_files`` (name -> bytes, e.g. the ONNX export a deployment target runs) are written with them.
    """
    model_name, params_name = check_model_output(save_dir, model.family, model_filename, params_filename, model.source)
    save_dir = Path(save_dir)
    with staged_output(save_dir, last=[model_name]) as staging, static_mode(model.family, model.scope):
        if model.family == "legacy":
            _write_legacy(model, staging, model_name, params_name)
        else:
            assert params_name is not None
            _write_pir(model, staging, model_name, params_name)
        for name, data in (extra_files or {}).items():
            (staging / check_file_name(name, "extra file")).write_bytes(data)
    return ModelFiles(save_dir / model_name, save_dir / params_name if params_name else None, model.family)


def export_layer(layer: Any, prefix: str | os.PathLike[str], input_spec: Any = None, family: Family = "pir") -> None:
    """``paddle.jit.save`` a ``paddle.nn.Layer`` as a ``family`` program (``<prefix>.json`` or ``.pdmodel``)."""
    if family not in FAMILIES:
        raise ModelFormatError(f"family={family!r} is not valid; valid choices: 'pir', 'legacy'")
    if family == "legacy":
        with paddle.pir_utils.DygraphOldIrGuard():
            paddle.jit.save(layer, str(prefix), input_spec=input_spec)
    else:
        paddle.jit.save(layer, str(prefix), input_spec=input_spec)
