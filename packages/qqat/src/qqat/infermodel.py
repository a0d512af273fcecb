"""QAT that starts from an inference model (PaddleSlim 2.6's ``quant_aware_with_infermodel`` /
``export_quant_infermodel``): no model code, the float model as its own teacher.

Users who have only an exported model (PP-OCR, PaddleClas exports) recover the accuracy PTQ loses
by fine-tuning the quantized program to reproduce the float model's tensors:

1. the inference program (a legacy ``.pdmodel``) is loaded into ``scope`` and made trainable: the feed and
   fetch ops go, ops whose ``XShape`` output the export stripped get it back (their gradients need it),
   float persistables become parameters; batch norms stay in inference mode (frozen statistics);
2. :func:`qqat.quant_aware` puts fake quantization into it (and into a test clone); with ``use_pact`` each
   quantized activation is clipped first to ``[-alpha, alpha]`` with a trained ``alpha`` (PACT, built by the
   ``act_preprocess_func`` hook in both programs, which share the alphas by name), each alpha starting at the
   float model's abs max of its tensor on the first batch (nothing clipped at first);
3. a distillation loss, the mean squared difference between each ``train_config["node"]`` tensor of the
   quantized student and of the float teacher (the model's outputs by default), is minimised; the teacher
   is the float model (``teacher_model_path_prefix``) run in a scope of its own, its tensors fed to the loss;
4. every ``save_iter_step`` iterations the test program's state is saved (``paddle.static.save``) under
   ``quant_model_ckpt_path`` and ``test_callback(test_program, feed_names, fetch_targets, checkpoint_name)``
   is called.

:func:`export_quant_infermodel` rebuilds the test program, loads a checkpoint and writes the converted
model (:func:`qqat.convert`: the same form PTQ writes for the deployment target), atomically.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np
import paddle

from qcore.config import short_repr
from qcore.errors import ConfigError, DataError, did_you_mean
from qcore.graph import Dataflow
from qcore.model_io import Model, save_model
from qcore.paddle_env import static_mode

from .hooks import Hook
from .legacy_static import graph_of
from .static import convert, quant_aware

#: ops whose gradient reads the ``XShape`` output inference exports drop
_XSHAPE_OPS = ("reshape2", "flatten_contiguous_range", "squeeze2", "unsqueeze2", "transpose2")


@dataclass(frozen=True)
class TrainConfig:
    """``train_config``: PaddleSlim 2.6's keys, validated."""

    model_path_prefix: str
    teacher_model_path_prefix: str | None = None  # None: the model itself
    node: tuple[str, ...] = ()  # tensors to distil on; empty: the model's outputs
    num_epoch: int = 1
    max_iter: int = -1  # stop after this many iterations (-1: run every epoch)
    save_iter_step: int = 100
    learning_rate: float = 1e-4
    weight_decay: float = 0.0
    use_pact: bool = False
    quant_model_ckpt_path: str = "./quant_model_checkpoints"

    @classmethod
    def from_dict(cls, config: Mapping[str, Any] | None) -> TrainConfig:
        if not isinstance(config, Mapping) or "model_path_prefix" not in config:
            raise ConfigError("train_config must be a dict with at least 'model_path_prefix' (the inference model's "
                              "path without .pdmodel)")
        names = [f.name for f in fields(cls)]
        for key in config:
            if key not in names:
                raise ConfigError(f"unknown train_config key {short_repr(key)}{did_you_mean(str(key), names)}; "
                                  f"valid keys: {', '.join(names)}")
        values = dict(config)
        if isinstance(values.get("node"), str):
            values["node"] = [values["node"]]
        values["node"] = tuple(values.get("node") or ())
        for key, kind, low in (("num_epoch", int, 1), ("save_iter_step", int, 1), ("max_iter", int, -1)):
            value = values.get(key, getattr(cls, key))
            if isinstance(value, bool) or not isinstance(value, kind) or value < low:
                raise ConfigError(f"train_config[{key!r}]={short_repr(value)} is not valid; use an int >= {low}")
        for key in ("learning_rate", "weight_decay"):
            value = values.get(key, getattr(cls, key))
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not np.isfinite(value) or value < 0:
                raise ConfigError(f"train_config[{key!r}]={short_repr(value)} is not valid; use a number >= 0")
        if not isinstance(values.get("use_pact", False), bool):
            raise ConfigError(f"train_config['use_pact']={short_repr(values['use_pact'])} is not valid; use True "
                              "or False")
        return cls(**values)


