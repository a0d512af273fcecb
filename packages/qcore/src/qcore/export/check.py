"""An export is kept only when ONNX Runtime, running it, computes what Paddle computes.

paddle2onnx can write a graph that loads and passes ``onnx.checker`` but is another function
(measured: ``paddle.fft.rfft`` comes out as a graph of another output shape). :func:`check_export`
runs the ONNX graph (ONNX Runtime, its graph optimizations off, so the file's own ops run) and the
Paddle program on the same inputs and raises :class:`~qcore.errors.ExportError` naming the first output
that differs, measured as relative L2 (the ONNX targets' deployed-vs-simulated measure):

* a float graph against the float program it was converted from: within :data:`FLOAT_TOLERANCE`
  (float32 arithmetic in another order; PP-OCRv4 rec: 1e-6);
* a QDQ graph against the quantized Paddle model (its simulation): within :data:`QDQ_TOLERANCE`. Float
  differences of 1e-6 move rounding ties at every quantized activation, and in a deep quantized
  model those one-step changes grow (measured): PP-OCRv4 rec's simulation moves by 0.04-0.27 when its
  input moves by 1e-5, and its QDQ export is 0.09-0.22 off it with the reference kernels; weights of
  the wrong sign put the tiny test net 1.0 off. The float graph under it is checked tightly first; this
  check refuses what no rounding explains.

An output whose entries all lie within :data:`ABSOLUTE_TOLERANCE` of Paddle's passes either way: a runtime's
own approximations are that far off where the values themselves are that small (measured: ONNX Runtime's
sigmoid of PP-OCRv4 det's logits on noise inputs, all below -13: outputs under 1.1e-6, 7.3e-8 off Paddle's,
relative L2 0.18).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from ..constants import EMBEDDING_OP_TYPES
from ..errors import ExportError
from ..graph import Graph
from ..model_io import Model

#: Largest relative L2 difference of a float export from its Paddle program.
FLOAT_TOLERANCE = 1e-4
#: Largest relative L2 difference of a QDQ export from the quantized model's simulation.
QDQ_TOLERANCE = 0.5
#: Largest difference of any entry that passes whatever its relative size.
ABSOLUTE_TOLERANCE = 1e-6
#: Inputs are checked at this batch size, other free dimensions at :data:`FREE_SIZE`.
BATCH, FREE_SIZE = 2, 32


def check_inputs(graph: Graph, seed: int = 0) -> dict[str, np.ndarray]:
    """Inputs for the model of ``graph`` from its input specs: free dimensions :data:`BATCH` (the first) or
    :data:`FREE_SIZE`, floats standard-normal, integers in ``[0, n)`` with ``n`` the smallest lookup table's
    rows (2 without one), so every id is valid."""
    rng = np.random.default_rng(seed)
    tables = [graph.shape(w.name)[0] for w in (graph.weight_operand(op) for op in graph.ops(EMBEDDING_OP_TYPES))
              if w is not None]
    ids = max(min(tables, default=2), 1)
    feed = {}
    for name, (shape, dtype) in graph.model.feed_specs().items():
        size = tuple((BATCH if i == 0 else FREE_SIZE) if d < 0 else d for i, d in enumerate(shape))
        kind = np.dtype(dtype).kind
        if kind == "f":
            feed[name] = rng.standard_normal(size).astype(dtype)
        elif kind == "b":
            feed[name] = rng.random(size) < 0.5
        else:
            feed[name] = rng.integers(0, ids, size).astype(dtype)
    return feed


def _shown(feed: Mapping[str, np.ndarray]) -> str:
    return ", ".join(f"{n} {tuple(v.shape)} {v.dtype}" for n, v in feed.items())


def check_export(onnx_model: bytes, model: Model, feed: Mapping[str, np.ndarray], tolerance: float,
                 what: str) -> None:
    """Raise :class:`ExportError` unless ``onnx_model`` (serialized) computes ``model``'s outputs on ``feed``
    within ``tolerance`` (relative L2 over the entries where Paddle's are not NaN) or :data:`ABSOLUTE_TOLERANCE`
    (every entry); ``what``
    names the export in the message."""
    import onnxruntime as ort  # :func:`.paddle2onnx_float.require_onnx` checked it

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 3
    try:
        session = ort.InferenceSession(onnx_model, options, providers=["CPUExecutionProvider"])
        got = session.run(None, {i.name: feed[i.name] for i in session.get_inputs()})
    except Exception as error:  # noqa: BLE001 -- any runtime failure means the file is not the model
        first = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise ExportError(f"{what} does not run in ONNX Runtime on inputs {_shown(feed)}: {first}") from None
    expected = model.run(dict(feed))
    if len(got) != len(expected):
        raise ExportError(f"{what} has {len(got)} outputs where the Paddle model has {len(expected)}")
    for name, ours, theirs in zip((o.name for o in session.get_outputs()), got, expected):
        ours, theirs = np.asarray(ours), np.asarray(theirs)
        if ours.shape != theirs.shape:
            raise ExportError(f"{what} does not compute the Paddle model: output {name!r} has shape {ours.shape} "
                              f"where Paddle's is {theirs.shape} (inputs {_shown(feed)}); no file is written")
        kept = ~np.isnan(theirs) if theirs.dtype.kind == "f" else np.ones(theirs.shape, bool)
        if not kept.any():
            continue
        ours, theirs = ours[kept].astype(np.float64), theirs[kept].astype(np.float64)
        error = float(np.linalg.norm(ours - theirs) / max(np.linalg.norm(theirs), 1e-12))
        if not (error <= tolerance or np.abs(ours - theirs).max() <= ABSOLUTE_TOLERANCE):  # NaN fails
            raise ExportError(f"{what} does not compute the Paddle model: output {name!r} differs by {error:.3g} "
                              f"(relative L2; at most {tolerance:g} allowed) on "
                              f"inputs {_shown(feed)}; no file is written")
