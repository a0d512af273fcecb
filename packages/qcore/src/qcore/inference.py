"""Running a saved model in ``paddle.inference`` on a deployment backend: building predictors only.

``create_predictor(files, backend=...)`` builds a predictor for any format this toolkit reads
or writes (``*.pdmodel``, ``__model__`` + ``__params__``, one file per parameter, PIR ``*.json``)
on one of :data:`qcore.deploy.BACKEND_NAMES`. What a runtime needs is asked of its target: the
files it opens (:meth:`~qcore.deploy.DeployTarget.predictor_files`, e.g. OpenVINO's ``*.pdmodel``
names), its own predictor (the ONNX runtimes), and the ``paddle.inference`` config it sets (oneDNN's
int8 kernels need both ``enable_onednn()`` and ``enable_onednn_int8()``).

Scoring and timing are in :mod:`qcore.scoring`; running models over data and comparing them
(``executor_outputs``, ``deployed_outputs``, ``evaluate``, ``verify``) in :mod:`qcore.verify`.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Union

import numpy as np
from paddle import inference

from .custom_ops import register_custom_ops
from .deploy import TARGETS, DeployTarget, OnnxPredictor, OnnxTarget, get_target
from .deploy.base import marked_backend
from .errors import ConfigError
from .model_io import ModelFiles, find_model_files
from .outputs import repair
from .paddle_env import native_output_quiet

#: Set to 1 to see what Paddle Inference's passes print while a predictor is built (``qcli --verbose`` does).
PADDLE_LOGS_ENV = "QCORE_PADDLE_LOGS"


Predictor = Union[inference.Predictor, OnnxPredictor]


def create_predictor(
    files: ModelFiles | str | os.PathLike[str],
    *,
    backend: str | DeployTarget = "onednn",
    threads: int = 2,
    onednn: bool = True,
    int8: bool = True,
) -> Predictor:
    """A predictor for ``files`` (a :class:`ModelFiles`, a model directory, a model file, or an ``.onnx``
    file for the ONNX runtimes) on ``backend``.

    ``onednn=False`` is the same as ``backend="native"``; ``int8=False`` keeps oneDNN to its float
    kernels (the float baseline). A backend this machine cannot run (``tensorrt`` without a GPU)
    raises :class:`ConfigError`; so does one that would silently run another backend's kernels
    (``openvino`` on a PIR model). On ``onnxruntime`` / ``openvino-runtime`` a Paddle model is
    exported first (:func:`qcore.export.export_onnx`, into a temporary file), except where the runtime
    reads its family itself (the OpenVINO runtime reads legacy programs). A save a kill interrupted in
    the model's directory is finished first (:func:`qcore.outputs.repair`).
    """
    target = get_target("native" if not onednn else backend)
    if not isinstance(files, ModelFiles):
        files = Path(files) if str(files).endswith(".onnx") else find_model_files(files)
    repair(files.directory if isinstance(files, ModelFiles) else files.parent)
    own = target.own_predictor(files, threads)
    if own is not None:
        return own
    if isinstance(files, Path):
        onnx_backends = " or ".join(repr(t.name) for t in TARGETS.values() if isinstance(t, OnnxTarget))
        raise ConfigError(f"{files} is an ONNX file; run it with backend={onnx_backends}")
    if not int8:
        target = target.float_kernels()
    reason = target.unavailable() or target.accepts(files.model_file)
    if reason is not None:
        raise ConfigError(f"backend {target.name!r} cannot run {files.model_file}: {reason}")
    program = files.model_file.read_bytes()
    register_custom_ops(program)  # before the predictor: it reads the program when created
    made_for = target.made_for_problem(marked_backend(program) if files.family == "legacy" else None)
    if made_for is not None:
        warnings.warn(f"{files.model_file}: {made_for}", stacklevel=2)
    problem = target.host_problem()
    if problem is not None and holds_quantization(program):
        warnings.warn(f"{files.model_file}: {problem}", stacklevel=2)
    files = target.predictor_files(files)
    if files.params_file is None:
        config = inference.Config(str(files.directory))
        config.set_prog_file(str(files.model_file))
    else:
        config = inference.Config(str(files.model_file), str(files.params_file))
    config.disable_glog_info()
    target.configure(config, threads)
    with native_output_quiet(os.environ.get(PADDLE_LOGS_ENV) != "1"):  # the passes print ~100 lines otherwise
        return inference.create_predictor(config)


#: Op type names only a quantized program holds, as bytes of its saved file: Paddle's QDQ and fake-quant ops
#: (``dequantize_linear`` too), ONNX's QDQ (``DequantizeLinear``, ``DynamicQuantizeLinear``), integer and
#: block-quantized ops.
QUANTIZED_OPS = (b"quantize_linear", b"fake_quantize", b"QuantizeLinear", b"MatMulInteger", b"ConvInteger",
                 b"MatMulNBits", b"QLinear", b"GatherBlockQuantized")


def holds_quantization(program: bytes) -> bool:
    """Whether a saved program (Paddle, either IR, or an ONNX file's bytes) holds quantization ops."""
    return any(op in program for op in QUANTIZED_OPS)


def run_predictor(predictor: Predictor, feed: Mapping[str, np.ndarray]) -> list[np.ndarray]:
    """Feed arrays by input name, run, and return every output in order."""
    if isinstance(predictor, OnnxPredictor):
        return predictor.run(feed)
    for name in predictor.get_input_names():
        handle = predictor.get_input_handle(name)
        array = np.ascontiguousarray(feed[name])
        handle.reshape(list(array.shape))
        handle.copy_from_cpu(array)
    predictor.run()
    return [predictor.get_output_handle(n).copy_to_cpu() for n in predictor.get_output_names()]


def predict(files: ModelFiles, feed: Mapping[str, np.ndarray], **options: object) -> list[np.ndarray]:
    """One-shot :func:`create_predictor` + :func:`run_predictor`."""
    return run_predictor(create_predictor(files, **options), feed)  # type: ignore[arg-type]
