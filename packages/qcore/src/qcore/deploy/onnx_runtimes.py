"""What the two ONNX runtimes share: they run the ONNX file :mod:`qcore.export` writes, not a Paddle program.

A model quantized for one of them is a Paddle model (either IR: the runtime never reads it)
plus its ONNX export, whose ``QuantizeLinear`` / ``DequantizeLinear`` pairs the runtime fuses
into int8 kernels. :class:`OnnxPredictor` gives both the run-by-feed interface
:func:`qcore.inference.run_predictor` uses for ``paddle.inference`` predictors.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from .. import ONNX_INSTALL
from ..errors import ConfigError
from .base import DeployTarget
from .scratch import as_pdmodel, scratch_dir

if TYPE_CHECKING:
    from paddle import inference

    from ..model_io import ModelFiles

#: The name of the ONNX file saved beside a Paddle model quantized for an ONNX runtime.
ONNX_FILE = "inference.onnx"
#: The seed op types both runtimes run in int8 when their inputs carry QDQ (ONNX Runtime's QDQ
#: fusions: QLinearConv, QLinearMatMul / MatMulIntegerToFloat, QLinearAdd, int8 pools; OpenVINO's
#: low-precision transformations take the same ops).
ONNX_INT8_OPS = frozenset({"conv2d", "depthwise_conv2d", "mul", "matmul", "matmul_v2", "elementwise_add", "pool2d"})


class OnnxPredictor:
    """An ONNX model loaded in a runtime: ``run(feed)`` returns every output in order."""

    def __init__(self, input_names: Sequence[str], run: Callable[[Mapping[str, np.ndarray]], list[np.ndarray]],
                 onnx_file: Path) -> None:
        self.input_names = list(input_names)
        self._run = run
        self.onnx_file = onnx_file  # or the .pdmodel the runtime reads itself

    def run(self, feed: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        missing = [n for n in self.input_names if n not in feed]
        if missing:
            raise ConfigError(f"{self.onnx_file.name} needs inputs {missing}; the feed has {sorted(feed)}")
        return self._run({n: np.ascontiguousarray(feed[n]) for n in self.input_names})


class OnnxTarget(DeployTarget):
    """A runtime reading the exported ONNX file. Subclasses say how to load it."""

    int8_ops = ONNX_INT8_OPS
    int8_families = ("legacy", "pir")  # both reach the runtime through the export
    residual_adds = "both"
    cpu_int8 = True
    asymmetric_activations = True  # written as zero points (legacy ZeroPoint, PIR shifts: both export as such)
    activation_zero_points = True
    zero_on_grid = True
    #: the element type the export writes activations in (:data:`qcore.export.ACTIVATION_TYPES`)
    activation_type: ClassVar[str] = "uint8"
    #: matmuls with an int8 weight and a float input quantize that input at run time (weight-only models)
    dynamic_matmuls: ClassVar[bool] = False
    #: IR families whose saved Paddle program the runtime reads itself (no ONNX export needed)
    reads_paddle: ClassVar[tuple[str, ...]] = ()
    #: the Python module the runtime needs (named in the error when it is missing)
    module: ClassVar[str]

    def unavailable(self) -> str | None:
        try:
            __import__(self.module)
        except ImportError:
            return f"{self.module} is not installed ({ONNX_INSTALL})"
        try:
            __import__("paddle2onnx")
        except ImportError:
            return f"paddle2onnx is not installed, so no Paddle model can be exported ({ONNX_INSTALL})"
        return None

    def output_problem(self) -> str | None:
        """The runtime and what the export needs must import (paddle2onnx converts, ONNX Runtime checks the file:
        :mod:`qcore.export.check`)."""
        from ..errors import ExportError
        from ..export import require_onnx

        try:
            require_onnx()
        except ExportError as error:
            return str(error)
        return self.unavailable()

    def reads_itself(self, model: Any) -> bool:
        """Whether the runtime reads ``model``'s own program: a family of :attr:`reads_paddle` without quantized
        lookups (qembed's tables: the export writes each as one ``GatherBlockQuantized`` the runtime keeps
        compressed, and OpenVINO 2026.4's Paddle frontend refuses a one-scale table with a padding row, measured)."""
        if model.family not in self.reads_paddle:
            return False
        from ..export.lookups import code_lookups
        from ..graph import open_graph

        return not code_lookups(open_graph(model))

    def export_problem(self, model: Any) -> str | None:
        """The float model's checked ONNX export fails (the quantized model's would too: it is converted from
        the same program with QDQ markers). It cannot be reused for the quantized model, whose program differs
        (markers, folded batch norms), so this costs one conversion and check of the float model."""
        if self.reads_itself(model):
            return None
        from ..errors import ExportError
        from ..export import onnx_bytes

        try:
            onnx_bytes(model, activation_type=self.activation_type)
        except ExportError as error:
            return str(error)
        return None

    def companion_files(self, model: Any) -> dict[str, bytes]:
        """The ONNX export the runtime runs, saved as :data:`ONNX_FILE` beside the Paddle model (none for
        the families it reads directly)."""
        from ..export import onnx_bytes

        if self.reads_itself(model):
            return {}
        return {ONNX_FILE: onnx_bytes(model, activation_type=self.activation_type, dynamic=self.dynamic_matmuls,
                                      runtime=self.name)}

    def configure(self, config: inference.Config, threads: int) -> None:
        raise ConfigError(f"{self.name} runs ONNX files, not paddle.inference; use qcore.inference.create_predictor")

    def own_predictor(self, files: ModelFiles | Path, threads: int) -> OnnxPredictor:
        """The runtime's predictor for an ``.onnx`` file or a Paddle model (its own program where the runtime
        reads the family, else its export in a temporary file)."""
        reason = self.unavailable()
        if reason is not None:
            raise ConfigError(f"backend {self.name!r} cannot run here: {reason}")
        if isinstance(files, Path):
            return self.load(files, threads)
        from ..export import export_onnx
        from ..model_io import load_model

        if files.family in self.reads_paddle and self.reads_itself(load_model(files)):
            return self.load(as_pdmodel(files).model_file, threads)

        onnx_file = scratch_dir("qcore-onnx-") / "model.onnx"
        return self.load(export_onnx(files, onnx_file, activation_type=self.activation_type,
                                     dynamic=self.dynamic_matmuls, runtime=self.name), threads)

    @abstractmethod
    def load(self, onnx_file: Path, threads: int) -> OnnxPredictor:
        """The runtime's predictor for ``onnx_file`` (or a ``.pdmodel`` of :attr:`reads_paddle`) on ``threads``
        CPU threads."""

    def describe(self) -> dict[str, Any]:
        """Facts a report records about the runtime (version, precision)."""
        return {"runtime": self.runtime}
