"""Running a saved model in ``paddle.inference`` the way a deployment would.

A QDQ model only runs int8 kernels on CPU when *both* ``enable_onednn()`` and
``enable_onednn_int8()`` are set; with oneDNN alone the QDQ ops run in float and the model is
slower than the float one. :func:`create_predictor` sets both by default.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
from paddle import inference

from .model_io import ModelFiles


def create_predictor(
    files: ModelFiles, *, onednn: bool = True, int8: bool = True, threads: int = 2
) -> inference.Predictor:
    """A CPU predictor for ``files``; ``int8`` switches on oneDNN's int8 passes."""
    if files.params_file is None:
        config = inference.Config(str(files.directory))
        config.set_prog_file(str(files.model_file))
    else:
        config = inference.Config(str(files.model_file), str(files.params_file))
    config.disable_gpu()
    config.disable_glog_info()
    config.set_cpu_math_library_num_threads(threads)
    if onednn:
        config.enable_onednn()
        if int8:
            config.enable_onednn_int8()
    else:
        config.disable_onednn()
    return inference.create_predictor(config)


def run_predictor(predictor: inference.Predictor, feed: Mapping[str, np.ndarray]) -> list[np.ndarray]:
    """Feed arrays by input name, run, and return every output in order."""
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