def _model_file(prefix: str) -> Path:
    path = Path(prefix + ".pdmodel")
    if not path.is_file():
        json = Path(prefix + ".json")
        hint = (" (a PIR model: QAT from an inference model needs a legacy .pdmodel export)"
                if json.is_file() else "")
        raise DataError(f"{path} does not exist{hint}; train_config['model_path_prefix'] is the model's path "
                        "without its suffix")
    return path


@dataclass
class _Loaded:
    program: Any
    feed_names: list[str]
    fetch_targets: list[Any]


def _load(executor: Any, prefix: str, scope: Any) -> _Loaded:
    """The inference program without its feed and fetch ops (the executor adds its own for any fetch list)."""
    _model_file(prefix)
    with static_mode("legacy", scope):
        program, feeds, fetches = paddle.static.load_inference_model(prefix, executor)
    block = program.global_block()
    for i in reversed(range(len(block.ops))):
        if block.ops[i].type in ("feed", "fetch"):
            block._remove_op(i)
    return _Loaded(program, list(feeds), list(fetches))


def _trainable(loaded: _Loaded) -> None:
    """Make an inference program trainable in place (see the module docstring, step 1)."""
    block = loaded.program.global_block()
    for op in block.ops:
        if op.type in _XSHAPE_OPS and not (op.output("XShape") if "XShape" in op.output_names else []):
            xshape = block.create_var(name=f"{op.output_arg_names[0]}@xshape", dtype="float32")
            op.desc.set_output("XShape", [xshape.name])
            op.desc.infer_shape(block.desc)
    for var in list(loaded.program.list_vars()):
        if var.persistable and var.name not in ("feed", "fetch") and var.dtype == paddle.float32:
            block.vars[var.name] = paddle.base.framework.Parameter(
                block, shape=var.shape, dtype=var.dtype, name=var.name, trainable=True)


class _Pact:
    """PACT on every quantized activation: ``clip(x, -alpha, alpha)`` with a trained ``alpha`` per quantized input,
    built before the activation's fake quantization by :func:`qqat.quant_aware`'s ``act_preprocess_func``.

    ``hook()`` makes the hook for one program. Its alphas are named ``<tensor>@pact<k>`` in the order the ops are
    quantized, so the training program and its test clone share them by name in the scope, and a checkpoint
    holds them. For training the clip is three ops, ``min(max(x, -alpha), alpha)``: its gradient with respect to
    ``alpha`` is +1 where ``x > alpha``, -1 where ``x < -alpha`` and 0 inside, and the activation's quantizer
    then learns its scale from the clipped tensor. Given a checkpoint's ``alphas`` (the export), the hook builds
    one ``clip`` op with those bounds instead: the same values, one float op, which :func:`_drop_idle_clips`
    then removes wherever it changes nothing.
    """

    def __init__(self, alphas: Mapping[str, Any] | None = None) -> None:
        self.alphas = alphas
        self.sources: dict[str, str] = {}  # alpha's name -> the tensor it clips

    def hook(self) -> Hook:
        counter = itertools.count()

        def pact(x: Any) -> Any:
            name = f"{x.name}@pact{next(counter)}"
            self.sources[name] = x.name
            # every variable is named after alpha: the loaded model's names (tmp_0, relu_0.tmp_0, ...) are what
            # Paddle's name generators would hand out again
            block = x.block
            out = block.create_var(name=f"{name}.out", dtype=x.dtype, shape=x.shape)
            if self.alphas is not None:
                if name not in self.alphas:
                    raise ConfigError(f"the checkpoint has no PACT alpha {name!r}: it was trained without "
                                      "use_pact; export it with the train_config it was trained with")
                bound = float(np.asarray(self.alphas[name]).reshape(-1)[0])
                block.append_op(type="clip", inputs={"X": [x]}, outputs={"Out": [out]},
                                attrs={"min": -bound, "max": bound})
                return out
            alpha = paddle.base.layer_helper.LayerHelper("pact").create_parameter(
                attr=paddle.ParamAttr(name=name, initializer=paddle.nn.initializer.Constant(1.0)),
                shape=[1], dtype="float32")
            neg, low = (block.create_var(name=f"{name}.{what}", dtype=x.dtype, shape=shape)
                        for what, shape in (("neg", [1]), ("low", x.shape)))
            block.append_op(type="scale", inputs={"X": [alpha]}, outputs={"Out": [neg]}, attrs={"scale": -1.0})
            for op, inputs, result in (("elementwise_max", (x, neg), low), ("elementwise_min", (low, alpha), out)):
                block.append_op(type=op, inputs={"X": [inputs[0]], "Y": [inputs[1]]}, outputs={"Out": [result]},
                                attrs={"axis": -1})
            return out

        return pact

    def start(self, executor: Any, program: Any, feed: Mapping[str, Any], scope: Any) -> None:
        """Set each alpha to the abs max of its tensor in the float ``program`` on ``feed`` (1 where that is 0)."""
        sources = sorted(set(self.sources.values()))
        values = dict(zip(sources, executor.run(program, feed=feed, fetch_list=sources)))
        for name, source in self.sources.items():
            start = float(np.abs(values[source]).max()) or 1.0
            scope.find_var(name).get_tensor().set(np.array([start], np.float32), paddle.CPUPlace())


