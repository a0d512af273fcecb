"""The OpenVINO engine bundled in Paddle 3's CPU wheel (``Config.enable_openvino_engine``).

Paddle Inference hands the whole legacy program to OpenVINO's Paddle frontend, which turns
each ``quantize_linear`` / ``dequantize_linear`` pair into a FakeQuantize; OpenVINO's
low-precision transformations then run the ops that read FakeQuantized inputs and int8
weights with int8 kernels. None of oneDNN's pass bugs apply: no relu is rewritten, scales are
not propagated, and the QDQ'd activations run as the executor simulates them
(``test_deploy_targets.py`` checks every op kind below deployed against simulated). One
graph-dependent rule: a conv whose output another activation scales (squeeze-excite) stays
float (:func:`excited_convs`).

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
  ``y + y * hardsigmoid(se(y))`` (PP-OCRv4 det's RSE layers, 8 convs), runs wrongly in int8: the
  product came out 112 % off float (the conv's own output 2 %), the whole det output 31 % off its
  simulation; 7 % with those convs float. A tiny net with the same block: 3.7 % against 2e-7.
* Residual joins: like oneDNN, OpenVINO computes a residual ``elementwise_add`` inside the conv
  that makes one input, and runs it right only when the other (residual) input carries a
  FakeQuantize. MobileNetV2 (random weights, batch 8), deployed vs simulated: 1.3 % with the
  residual inputs quantized (:func:`qcore.deploy.residual.residual_fusions`), 1.5 % with both
  inputs of every add, 9.0 % with no add input quantized.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import OutputError
from ..graph import Dataflow
from ..optable import CONV_TYPES
from .base import DeployTarget, ModelRules, OpTarget
from .residual import adds_param, fused_residual_inputs
from .scratch import as_pdmodel

if TYPE_CHECKING:
    from collections.abc import Iterable

    from paddle import inference

    from ..graph import Graph, OpRef


def cache_dir() -> Path:
    """Where OpenVINO keeps compiled models: ``$QCORE_OPENVINO_CACHE``, else ``~/.cache/qcore/openvino``.

    Entries are keyed by the model's content, so a changed model never reuses a stale entry.
    """
    default = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "qcore" / "openvino"
    return Path(os.environ.get("QCORE_OPENVINO_CACHE", default))


#: Why a conv whose output is scaled by another activation stays float on OpenVINO (:func:`excited_convs`).
EXCITED_CONV_PROBLEM = (
    "openvino: Paddle 3.3.1's OpenVINO miscomputes an int8 conv whose output is multiplied by another "
    "activation (a squeeze-excite scale): PP-OCRv4 det's excited tensor came out 112 % off"
)


def excited_convs(graph: Graph) -> set[int]:
    """Keys (:attr:`OpRef.key`) of the convs whose output, directly or through its bias add, an ``elementwise_mul``
    of two activations reads (``y * hardsigmoid(se(y))``). Empty for PIR graphs."""
    if graph.family != "legacy":
        return set()
    flow = Dataflow(graph)

    def excited(name: str) -> bool:
        return any(r.type == "elementwise_mul" and not flow.reads_param(r) for r in flow.readers(name))

    found = set()
    for conv in graph.ops(sorted(CONV_TYPES)):
        out = graph.output(conv)
        biased = [flow.output(r, "Out") for r in flow.readers(out) if adds_param(flow, r)]
        if any(excited(name) for name in (out, *biased)):
            found.add(conv.key)
    return found


class OpenVinoRules(ModelRules):
    """OpenVINO's graph-dependent rule: convs scaled by another activation stay float (:func:`excited_convs`)."""

    def __init__(self, target: DeployTarget, graph: Graph) -> None:
        super().__init__(target, graph)
        self.excited = excited_convs(graph)

    def problem(self, op: OpRef, bits: int, per_channel: bool) -> str | None:
        return EXCITED_CONV_PROBLEM if op.key in self.excited else super().problem(op, bits, per_channel)


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

    def plan(self, graph: Graph, targets: list[OpTarget], skip_patterns: Iterable[str] = (), *,
             residual_add: bool = True, calibrated: bool = True) -> tuple[list[OpTarget], set[str]]:
        """The residual input of each add fused into a conv of ``targets`` (legacy programs)."""
        if graph.family != "legacy" or not residual_add or not calibrated:
            return [], set()
        return fused_residual_inputs(graph, targets, skip_patterns), set()

    def rules(self, graph: Graph, targets: list[OpTarget], float_inputs: Iterable[str] = ()) -> ModelRules:
        return OpenVinoRules(self, graph)

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
