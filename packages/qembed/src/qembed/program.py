"""``quant_embedding``: store a program's embedding tables as int8 with a dequantizing lookup.

Each matched lookup then reads the int8 table, casts only the looked-up rows to float and
multiplies them by the scale (the per-row scales are looked up with the same ids), or, with
``fused_lookup``, is one ``qembed_lookup`` op (:mod:`qembed.ext`) doing all of that. Works on
both of Paddle 3's program kinds through :mod:`qcore.graph`; measured on Paddle 3.3.1 CPU,
the rewritten program runs in the executor and in ``paddle.inference`` (oneDNN on or off).
With the config's ``weights`` the same call stores the other weights (fc, matmul, conv, gru) int8
weight-only, through qcore's weight-only step (:meth:`qcore.deploy.Deployment.store_weights`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import paddle

from qcore.constants import EMBEDDING_OP_TYPES
from qcore.deploy import Deployment
from qcore.errors import ConfigError, DataError, GraphError, did_you_mean
from qcore.graph import Graph, OpRef, RowSet, open_graph
from qcore.model_io import Model, ModelFiles, check_model_output, load_model
from qcore.optable import LOOKUP, seed_types
from qcore.quant import LN2, qmax

from . import ext
from .config import EmbeddingConfig, TableConfig
from .mixed import MixedRequest, MixedTable, quantize_mixed_tables, row_counts
from .table import TableChoice, choose_table_quantization

# The op types each seed op type covers (qcore.optable.OP_TABLE names): the table's lookups that
# are not seed names (embedding_with_scaled_gradient, c_embedding) are configured as lookup_table.
OP_FAMILIES = {seed: (seed,) for seed in EMBEDDING_OP_TYPES} | {
    "lookup_table": ("lookup_table", *seed_types(LOOKUP, seed=False)),
}
# Ops whose Paddle 3.3.1 CPU kernel rejects an int8 table (measured): their table is stored as int8
# and dequantized as a whole in front of the op. The file shrinks; run-time memory does not.
WHOLE_TABLE_OPS = ("c_embedding", "pyramid_hash")
NOT_IN_PADDLE_3 = "fused_embedding_seq_pool cannot occur: Paddle 3 no longer registers it"
OP_SEQUENCE, FUSED, WHOLE_TABLE, MIXED = "op sequence", f"fused ({ext.OP_TYPE})", "whole table", "mixed (hot + cold)"
#: The lookups a mixed-precision table is read by (``lookup_table`` v1 drops the ids' trailing 1: not these ops)
MIXED_LOOKUPS = ("lookup_table_v2", "pd_op.embedding")
#: ``calibration_ids``: table parameter name -> the ids its lookups read (any integer array)
CalibrationIds = Mapping[str, Any]


@dataclass(frozen=True)
class TableReport:
    """What happened to one table: its choice of quantization and the measured error."""

    name: str
    op_types: tuple[str, ...]
    shape: tuple[int, ...]
    choice: TableChoice
    whole_table: bool = False  # dequantized as a whole before the op (its kernel rejects int8 tables)
    lookup: str = OP_SEQUENCE  # how the model reads it: OP_SEQUENCE, FUSED (needs qembed.ext) or WHOLE_TABLE

    @property
    def float_bytes(self) -> int:
        return int(np.prod(self.shape)) * 4

    @property
    def quantized_bytes(self) -> int:
        """Bytes of the stored table: codes (packed below 5 bits, except whole-table ops), scales, offsets."""
        q = self.choice.table
        if self.whole_table and not isinstance(q, MixedTable):
            return int(np.prod(self.shape)) + q.scales.size * 4
        return q.stored_bytes


def program_family(program: Any) -> str:
    """'pir' for a ``paddle.pir.Program``, 'legacy' for a ProgramDesc-based ``paddle.static.Program``."""
    if isinstance(program, paddle.pir.Program):
        return "pir"
    if isinstance(program, paddle.base.framework.Program):
        return "legacy"
    raise GraphError(
        f"program must be a paddle.static.Program or paddle.pir.Program, got {type(program).__name__}; "
        "to quantize a saved model directory use qembed.quant_embedding_model"
    )


def quant_embedding(
    program: Any, place: Any = None, config: Mapping[str, Any] | None = None, scope: Any = None,
    calibration_ids: CalibrationIds | None = None,
) -> Any:
    """Quantize the embedding tables of ``program`` (the seeds' API); returns the program.

    As in PaddleSlim the program is rewritten in place (pass ``program.clone()`` to keep the
    original). The int8 codes and scales are added as new parameters; the float tables (and, with
    ``weights``, the float weights) leave the program and ``scope`` (default: the global scope), so
    every way of saving (``save_inference_model``, ``save_persistables``, ``save_vars`` over the
    persistables) writes only the quantized ones.
    ``place`` is accepted for compatibility; tables are written on the CPU. ``calibration_ids`` (table name ->
    ids read from it) tell the tables with a ``bytes_budget`` which rows are hot.
    """
    del place
    family = program_family(program)
    model = Model(program, [], [], scope or paddle.static.global_scope(), family)  # type: ignore[arg-type]
    graph = open_graph(model)
    before = graph.param_names()
    quantize_tables(graph, config, calibration_ids)
    read = set(graph.param_names())
    model.scope.erase([name for name in before if name not in read])  # the float tables (weights) no op reads now
    return program


def quant_embedding_model(
    model_dir: str | os.PathLike[str],
    save_dir: str | os.PathLike[str],
    config: Mapping[str, Any] | None = None,
    model_filename: str | None = None,
    params_filename: str | None = None,
    save_model_filename: str | None = None,
    save_params_filename: str | None = None,
    calibration_ids: CalibrationIds | None = None,
) -> tuple[ModelFiles, list[TableReport]]:
    """Quantize a saved model's tables into ``save_dir`` (same family and file layout by default).

    The input files are never modified. Returns where the output went and one report per table.
    ``calibration_ids`` as in :func:`quant_embedding`.
    """
    model = load_model(model_dir, model_filename, params_filename)
    source = model.source
    assert source is not None
    if save_model_filename is None:
        save_model_filename = source.model_file.name
        save_params_filename = source.params_file.name if source.params_file else None
    check_model_output(save_dir, model.family, save_model_filename, save_params_filename, source)
    graph = open_graph(model)
    reports = quantize_tables(graph, config, calibration_ids)
    return graph.save(save_dir, save_model_filename, save_params_filename), reports


def quantize_tables(graph: Graph, config: Mapping[str, Any] | None = None,
                    calibration_ids: CalibrationIds | None = None) -> list[TableReport]:
    """Rewrite every matched lookup of ``graph``; one :class:`TableReport` per table."""
    cfg = EmbeddingConfig.from_dict(config)
    fused_op = _fused_op(cfg.fused_lookup)
    seed_of = {op_type: seed for seed in cfg.op_types for op_type in OP_FAMILIES[seed]}
    tables: dict[str, list[OpRef]] = {}
    for op in graph.ops(seed_of):
        weight = graph.weight_operand(op)
        if weight is not None:  # None: the table is not a float parameter (already quantized)
            tables.setdefault(weight.name, []).append(op)
    _check_found(tables, cfg)
    for name in calibration_ids or {}:
        if name not in tables:
            raise ConfigError(f"calibration_ids names {name!r}, which is not the table of any lookup"
                              f"{did_you_mean(str(name), tables)}; tables found: {', '.join(sorted(tables))}")
    chosen = {name: ops for name, ops in tables.items() if cfg.params_names is None or name in cfg.params_names}
    # which lookups are fused (a refusal comes here, before any table is quantized)
    fused_of = {name: None if _whole_table(ops) else _table_fused_op(graph, name, ops, fused_op, cfg)
                for name, ops in chosen.items()}
    # Every table is checked and quantized before the first rewrite, so bad input changes nothing.
    planned: list[tuple[str, list[OpRef], tuple[int, ...], TableChoice | None, bool, str | None]] = []
    mixed: list[MixedRequest] = []
    for name, ops in chosen.items():
        table_cfg: TableConfig = cfg.tables[seed_of[ops[0].seed_type or ""]]
        whole_table = _whole_table(ops)
        if whole_table and table_cfg.quantize_type == "log":
            raise GraphError(
                f"table {name!r} is read by {ops[0].seed_type}, whose CPU kernel rejects int8 tables, so it is "
                "dequantized as a whole by Paddle's linear dequantize; use quantize_type 'abs_max' for it"
            )
        table = _float32_table(graph, name)
        if table_cfg.bytes_budget is not None:
            counts = _calibration_counts(graph, name, ops, whole_table, calibration_ids, table.shape[0])
            padding = [p for p in (graph.attr(op, "padding_idx", -1) for op in ops) if p is not None and p >= 0]
            mixed.append(MixedRequest(table, counts, table_cfg.bytes_budget, table_cfg.mixed_bits,
                                      table_cfg.asymmetric, table_cfg.scale_dtype, padding, f"table {name!r}"))
            planned.append((name, ops, table.shape, None, False, None))
            continue
        try:
            choice = choose_table_quantization(
                table, table_cfg.quantize_type, table_cfg.quantize_bits, table_cfg.per_row, table_cfg.threshold,
                False if whole_table else table_cfg.asymmetric, table_cfg.max_error,
                "float32" if whole_table else table_cfg.scale_dtype,
            )
        except DataError as exc:
            raise DataError(f"table {name!r}: {exc}") from None
        planned.append((name, ops, table.shape, choice, whole_table, fused_of[name]))
    mixed_choices = iter(quantize_mixed_tables(mixed))  # the tables with a bytes_budget share their bytes
    reports = []
    for name, ops, shape, choice, whole_table, table_fused_op in planned:
        choice = choice or next(mixed_choices)
        q = choice.table
        if isinstance(q, MixedTable):
            cold, hot = (RowSet(t.codes, t.scales, t.bits, t.offsets) for t in (q.cold, q.hot))
            for op in ops:
                graph.quantize_mixed_lookup(op, cold, hot, q.position_bytes)
            graph.drop_param_if_unused(name)
            reports.append(TableReport(name, tuple(sorted({o.seed_type or "" for o in ops})), shape, choice,
                                       lookup=MIXED))
            continue
        log_step = (q.log_step or LN2) if q.quantize_type == "log" else None
        for op in ops:
            if whole_table:
                thresholds = q.scales.astype(np.float64) * qmax(q.bits)
                axis = 0 if choice.per_row else None
                graph.quantize_weight(graph.weight_operand(op), q.bits, axis, thresholds, float_dequant=True)
            else:
                graph.quantize_lookup(op, q.codes, q.scales, log_step=log_step, bits=q.bits, offsets=q.offsets,
                                      fused_op=table_fused_op)
        graph.drop_param_if_unused(name)
        op_types = tuple(sorted({o.seed_type or "" for o in ops}))
        lookup = WHOLE_TABLE if whole_table else FUSED if table_fused_op else OP_SEQUENCE
        reports.append(TableReport(name, op_types, shape, choice, whole_table, lookup))
    if cfg.weights is not None:
        Deployment().store_weights(graph, graph.ops(cfg.weights.op_types), cfg.weights.bits)
    return reports


def _whole_table(ops: list[OpRef]) -> bool:
    """Whether an op of ``ops`` reads its table whole (dequantized as a whole, not looked up row by row)."""
    return any(op.seed_type in WHOLE_TABLE_OPS for op in ops)


def _calibration_counts(graph: Graph, name: str, ops: list[OpRef], whole_table: bool,
                        calibration_ids: CalibrationIds | None, rows: int) -> np.ndarray:
    """Reads per row of table ``name`` in its calibration ids; one error line when a mixed table cannot be made."""
    if whole_table or any(op.type not in MIXED_LOOKUPS for op in ops):
        raise GraphError(f"table {name!r} is read by {ops[0].type}, which a mixed-precision table cannot replace "
                         f"(only {' / '.join(MIXED_LOOKUPS)}); leave it out of bytes_budget (params_name, or a "
                         "per-op-type config)")
    if calibration_ids is None or name not in calibration_ids:
        raise ConfigError(f"table {name!r} has a bytes_budget but no calibration ids; pass calibration_ids="
                          f"{{{name!r}: ids}} with ids its lookups read (a sample of real traffic)")
    return row_counts(calibration_ids[name], rows, f"calibration_ids[{name!r}]")


def _fused_op(fused_lookup: bool | str) -> str | None:
    """The op type lookups are fused into (``fused_lookup``: True requires the op, "auto" takes it where it loads)."""
    if fused_lookup is True:
        ext.require()
    return ext.OP_TYPE if fused_lookup and ext.load() else None


def _table_fused_op(graph: Graph, name: str, ops: list[OpRef], fused_op: str | None, cfg: EmbeddingConfig
                    ) -> str | None:
    """``fused_op`` unless a lookup of table ``name`` reads sequence (LoD) ids, whose lengths the op would drop:
    "auto" keeps the op sequence there, True is refused."""
    if fused_op is None or not any(graph.lookup_reads_sequences(op) for op in ops):
        return fused_op
    if cfg.fused_lookup is True:
        raise ConfigError(f"table {name!r} is looked up with sequence (LoD) ids, whose lengths {fused_op} does not "
                          "pass on; use fused_lookup='auto' (the op sequence for such tables) or False")
    return None


def _float32_table(graph: Graph, name: str) -> np.ndarray:
    """The float32 2-D table ``name``; DataError naming it and the fix otherwise."""
    table = graph.get_param(name)
    if table.dtype != np.float32:
        raise DataError(
            f"table {name!r} is {table.dtype}; quant_embedding quantizes float32 tables and its lookups return "
            "float32, so cast the model to float32 first or leave this table out with params_name"
        )
    if table.ndim != 2 or table.size == 0:
        raise DataError(
            f"table {name!r} has shape {table.shape}; an embedding table is a non-empty 2-D array (rows, dim): "
            "check that the model's parameters were loaded into the scope"
        )
    return table


def _check_found(tables: Mapping[str, list[OpRef]], cfg: EmbeddingConfig) -> None:
    if not tables:
        raise GraphError(
            f"no {' / '.join(cfg.op_types)} op with a float parameter table in the program; check "
            f"quantize_op_types ({NOT_IN_PADDLE_3})"
        )
    for name in cfg.params_names or ():
        if name not in tables:
            raise GraphError(
                f"{name!r} (params_name) is not the table of any {' / '.join(cfg.op_types)} op"
                f"{did_you_mean(name, tables)}; give params_name one of the tables found: {', '.join(sorted(tables))}"
            )
