"""Static programs with one embedding lookup, and the ways Paddle saves them (helpers of qembed's tests;
the module name is unique so that every package's tests can run in one pytest process)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import paddle


@dataclass
class StaticProgram:
    """A program built with paddle.static (the seeds' way): run and save it inside ``guard``."""

    main: Any
    scope: Any
    feed: Any
    out: Any
    exe: Any
    guard: Any


def build_static_program(family: str, op_type: str = "lookup_table_v2", table: np.ndarray | None = None,
                         with_fc: bool = False, table2: np.ndarray | None = None) -> StaticProgram:
    """One lookup of the parameter ``emb`` (``table``, default 100 x 8 uniform), times 2; ``with_fc``
    multiplies by the parameter ``fc_w`` (a parameter that is not a table), ``table2`` a second
    lookup (of ``emb2``, added to the first)."""
    if table is None:
        table = np.random.default_rng(0).uniform(-0.5, 0.5, (100, 8)).astype("float32")
    dtype, shape = str(table.dtype), list(table.shape)
    guard = paddle.pir_utils.OldIrGuard() if family == "legacy" else paddle.pir_utils.IrGuard()
    paddle.enable_static()
    with guard:
        main, startup, scope = paddle.static.Program(), paddle.static.Program(), paddle.static.Scope()
        with paddle.static.program_guard(main, startup), paddle.static.scope_guard(scope):
            word = paddle.static.data("word", [None, 1], "int64")
            emb = paddle.static.create_parameter(shape, dtype, name="emb")
            if op_type == "lookup_table":  # Paddle 1.x's op, hand-written into the ProgramDesc
                looked_up = main.global_block().create_var(name="looked_up", dtype=dtype, shape=[-1, shape[-1]])
                main.global_block().append_op(
                    type="lookup_table", inputs={"Ids": [word], "W": [emb]}, outputs={"Out": [looked_up]},
                    attrs={"padding_idx": -1},
                )
            else:  # lookup_table_v2 (legacy) or pd_op.embedding (PIR)
                looked_up = paddle.nn.functional.embedding(word, emb)
            out = looked_up * 2.0
            if table2 is not None:
                emb2 = paddle.static.create_parameter(list(table2.shape), dtype, name="emb2")
                out = out + paddle.nn.functional.embedding(word, emb2)
            if with_fc:
                out = out * paddle.static.create_parameter([shape[-1]], dtype, name="fc_w")
            exe = paddle.static.Executor(paddle.CPUPlace())
            exe.run(startup)
            scope.var("emb").get_tensor().set(table, paddle.CPUPlace())
            if table2 is not None:
                scope.var("emb2").get_tensor().set(table2, paddle.CPUPlace())
    return StaticProgram(main, scope, word, out, exe, guard)


# How each family's program can be saved: paddle.static.save_inference_model, save_persistables
# (paddle.distributed.io; Paddle 3.3.1 raises AttributeError for any PIR program), save_vars over
# the persistables, and paddle.static.save.
SAVE_ROUTES = {
    "legacy": ("save_inference_model", "save_persistables", "save_vars", "static.save"),
    "pir": ("save_inference_model", "save_vars", "static.save"),
}
PROGRAM_SUFFIXES = (".pdmodel", ".json")


def saved_param_files(route: str, p: StaticProgram, directory: Path) -> dict[str, int]:
    """Save ``p.main`` into ``directory`` by ``route``; {file name: bytes} of every file but the program."""
    paddle.enable_static()
    with p.guard, paddle.static.scope_guard(p.scope):
        if route == "save_inference_model":
            paddle.static.save_inference_model(str(directory / "inference"), [p.feed], [p.out], p.exe,
                                               program=p.main)
        elif route == "save_persistables":
            paddle.distributed.io.save_persistables(p.exe, str(directory), p.main)
        elif route == "save_vars":
            paddle.static.io.save_vars(p.exe, str(directory), p.main, predicate=paddle.static.io.is_persistable)
        else:
            assert route == "static.save", route
            paddle.static.save(p.main, str(directory / "model"))
    return {f.name: f.stat().st_size for f in directory.iterdir() if f.suffix not in PROGRAM_SUFFIXES}


def float_run(emb_model: tuple, ids: np.ndarray, table: np.ndarray | None = None) -> np.ndarray:
    """Executor output of a saved float model (the ``emb_model`` fixture), optionally with its table replaced."""
    from qcore.graph import open_graph
    from qcore.model_io import load_model

    directory, kwargs, _ = emb_model
    graph = open_graph(load_model(directory, **kwargs))
    if table is not None:
        (op,) = graph.ops(["lookup_table"])
        graph.replace_weight(graph.weight_operand(op), table)
    return graph.run({"ids": ids})[0]