def _drop_idle_clips(program: Any, scope: Any, alphas: Iterable[str]) -> int:
    """Remove from the converted ``program`` each PACT ``clip`` (built from a checkpoint, see :class:`_Pact`)
    whose every reader quantizes it with a threshold no larger than its bound: that quantizer saturates at its
    threshold anyway, so the clip changes no output, and a float op between int8 ops costs time on every CPU
    runtime. A clip read in float (an op the target keeps float) or quantized with a larger threshold stays.
    Returns how many were removed."""
    graph = graph_of(program, scope)
    flow = Dataflow(graph)
    removed = 0
    for alpha in alphas:
        clip = flow.producer(f"{alpha}.out")
        if clip is None or clip.type != "clip":
            continue
        bound = float(graph.attr(clip, "max"))
        readers = flow.readers(f"{alpha}.out")
        if readers and all(r.type == "quantize_linear" and float(graph.get_param(flow.input(r, "Scale")).max())
                           <= bound for r in readers):
            graph.bypass(clip, "X")
            removed += 1
    return removed


def _distil(program: Any, nodes: list[str], config: TrainConfig) -> tuple[Any, list[str], Any]:
    """Append the distillation loss and its optimizer to ``program``; returns (loss, teacher feed names, the
    optimizer's startup program)."""
    block = program.global_block()
    parts, teacher_feeds = [], []
    for k, node in enumerate(nodes):
        if not block.has_var(node):
            raise ConfigError(f"train_config['node'] names {node!r}, which is not a tensor of the model"
                              f"{did_you_mean(node, [v.name for v in program.list_vars()])}")
        student = block.var(node)
        teacher = block.create_var(name=f"teacher@{node}", shape=student.shape, dtype="float32")
        teacher_feeds.append(teacher.name)
        diff, square, part = (block.create_var(name=f"distill@{what}{k}", dtype="float32")
                              for what in ("diff", "square", "loss"))
        block.append_op(type="elementwise_sub", inputs={"X": [student], "Y": [teacher]}, outputs={"Out": [diff]},
                        attrs={"axis": -1})
        block.append_op(type="square", inputs={"X": [diff]}, outputs={"Out": [square]})
        block.append_op(type="mean", inputs={"X": [square]}, outputs={"Out": [part]})
        parts.append(part)
    loss = block.create_var(name="distill@loss", dtype="float32")
    block.append_op(type="sum", inputs={"X": parts}, outputs={"Out": [loss]})
    startup = paddle.static.Program()
    with paddle.static.program_guard(program, startup):
        params_grads = paddle.static.append_backward(loss)
        optimizer = paddle.optimizer.Adam(config.learning_rate, weight_decay=config.weight_decay or None)
        optimizer.apply_gradients(params_grads)
    return loss, teacher_feeds, startup


