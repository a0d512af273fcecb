"""Dygraph quantization-aware training: ``QAT(config).quantize(model)`` and its export.

``quantize`` replaces every quantizable sublayer, in its parent, by a :class:`QuantedLayer`
(fake-quantized input and weight, straight-through gradients). Training is then ordinary
dygraph training. ``save_quantized_model`` exports the float network (the wrapped layers
put back for the duration), opens the export with ``qcore.graph`` and applies the same
rewrite post-training quantization uses (:func:`qcore.graph.quantize_op`) with the learned
thresholds, so QAT and PTQ write one deployable format.

Data parallel: quantize first, then wrap, ``paddle.DataParallel(QAT(config).quantize(model))``
(wrapping first is refused: the wrapper would not know the quantizers' parameters). Every rank
then keeps the same activation thresholds (reduced over the ranks each step) and PACT alphas
(parameters, started from the max over the ranks), and ``save_quantized_model`` writes on rank 0
while the others wait (:mod:`qcore.distributed`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import paddle
from paddle import nn

from qcore.config import QuantConfig
from qcore.constants import TRANSFORM_PASS_OP_TYPES
from qcore.deploy import Deployment, OpTarget
from qcore.deploy.apply import Planned
from qcore.distributed import active, all_gather, check_same, digest_files, on_rank0
from qcore.errors import ConfigError, QuantError
from qcore.graph import Graph, OpRef, open_graph
from qcore.model_io import ModelFiles, check_model_output, export_layer, load_model
from qcore.paddle_env import FAMILIES

from .config import dygraph_config
from .layers import QuantedLayer, layer_kind

log = logging.getLogger(__name__)
WEIGHTED_OPS = TRANSFORM_PASS_OP_TYPES  # the op table's kinds with a weight and quantized inputs


def quanted_layers(model: nn.Layer) -> dict[str, QuantedLayer]:
    """Every :class:`QuantedLayer` inside ``model``, by its sublayer path."""
    return {name: layer for name, layer in model.named_sublayers() if isinstance(layer, QuantedLayer)}


class QAT:
    """Quantization-aware training of a dygraph model (the seeds' ``paddleslim.QAT``).

    ``config`` takes the keys of ``qcore.config.DYGRAPH_CONFIG_DEFAULT``; missing keys get the
    defaults, unknown keys and bad values raise :class:`qcore.errors.ConfigError`.
    ``distributed`` (default True): under an initialised ``paddle.distributed`` with several ranks,
    share activation thresholds across the ranks while training and save on rank 0 only;
    False makes each rank keep its own thresholds and write its own output.
    """

    def __init__(self, config: Mapping[str, Any] | QuantConfig | None = None, *, distributed: bool = True) -> None:
        self.config = dygraph_config(config)
        self.distributed = distributed
        self.left_float: dict[str, str] = {}  # weight name -> why the last export kept that layer float

    def quantize(self, model: nn.Layer) -> nn.Layer:
        """Wrap every layer of ``quantizable_layer_type`` in place; returns ``model``.

        A layer with the attribute ``skip_quant = True`` is left float. Already wrapped
        layers are not wrapped twice.
        """
        if isinstance(model, paddle.DataParallel):
            raise QuantError("quantize the model before wrapping it: paddle.DataParallel(QAT(config).quantize(model)), "
                             "not QAT(config).quantize(paddle.DataParallel(model))")
        if not isinstance(model, nn.Layer):
            raise QuantError(f"quantize expects a paddle.nn.Layer, got {type(model).__name__}")
        if layer_kind(model) is not None:
            raise QuantError("quantize wraps sublayers in place; pass the network that holds the layer")
        if active(self.distributed):  # before anything changes: every rank must wrap the same layers alike
            check_same("QAT config", self.config.to_dict(), "pass the same config to QAT on every rank")
            check_same("model", _structure(model), "build the same model on every rank")
        wanted = set(self.config.quantizable_layer_type)
        for parent in [model, *model.sublayers()]:
            if isinstance(parent, QuantedLayer):
                continue
            for name, child in list(parent.named_children()):
                if layer_kind(child) in wanted and not getattr(child, "skip_quant", False):
                    setattr(parent, name, QuantedLayer(child, self.config, sync=self.distributed))
        if not quanted_layers(model):
            log.warning("no layer of %s found: nothing to quantize", sorted(wanted))
        self._warn_refused_exports()
        return model

    def _warn_refused_exports(self) -> None:
        """Say before training which ``save_quantized_model`` families the default target will refuse."""
        deployment = Deployment(None, weight_bits=self.config.weight_bits, activation_bits=self.config.activation_bits)
        for family in FAMILIES:
            problem = deployment.bits_problem(family)
            if problem is not None:
                log.warning("save_quantized_model(family=%r) will refuse this model (%s); export family='pir' or "
                            "pass deploy_backend='native'", family, problem)

    def save_quantized_model(
        self,
        model: nn.Layer,
        path: str | os.PathLike[str],
        input_spec: Sequence[Any] | None = None,
        *,
        family: Literal["pir", "legacy"] = "pir",
        fold_bn: bool | None = None,
        deploy_backend: str | None = None,
    ) -> ModelFiles:
        """Export ``model`` with its learned scales in the deployable QDQ form.

        ``path`` is a prefix as for ``paddle.jit.save``: ``<path>.json`` + ``<path>.pdiparams``
        (``family='pir'``) or ``<path>.pdmodel`` + ``<path>.pdiparams`` (``family='legacy'``,
        int8-stored weights that Paddle Inference runs with oneDNN int8 kernels). Conv +
        batch_norm pairs are folded when every weight is quantized per channel (``fold_bn=None``;
        folding is then exact); the file is written atomically. The model is not changed.
        ``deploy_backend`` (None, ``"onednn"``, ``"openvino"``, ``"tensorrt"``, ``"native"``) shapes the
        export for that runtime (:mod:`qcore.deploy`); the default applies oneDNN's rules, correct on every
        backend: in the legacy family, a layer whose int8 weight Paddle Inference's oneDNN path would run
        wrongly (see :func:`qcore.deploy.onednn.int8_problem`: its weight, an average pool it reads that the
        int8 kernel would clip, a residual add fused into it) stays float. ``self.left_float`` lists
        the layers left float with the rule that kept them. A ``paddle.DataParallel`` model is
        exported through the layer it wraps; under ``paddle.distributed`` (and ``distributed=True``)
        rank 0 writes and every rank returns once the files are in place.
        """
        if isinstance(model, paddle.DataParallel):
            model = model._layers
        deployment = Deployment(deploy_backend, weight_bits=self.config.weight_bits,
                                activation_bits=self.config.activation_bits)
        if family not in FAMILIES:
            raise ConfigError(f"family={family!r} is not valid; valid choices: 'pir', 'legacy'")
        deployment.check(Path(path).name + (".json" if family == "pir" else ".pdmodel"), family,
                         fix=f" (family={family!r}); pass family='legacy'")
        wrapped = quanted_layers(model)
        if not wrapped:
            raise QuantError("the model has no quantized layer; call QAT(config).quantize(model) and train first")
        per_channel = all(w.per_channel for w in wrapped.values())
        fold = per_channel if fold_bn is None else fold_bn
        if fold and not per_channel:
            raise ConfigError("fold_bn=True needs weight_quantize_type='channel_wise_abs_max' without weight PACT")
        prefix = Path(path)
        suffix = ".json" if family == "pir" else ".pdmodel"
        check_model_output(prefix.parent, family, prefix.name + suffix, prefix.name + ".pdiparams")

        names = (prefix.name + suffix, prefix.name + ".pdiparams")
        with tempfile.TemporaryDirectory(prefix="qqat-export-") as tmp:
            _export_float(model, Path(tmp) / "model", input_spec, family)  # on every rank: keeps them in step
            graph = open_graph(load_model(tmp))
            targets = _match_ops(graph, wrapped)
            if fold:
                graph.fold_conv_bn()
            self.left_float = self._quantize_ops(graph, targets, fold, deployment)
            if active(self.distributed):
                _compare_exports(graph, Path(tmp) / "compare", names)
            return on_rank0(lambda: deployment.save(graph, prefix.parent, *names),
                            f"the quantized model to {prefix}", enabled=self.distributed)

    def _quantize_ops(
        self, graph: Graph, targets: list[tuple[QuantedLayer, OpRef]], fold: bool, deployment: Deployment
    ) -> dict[str, str]:
        """Rewrite each matched op with its layer's learned scales through the deployment target's rules
        (:meth:`qcore.deploy.Deployment.rewrite`, as post-training quantization does); returns the
        weights left float, with the rule that kept each."""
        ops = [OpTarget(op, graph.weight_operand(op), graph.activation_operands(op)) for _, op in targets]
        planned = [
            Planned(op_target, layer.activation_threshold(), per_channel=layer.per_channel,
                    weight_thresholds=None if fold else layer.weight_thresholds())
            for (layer, _), op_target in zip(targets, ops)
        ]  # fmt: skip
        done = deployment.rewrite(graph, deployment.plan(graph, ops, calibrated=False), {}, lambda _: planned)
        summary = deployment.float_summary(done.applied, graph.family)
        if summary:
            log.warning("%s", summary)
        return {layer.layer.weight.name: a.left_float for (layer, _), a in zip(targets, done.applied) if a.left_float}


def _compare_exports(graph: Graph, scratch: Path, names: tuple[str, str]) -> None:
    """Warn when this rank's export differs from rank 0's (rank 0's is the one written).

    Under ``paddle.DataParallel`` parameters and quantizer state agree on every rank; what can
    differ is state Paddle keeps per rank, such as batch-norm running statistics (use
    ``paddle.nn.SyncBatchNorm`` where they must agree).
    """
    digests = all_gather(digest_files([graph.save(scratch, *names).directory]), "export digests")
    differ = [rank for rank, d in enumerate(digests) if d != digests[0]]
    if differ:
        log.warning("the quantized export of rank(s) %s differs from rank 0's (per-rank state such as batch-norm "
                    "running statistics?); rank 0's is saved", differ)


def _structure(model: nn.Layer) -> dict[str, Any]:
    """Each sublayer's type and each parameter's shape, by name (what must agree across ranks)."""
    layers = {name or "<root>": type(layer).__name__ for name, layer in model.named_sublayers(include_self=True)}
    return {**layers, **{f"{name} (shape)": list(p.shape) for name, p in model.named_parameters()}}


@contextlib.contextmanager
def _unwrapped(model: nn.Layer) -> Iterator[None]:
    """Put every wrapped layer back in its parent for the body; restore the wrappers after."""
    swaps = []
    for parent in [model, *model.sublayers()]:
        for name, child in list(parent.named_children()):
            if isinstance(child, QuantedLayer):
                swaps.append((parent, name, child))
    training = model.training
    try:
        for parent, name, wrapper in swaps:
            setattr(parent, name, wrapper.layer)
        model.eval()
        yield
    finally:
        for parent, name, wrapper in swaps:
            setattr(parent, name, wrapper)
        if training:
            model.train()


def _export_float(model: nn.Layer, prefix: Path, input_spec: Sequence[Any] | None, family: str) -> None:
    with _unwrapped(model):
        export_layer(model, prefix, input_spec, family)  # type: ignore[arg-type]


def _match_ops(graph: Graph, wrapped: dict[str, QuantedLayer]) -> list[tuple[QuantedLayer, OpRef]]:
    """Pair each wrapped layer with the exported op that reads its weight parameter."""
    by_weight: dict[str, OpRef] = {}
    for op in graph.ops(list(WEIGHTED_OPS)):
        weight = graph.weight_operand(op)
        if weight is not None:
            by_weight.setdefault(weight.name, op)
    pairs = []
    for name, layer in wrapped.items():
        op = by_weight.get(layer.layer.weight.name)
        if op is None:
            log.warning("layer %s (%s) is not in the exported forward; skipped", name, layer.layer.weight.name)
            continue
        pairs.append((layer, op))
    return pairs
