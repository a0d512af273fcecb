"""The OpenVINO engine bundled in Paddle 3's CPU wheel (``Config.enable_openvino_engine``).

Paddle Inference hands the whole legacy program to OpenVINO's Paddle frontend, which turns
each ``quantize_linear`` / ``dequantize_linear`` pair into a FakeQuantize; OpenVINO's
low-precision transformations then run the ops that read FakeQuantized inputs and int8
weights with int8 kernels. None of oneDNN's pass bugs apply: no relu is rewritten, scales are
not propagated, and the QDQ'd activations run as the executor simulates them
(``test_deploy_targets.py`` checks every op kind below deployed against simulated). One
graph-dependent placement: every reader of a squeeze-excited conv's output reads its one
quantized copy (:func:`excited_readers`).

Measured with Paddle 3.3.1 (OpenVINO 2025.0 inside the wheel):

* PIR programs (``*.json``) are not converted: the engine silently runs Paddle's own kernels
  (the PIR oneDNN passes run, outputs equal oneDNN's). :meth:`OpenVinoTarget.accepts` refuses them.
* The engine opens only model files named ``*.pdmodel``; :meth:`OpenVinoTarget.predictor_files`
  links ``__model__`` models under such names.
* A transposed conv's int8 weight is read through cast -> multiply, which OpenVINO folds the
  same way (PP-OCRv4 det at 640x640: 23.9 ms against 25.7 ms with ``dequantize_linear``, 51.8 ms
  float, one interleaved run) and which oneDNN runs in float instead of failing on the int8
  weight: the output still runs on the ``onednn`` backend.
* The engine caches compiled models in ``__cache__`` under the working directory unless told
  otherwise; predictors built here cache in :func:`cache_dir` instead.
* A conv whose output (or output + bias) an ``elementwise_mul`` of two activations reads, as in
  ``y + y * hardsigmoid(se(y))`` (PP-OCRv4 det's RSE layers, 8 convs), runs wrongly in int8 when the
  product reads ``y`` in float while the join reads its QDQ copy: the product came out 112 % off float,
  the whole det output 31 % off its simulation (a tiny net with the same block: 3.7 %). NNCF quantizes
  ``y`` once for all its readers (pool, product, join); with that placement OpenVINO fuses the quantize
  into the conv (an int8 output) and runs the block as simulated: the tiny net 1.6e-7 off, det's
  text pixels IoU 0.98 with its simulation, every conv int8 (:func:`excited_readers`; the same holds on
  the ``openvino`` package 2026.4, :mod:`qcore.deploy.openvino_runtime`). Before, those convs stayed float.
* Residual joins: like oneDNN, OpenVINO computes a residual ``elementwise_add`` inside the conv
  that makes one input, and runs it right only when the other (residual) input carries a
  FakeQuantize. MobileNetV2 (random weights, batch 8), deployed vs simulated: 1.3 % with the
  residual inputs quantized (:func:`qcore.deploy.residual.residual_fusions`), 1.5 % with both
  inputs of every add, 9.0 % with no add input quantized.
* Small models (:data:`SMALL_MODEL`, ``algo="auto"``'s whole-model cost rule, shared with the ``openvino``
  package's target): PP-OCR v2 cls (16 M multiply-adds per sample at 48 x 192) ran 1.04-1.14x its float in
  int8 on both (this engine, f32 float: 1.14x; the OpenVINO runtime, bf16 float: 1.04x all int8, 1.11x with 3
  layers float), while PP-OCRv4 rec (700 M) and det (3.9 G) ran faster in int8 (det 0.62x here); batch 1,
  2 threads, AVX-512 VNNI/BF16/AMX, one interleaved run (``benchmarks/ocr_models.py``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import OutputError
from ..optable import CONV_KINDS, kind_of
from .base import DeployTarget, MinInt8Work, ModelRules, OpTarget, OutputReaderRules, output_readers
from .residual import fused_residual_inputs
from .scratch import as_pdmodel

if TYPE_CHECKING:
    from collections.abc import Iterable

    from paddle import inference

    from ..graph import Graph, Operand


#: Models doing less work per sample than this stay float under ``algo="auto"`` on OpenVINO (module doc).
SMALL_MODEL = MinInt8Work(50_000_000, "the FakeQuantize and layout work around each int8 op exceeds what int8 "
                          "kernels save (measured 1.04-1.14x float at 16 M, OpenVINO 2025.0 and 2026.4, batch 1)")


def cache_dir() -> Path:
    """Where OpenVINO keeps compiled models: ``$QCORE_OPENVINO_CACHE``, else ``~/.cache/qcore/openvino``.

    Entries are keyed by the model's content, so a changed model never reuses a stale entry.
    """
    default = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "qcore" / "openvino"
    return Path(os.environ.get("QCORE_OPENVINO_CACHE", default))


#: Op types (without "pd_op.") multiplying their inputs: with two activations, a squeeze-excite scale.
PRODUCTS = frozenset({"elementwise_mul", "multiply"})


def _scaled(graph: Graph, operand: Operand) -> bool:
    """``operand`` is read by a product of two activations (``y * hardsigmoid(se(y))``)."""
    op = operand.op
    return op.type.split(".")[-1] in PRODUCTS and sum(not o.is_param for o in graph.operands(op)) == 2


def excited_readers(graph: Graph, targets: Iterable[OpTarget], planned: set[int], int8_ops: Iterable[str]
                    ) -> list[OpTarget]:
    """For each conv of ``targets`` whose output (or output + bias) a product of two activations reads
    (squeeze-excite), its readers not in ``planned`` (op keys; updated): with them every reader reads the conv's
    one quantized copy, as NNCF places it. Readers outside ``int8_ops`` run float (:attr:`OpTarget.runs_float`)."""
    convs = [t.op for t in targets if t.weight is not None and kind_of(t.op.seed_type) in CONV_KINDS]
    found = []
    for conv, operands in output_readers(graph, convs):
        if not any(_scaled(graph, o) for o in operands):
            continue
        for operand in operands:
            if operand.op.key not in planned:
                planned.add(operand.op.key)
                found.append(OpTarget(operand.op, None, [operand], for_conv=conv,
                                      runs_float=operand.op.seed_type not in int8_ops))
    return found


#: Why OpenVINO's CPU plugin (the PyPI runtime's, measured; the engine in Paddle Inference has the same plugin)
#: keeps attention's matmuls of two activations float.
OPENVINO_ATTENTION = ("its CPU plugin runs attention (Q K^T, softmax, scores V) as one fused subgraph; quantize / "
                      "dequantize pairs on those matmuls add ops around it: all-MiniLM-L6-v2 ran 1.53x its bf16 float "
                      "with them, 1.67x without (NNCF's model keeps the same fused attention)")


class OpenVinoTarget(DeployTarget):
    """OpenVINO's CPU plugin behind ``paddle.inference`` (legacy programs)."""

    name = "openvino"
    runtime = "Paddle Inference's bundled OpenVINO engine (CPU)"
    int8_ops = frozenset({
        "conv2d", "depthwise_conv2d", "conv2d_transpose", "mul", "matmul", "matmul_v2", "elementwise_add", "pool2d",
    })
    int8_families = ("legacy",)
    float_dequant_weights = frozenset({"conv2d_transpose"})
    residual_adds = "fused"
    asymmetric_activations = True
    activation_zero_points = True
    cpu_int8 = True
    activation_matmuls = OPENVINO_ATTENTION
    min_int8_work = SMALL_MODEL

    def plan(self, graph: Graph, targets: list[OpTarget], skip_patterns: Iterable[str] = (), *,
             residual_add: bool = True, calibrated: bool = True) -> tuple[list[OpTarget], set[str]]:
        """The residual input of each add fused into a conv of ``targets``, and the readers of a squeeze-excited
        conv's output (:func:`excited_readers`; legacy programs)."""
        if graph.family != "legacy" or not calibrated:
            return [], set()
        extra = fused_residual_inputs(graph, targets, skip_patterns) if residual_add else []
        planned = {t.op.key for t in [*targets, *extra]}
        return extra + excited_readers(graph, targets, planned, self.int8_ops), set()

    def rules(self, graph: Graph, targets: list[OpTarget], float_inputs: Iterable[str] = ()) -> ModelRules:
        return OutputReaderRules(self, graph, targets)

    def predictor_files(self, files: Any) -> Any:
        """Legacy models under ``*.pdmodel`` names: the engine opens no others."""
        return as_pdmodel(files) if files.family == "legacy" else files

    def accepts(self, model_file: Any) -> str | None:
        if Path(model_file).suffix == ".json":
            return ("Paddle 3.3.1's OpenVINO engine does not convert PIR (.json) programs: it silently runs "
                    "Paddle's own float kernels; quantize a legacy (.pdmodel) model for OpenVINO")
        return None

    def files_problem(self) -> str | None:
        cache = cache_dir()
        try:
            cache.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            return (f"OpenVINO's compiled-model cache {cache} cannot be created ({error.strerror}); set "
                    "$QCORE_OPENVINO_CACHE to a writable directory")
        return None

    def configure(self, config: inference.Config, threads: int) -> None:
        from paddle import inference

        config.disable_gpu()
        config.set_cpu_math_library_num_threads(threads)
        problem = self.files_problem()  # Paddle creates only the last level of the cache directory
        if problem is not None:
            raise OutputError(problem)
        config.set_optim_cache_dir(str(cache_dir()))
        config.enable_openvino_engine(inference.PrecisionType.Float32)


TARGET = OpenVinoTarget()