def quant_aware_with_infermodel(
    executor: Any,
    place: Any,
    scope: Any = None,
    train_reader: Callable[[], Iterable[Mapping[str, Any]]] | None = None,
    quant_config: Mapping[str, Any] | None = None,
    train_config: Mapping[str, Any] | None = None,
    test_callback: Callable[[Any, list[str], list[Any], str], Any] | None = None,
) -> None:
    """Quantization-aware training of an inference model, distilled from the float model (see the module doc).

    ``train_reader()`` yields feed dicts ``{feed_name: array}``; ``train_config`` takes PaddleSlim 2.6's keys
    (:class:`TrainConfig`): ``model_path_prefix`` (required), ``teacher_model_path_prefix``, ``node``,
    ``num_epoch``, ``max_iter``, ``save_iter_step``, ``learning_rate``, ``weight_decay``,
    ``quant_model_ckpt_path``, ``use_pact`` (PACT before each activation quantizer, see the module doc).
    Checkpoints: ``<quant_model_ckpt_path>/epoch_<e>_iter_<i>``.
    """
    config = TrainConfig.from_dict(train_config)
    if train_reader is None or not callable(train_reader):
        raise ConfigError("train_reader must be a callable returning an iterable of feed dicts {feed_name: array}")
    scope = scope or paddle.static.global_scope()
    teacher_scope = paddle.static.Scope()
    student = _load(executor, config.model_path_prefix, scope)
    teacher = _load(executor, config.teacher_model_path_prefix or config.model_path_prefix, teacher_scope)
    nodes = list(config.node) or [v.name for v in student.fetch_targets]
    pact = _Pact() if config.use_pact else None
    with static_mode("legacy", scope):
        _trainable(student)
        float_program = student.program.clone(for_test=True) if pact else None
        test = student.program.clone(for_test=True)
        quant_aware(test, place, quant_config, scope=scope, for_test=True, act_preprocess_func=pact and pact.hook())
        quant_aware(student.program, place, quant_config, scope=scope, for_test=False,
                    act_preprocess_func=pact and pact.hook())
        loss, teacher_feeds, startup = _distil(student.program, nodes, config)
        executor.run(startup)
        first = next(iter(train_reader()), None) if pact else None
        if pact is not None and first is not None:
            pact.start(executor, float_program, {name: np.asarray(first[name]) for name in student.feed_names}, scope)
    ckpt = Path(config.quant_model_ckpt_path)
    iteration = 0
    for epoch in range(config.num_epoch):
        for step, feed in enumerate(train_reader()):
            feed = {name: np.asarray(feed[name]) for name in student.feed_names}
            with static_mode("legacy", teacher_scope):
                targets = executor.run(teacher.program, feed=feed, fetch_list=nodes)
            with static_mode("legacy", scope):
                executor.run(student.program, feed={**feed, **dict(zip(teacher_feeds, targets))}, fetch_list=[loss])
            iteration += 1
            if iteration % config.save_iter_step == 0:
                name = f"epoch_{epoch}_iter_{step}"
                ckpt.mkdir(parents=True, exist_ok=True)
                with static_mode("legacy", scope):  # the callback runs the legacy test program: in legacy mode
                    paddle.static.save(test, os.fspath(ckpt / name))
                    if test_callback is not None:
                        test_callback(test, student.feed_names, student.fetch_targets, name)
            if 0 <= config.max_iter <= iteration:
                return


def export_quant_infermodel(
    executor: Any,
    place: Any = None,
    scope: Any = None,
    quant_config: Mapping[str, Any] | None = None,
    train_config: Mapping[str, Any] | None = None,
    checkpoint_path: str | os.PathLike[str] | None = None,
    export_inference_model_path_prefix: str = "./export_quant_infermodel",
    *,
    deploy_backend: str | None = None,
) -> None:
    """Write the model a :func:`quant_aware_with_infermodel` checkpoint holds, converted for deployment:
    ``<prefix>.pdmodel`` + ``<prefix>.pdiparams`` (atomically; ``deploy_backend`` as for :func:`qqat.convert`)."""
    config = TrainConfig.from_dict(train_config)
    if checkpoint_path is None or not Path(os.fspath(checkpoint_path) + ".pdparams").is_file():
        raise DataError(f"checkpoint {checkpoint_path}.pdparams does not exist; pass checkpoint_path as "
                        "<quant_model_ckpt_path>/epoch_<e>_iter_<i> (without a suffix)")
    scope = scope or paddle.static.global_scope()
    model = _load(executor, config.model_path_prefix, scope)
    with static_mode("legacy", scope):
        _trainable(model)
        test = model.program.clone(for_test=True)
        state = paddle.static.load_program_state(os.fspath(checkpoint_path))
        if not config.use_pact and any("@pact" in name for name in state):
            raise ConfigError(f"checkpoint {checkpoint_path} was trained with train_config['use_pact']=True; export "
                              "it with the train_config it was trained with")
        pact = _Pact(state) if config.use_pact else None
        quant_aware(test, place, quant_config, scope=scope, for_test=True, act_preprocess_func=pact and pact.hook())
        paddle.static.load(test, os.fspath(checkpoint_path), executor)
        converted = convert(test, place, quant_config, scope=scope, deploy_backend=deploy_backend)
        if pact is not None:
            _drop_idle_clips(converted, scope, pact.sources)
    prefix = Path(export_inference_model_path_prefix)
    save_model(Model(converted, model.feed_names, model.fetch_targets, scope, "legacy"), prefix.parent,
               prefix.name + ".pdmodel", prefix.name + ".pdiparams")
