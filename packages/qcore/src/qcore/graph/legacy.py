"""Graph backend for legacy ProgramDesc programs (``.pdmodel`` / ``__model__``).

Quantized form: the format Paddle Inference's legacy oneDNN int8 passes consume, i.e.
``quantize_linear -> dequantize_linear`` on activations and int8/int16-stored weights read
through ``dequantize_linear`` with per-channel scales. The ``Scale`` input of both ops is the
threshold (Paddle divides by ``qmax`` itself); zero points are int32 zeros, except on the
asymmetric grids of runtimes that read them (:mod:`qcore.zero_points`).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from paddle.base import core

from ..errors import GraphError
from ..model_io import Model
from ..optable import CONV_TYPES
from ..quant import dequantize, qmax, scale_from_threshold
from ..zero_points import fold_shifts, insert_shift
from .base import ROUND_HALF_EVEN, ActivationGrid, Graph, LookupTables, Operand, OpRef, QuantizedWeight, StoredWeight

_FLOATS = (core.VarDesc.VarType.FP32, core.VarDesc.VarType.FP64, core.VarDesc.VarType.FP16)
_INT_DTYPES = {8: core.VarDesc.VarType.INT8, 16: core.VarDesc.VarType.INT16}
_FAKE_ACT = "fake_quantize_dequantize_moving_average_abs_max"
_FAKE_WEIGHT = {True: "fake_channel_wise_quantize_dequantize_abs_max", False: "fake_quantize_dequantize_abs_max"}
_BACKWARD = 0x0001  # op_role bit of gradient ops


class LegacyGraph(Graph):
    family = "legacy"
    _CAST = "cast"

    def __init__(self, model: Model) -> None:
        super().__init__(model)
        self.block = model.program.global_block()

    def _raw_ops(self) -> list[Any]:
        return list(self.block.ops)

    def _op_type(self, raw: Any) -> str:
        return raw.type

    def _scope_name(self, raw: Any) -> str:
        return str(raw.attr("op_namescope")) if raw.has_attr("op_namescope") else ""

    def _var_operand(self, op: OpRef, slot: str, index: int, name: str) -> Operand | None:
        var = self.block._find_var_recursive(name)
        if var is None or var.desc.type() != core.VarDesc.VarType.DENSE_TENSOR or var.dtype not in _FLOATS:
            return None
        return Operand(op, slot, index, name, name, bool(var.persistable))

    def operands(self, op: OpRef) -> list[Operand]:
        found = []
        for slot in op.raw.input_names:
            for i, name in enumerate(op.raw.input(slot)):
                operand = self._var_operand(op, slot, i, name)
                if operand is not None:
                    found.append(operand)
        return found

    def _operand_in_slot(self, op: OpRef, slot: str) -> Operand | None:
        if slot not in op.raw.input_names or not op.raw.input(slot):
            return None
        return self._var_operand(op, slot, 0, op.raw.input(slot)[0])

    def output(self, op: OpRef) -> Any:
        return op.raw.output_arg_names[0]

    def attrs(self, op: OpRef) -> dict[str, Any]:
        return {name: op.raw.attr(name) for name in op.raw.attr_names}

    def _weight_transposed(self, op: OpRef) -> bool:
        for attr in ("trans_y", "transpose_Y"):
            if op.raw.has_attr(attr) and op.raw.attr(attr):
                return True
        return False

    def attr(self, op: OpRef, name: str, default: Any = None) -> Any:
        return op.raw.attr(name) if op.raw.has_attr(name) else default

    def input_names(self, op: OpRef, slot: str | None = None) -> list[str]:
        return list(op.raw.input_arg_names if slot is None else op.raw.input(slot))

    def output_names(self, op: OpRef, slot: str | None = None) -> list[str]:
        return list(op.raw.output_arg_names if slot is None else op.raw.output(slot))

    def shape(self, name: str) -> list[int]:
        return list(self.block._find_var_recursive(name).shape)

    # ---- editing ops ------------------------------------------------------------------
    def rename_input(self, op: OpRef, old: str, new: str) -> None:
        op.raw._rename_input(old, new)

    def set_attr(self, op: OpRef, name: str, value: Any) -> None:
        op.raw._set_attr(name, value)

    def retype(self, op: OpRef, op_type: str) -> None:
        op.raw.desc.set_type(op_type)

    def _training_ops(self) -> list[Any]:
        return [raw for raw in self.block.ops if raw.has_attr("is_test") and not raw.attr("is_test")]

    def _set_is_test(self, raw: Any, value: bool) -> None:
        raw._set_attr("is_test", value)

    def bypass(self, op: OpRef, slot: str) -> None:
        source, out = op.raw.input(slot)[0], self.output(op)
        for reader in self.block.ops:
            if out in reader.input_arg_names:
                reader._rename_input(out, source)
        self.block._remove_op(self._index(op.raw))

    def fake_quant_activation(
        self, before: OpRef, x: str, state: str, bits: int, moving_rate: float, *, test: bool,
        batch_abs_max: bool = False, initial: float = 0.0,
    ) -> str:
        if batch_abs_max:
            raise GraphError("legacy programs: activations are fake-quantized with a moving average of the abs max")
        scale, accum, flag = (self._state(f"{state}@{k}", v)
                              for k, v in (("scale", initial), ("accum", initial), ("state", 1.0 if initial else 0.0)))
        out = self._tmp_var(self._new_var_name(f"{x}.quant_dequant"), x)
        self.block._insert_op(
            self._index(before.raw), type=_FAKE_ACT,
            inputs={"X": [x], "InScale": [scale], "InAccum": [accum], "InState": [flag]},
            outputs={"Out": [out], "OutScale": [scale], "OutAccum": [accum], "OutState": [flag]},
            attrs={"moving_rate": moving_rate, "bit_length": bits, "is_test": test, "round_type": ROUND_HALF_EVEN},
        )
        return out

    def fake_quant_weight(self, before: OpRef, w: str, bits: int, axis: int | None) -> str:
        out = self._tmp_var(self._new_var_name(f"{w}.quant_dequant"), w)
        op_scale = self._tmp_var(self._new_var_name(f"{w}.quant_dequant@scale"), w)
        attrs: dict[str, Any] = {"bit_length": bits, "round_type": ROUND_HALF_EVEN}
        if axis is not None:
            attrs["quant_axis"] = axis
        self.block._insert_op(self._index(before.raw), type=_FAKE_WEIGHT[axis is not None], inputs={"X": [w]},
                              outputs={"Out": [out], "OutScale": [op_scale]}, attrs=attrs)
        return out

    def _state(self, name: str, value: float) -> str:
        """A persistable float of shape [1]; a value already in the scope (what training learned) is kept."""
        if not self.block.has_var(name):
            self.block.create_var(name=name, shape=[1], dtype="float32", persistable=True)
        if self.model.scope.find_var(name) is None:
            self.set_param(name, np.array([value], np.float32))
        return name

    def gradient_ops(self, op: OpRef) -> list[OpRef]:
        """The gradient ops of ``op`` already in the program (``minimize`` ran): they read its outputs' gradients."""
        grads = {f"{name}@GRAD" for name in op.raw.output_arg_names}
        return [grad for grad in self.ops()
                if int(self.attr(grad, "op_role", 0)) & _BACKWARD and grad.type == f"{op.type}_grad"
                and grads & set(grad.raw.input_arg_names)]

    # ---- building blocks ------------------------------------------------------------
    def _index(self, raw: Any) -> int:
        for i, candidate in enumerate(self.block.ops):
            if candidate is raw:
                return i
        raise AssertionError("op is not in the block")

    def _add_param(self, name: str, value: np.ndarray, before: OpRef | None = None) -> str:
        dtype = {np.dtype(np.int8): "int8", np.dtype(np.int16): "int16", np.dtype(np.int32): "int32",
                 np.dtype(np.float16): "float16"}.get(value.dtype, "float32")
        self.block.create_var(name=name, shape=list(value.shape), dtype=dtype, persistable=True)
        self.set_param(name, value if dtype != "float32" else value.astype(np.float32))
        return name

    def param_names(self) -> list[str]:
        read = {name for op in self.block.ops for name in op.input_arg_names}
        return sorted(n for n in read if (v := self.block._find_var_recursive(n)) is not None and v.persistable)

    def _key(self, value: str) -> str:
        return value

    def _param_value(self, name: str) -> str:
        return name

    def _set_operand(self, operand: Operand, value: str) -> None:
        operand.op.raw._rename_input(operand.value, value)
        self._drop_if_unused(operand.value)

    def _drop_if_unused(self, name: str) -> None:
        """Remove the declaration of a parameter nobody reads any more, so no way of saving writes it
        (``save_persistables`` walks the program's persistable variables). The scope keeps its value."""
        var = self.block._find_var_recursive(name)
        if var is None or not var.persistable or name not in self.block.vars:
            return
        if not any(name in op.input_arg_names for block in self.model.program.blocks for op in block.ops):
            self.block._remove_var(name)

    def _tmp_var(self, name: str, like: str) -> str:
        src = self.block._find_var_recursive(like)
        self.block.create_var(name=name, shape=src.shape, dtype=src.dtype)
        return name

    def _qdq_attrs(self, bits: int, axis: int) -> dict[str, Any]:
        return {"quant_axis": axis, "bit_length": bits, "qmin": -qmax(bits) - 1, "qmax": qmax(bits)}

    def _insert(self, index: int, op_type: str, x: str, scale: str, zero: str, out: str, attrs: dict) -> None:
        self.block._insert_op(
            index,
            type=op_type,
            inputs={"X": [x], "Scale": [scale], "ZeroPoint": [zero]},
            outputs={"Y": [out]},
            attrs=attrs,
        )

    # ---- rewrites -------------------------------------------------------------------
    def _build_act_qdq(
        self, operand: Operand, threshold: float, bits: int, unsigned: bool, offset: float, zero_point: bool
    ) -> str:
        name = operand.name
        scale = self._add_param(self._new_param_name(f"{name}@scale"), np.array([threshold], np.float32))
        z = -round(offset / scale_from_threshold(threshold, bits)) if zero_point else 0  # the runtime's zero point
        zero = self._add_param(self._new_param_name(f"{name}@zero_point"), np.array([z], np.int32))
        at = self._index(operand.op.raw)
        source = name
        if offset:
            source = self._shift(at, name, f"{name}.shifted", -offset, zero_point)
            at += 1
        quantized = self._tmp_var(f"{name}.quantized", name)
        dequantized = self._tmp_var(f"{name}.dequantized", name)
        attrs = self._qdq_attrs(bits, -1)
        if unsigned:  # the executor's kernel takes its levels from qmax; Paddle Inference reads bit_length
            attrs.update(qmin=0, qmax=2**bits - 1)
        self._insert(at, "quantize_linear", source, scale, zero, quantized, attrs)
        self._insert(at + 1, "dequantize_linear", quantized, scale, zero, dequantized, attrs)
        return self._shift(at + 2, dequantized, f"{name}.restored", offset, zero_point) if offset else dequantized

    def _shift(self, index: int, x: str, out: str, bias: float, marked: bool) -> str:
        """Insert ``out = x + bias`` at ``index`` (marked: the saved program carries it as a zero point)."""
        insert_shift(self.block, self.model.scope, index, x, out, self._new_param_name(f"{out}@bias"), bias, marked)
        return out

    def _build_channel_scale(self, operands: list[Operand], factors: np.ndarray) -> None:
        name = operands[0].name
        param = self._add_param(self._new_param_name(f"{name}@smooth"), factors)
        scaled = self._tmp_var(self._new_var_name(f"{name}.smoothed"), name)
        self.block._insert_op(
            min(self._index(o.op.raw) for o in operands), type="elementwise_mul", inputs={"X": [name], "Y": [param]},
            outputs={"Out": [scaled]}, attrs={"axis": -1},
        )
        for operand in operands:
            operand.op.raw._rename_input(name, scaled)

    def _build_weight_dq(self, operand: Operand, weight: QuantizedWeight) -> str:
        name = operand.name
        codes = self._add_param(self._new_param_name(f"{name}.quantized"), weight.codes)
        dequantized = self._tmp_var(f"{name}.dequantized", name)
        at = self._index(operand.op.raw)
        axis = -1 if weight.axis is None else weight.axis
        if weight.bits > 8 or weight.float_dequant:  # no int16 dequantize_linear kernel: cast, then scale
            scales = np.asarray(scale_from_threshold(weight.thresholds, weight.bits), np.float32)
            scale = self._add_param(self._new_param_name(f"{name}@scale"), scales)
            as_float = self._tmp_var(f"{name}.as_float", name)
            self.block._insert_op(
                at, type="cast", inputs={"X": [codes]}, outputs={"Out": [as_float]},
                attrs={"in_dtype": _INT_DTYPES[16 if weight.bits > 8 else 8], "out_dtype": core.VarDesc.VarType.FP32},
            )
            self.block._insert_op(
                at + 1, type="elementwise_mul", inputs={"X": [as_float], "Y": [scale]},
                outputs={"Out": [dequantized]}, attrs={"axis": axis},
            )
            return dequantized
        thr = weight.thresholds.astype(np.float32)
        scale = self._add_param(self._new_param_name(f"{name}@scale"), thr)
        zero = self._add_param(self._new_param_name(f"{name}@zero_point"), np.zeros(thr.shape, np.int32))
        self._insert(at, "dequantize_linear", codes, scale, zero, dequantized, self._qdq_attrs(weight.bits, axis))
        return dequantized

    def _build_lookup_dq(self, op: OpRef, weight: Operand, tables: LookupTables) -> None:
        ids_slot, out_slot = ("x", "out") if op.type == "embedding_with_scaled_gradient" else ("Ids", "Out")
        out = op.raw.output(out_slot)[0]
        padding = {a: op.raw.attr(a) for a in ("padding_idx",) if op.raw.has_attr(a)}
        rows = self._stored_rows(op, weight, tables, out, out_slot, drop_padding=tables.per_row)
        lookup = "lookup_table" if op.type == "lookup_table" else "lookup_table_v2"  # v1 drops a trailing 1
        add = self._writer(self._index(op.raw) + 1, out)
        self._dequantized_rows(add, rows, op.raw.input(ids_slot)[0], tables, lookup, padding, out, out)

    def _build_mixed_lookup_dq(self, op: OpRef, weight: Operand, cold: LookupTables, hot: LookupTables,
                               weights: Any) -> None:
        if op.type != "lookup_table_v2":
            raise GraphError(f"a mixed-precision table is read by lookup_table_v2 ops in legacy programs, not by "
                             f"{op.type}; leave this table out of bytes_budget")
        out = op.raw.output("Out")[0]
        padding = {a: op.raw.attr(a) for a in ("padding_idx",) if op.raw.has_attr(a)}
        rows = self._stored_rows(op, weight, cold, out, "Out", drop_padding=True)
        add = self._writer(self._index(op.raw) + 1, out)
        ids = op.raw.input("Ids")[0]
        lookup, last = "lookup_table_v2", len(self.block.var(out).shape) - 1
        cold_value = self._dequantized_rows(add, rows, ids, cold, lookup, padding, out, None)
        scale = add(lookup, {"Ids": ids, "W": cold.scale}, {})  # unpadded: a padding row is never hot
        if cold.half:
            scale = add("cast", {"X": scale}, {"in_dtype": core.VarDesc.VarType.FP16,
                                               "out_dtype": core.VarDesc.VarType.FP32})
        is_hot = add("scale", {"X": add("sign", {"X": add("abs", {"X": scale}, {})}, {})},
                     {"scale": -1.0, "bias": 1.0})
        count = self.block.var(weights).shape[0]
        digits = add("slice", {"Input": rows}, {"axes": [last], "starts": [0], "ends": [count], "decrease_axis": [],
                                                "infer_flags": [1]})
        digits = add("cast", {"X": digits}, {"in_dtype": _INT_DTYPES[8], "out_dtype": core.VarDesc.VarType.FP32})
        weighted = add("elementwise_mul", {"X": add("elementwise_mul", {"X": digits, "Y": weights}, {"axis": -1}),
                                           "Y": is_hot}, {"axis": -1})
        position = add("reduce_sum", {"X": weighted}, {"dim": [last], "keep_dim": False, "reduce_all": False})
        hot_ids = add("cast", {"X": position}, {"in_dtype": core.VarDesc.VarType.FP32,
                                                "out_dtype": core.VarDesc.VarType.INT64})
        stored = list(self.block.var(out).shape[:-1]) + [self.block.var(hot.codes).shape[1]]
        hot_rows = self.block.create_var(name=self._new_var_name(f"{out}.hot.int8"), dtype="int8", shape=stored).name
        add(lookup, {"Ids": hot_ids, "W": hot.codes}, {}, result=hot_rows)
        hot_value = self._dequantized_rows(add, hot_rows, hot_ids, hot, lookup, {}, out, None)
        add("elementwise_add", {"X": cold_value, "Y": hot_value}, {"axis": -1}, result=out)

    def _stored_rows(self, op: OpRef, weight: Operand, tables: LookupTables, out: str, out_slot: str,
                     drop_padding: bool) -> str:
        """Make ``op`` look up ``tables.codes`` into a new int8 variable (returned) instead of ``out``; per row, the
        scale lookup zeroes the padding row, so the int8 lookup drops it (paddle2onnx 2.1 aborts on an int8 table
        with one)."""
        stored = list(self.block.var(out).shape[:-1]) + [self.block.var(tables.codes).shape[1]]
        rows = self.block.create_var(name=self._new_var_name(f"{out}.int8"), dtype="int8", shape=stored)
        op.raw._rename_input(weight.value, tables.codes)
        op.raw._rename_output(out, rows.name)
        if drop_padding and op.raw.has_attr("padding_idx"):
            op.raw._set_attr("padding_idx", -1)
        return rows.name

    def _writer(self, at: int, out: str) -> Any:
        """``add(op_type, inputs, attrs, result=None, extra=None)``: insert ops one after another from ``at``;
        each returns its output (a new variable shaped like ``out`` unless ``result`` is given)."""

        def add(op_type: str, inputs: dict[str, str], attrs: dict[str, Any], result: str | None = None,
                extra: dict[str, str] | None = None) -> str:
            nonlocal at
            result = result or self._tmp_var(self._new_var_name(f"{out}.{op_type}"), out)
            outputs = {"Out": [result], **{k: [v] for k, v in (extra or {}).items()}}
            self.block._insert_op(
                at, type=op_type, inputs={k: [v] for k, v in inputs.items()}, outputs=outputs, attrs=attrs
            )
            at += 1
            return result

        return add

    def _dequantized_rows(self, add: Any, rows: str, ids: str, tables: LookupTables, lookup: str,
                          padding: dict[str, Any], out: str, result: str | None) -> str:
        """Ops turning the int8 ``rows`` looked up with ``ids`` into float32 rows (into ``result`` if given)."""
        if tables.byte_values is not None:  # packed: byte + 128 indexes the values of its codes
            last = len(self.block.var(out).shape) - 1  # positive axes: the legacy kernels misread negative ones
            index = add("cast", {"X": rows}, {"in_dtype": _INT_DTYPES[8], "out_dtype": core.VarDesc.VarType.INT64})
            index = add("scale", {"X": index}, {"scale": 1.0, "bias": 128.0, "bias_after_scale": True})
            values = add("lookup_table_v2", {"Ids": index, "W": tables.byte_values}, {})
            xshape = self.block.create_var(name=self._new_var_name(f"{out}.xshape"), dtype="float32")
            value = add("flatten_contiguous_range", {"X": values}, {"start_axis": last, "stop_axis": last + 1},
                        extra={"XShape": xshape.name})
            if tables.padded:
                value = add("slice", {"Input": value}, {"axes": [last], "starts": [0], "ends": [tables.dim],
                                                        "decrease_axis": [], "infer_flags": [1]})
        else:
            value = add("cast", {"X": rows}, {"in_dtype": _INT_DTYPES[8], "out_dtype": core.VarDesc.VarType.FP32})
            if tables.log_step is not None:  # sign(c) * exp(log_step * (1 - |c|))
                step = tables.log_step
                sign = add("sign", {"X": value}, {})
                power = add("scale", {"X": add("abs", {"X": value}, {})}, {"scale": -step, "bias": step})
                value = add("elementwise_mul", {"X": sign, "Y": add("exp", {"X": power}, {})}, {"axis": -1})
        def row_values(table: str) -> str:  # a per-row table's looked-up values, as float32
            looked_up = add(lookup, {"Ids": ids, "W": table}, padding)
            if not tables.half:
                return looked_up
            return add("cast", {"X": looked_up}, {"in_dtype": core.VarDesc.VarType.FP16,
                                                  "out_dtype": core.VarDesc.VarType.FP32})

        scale = row_values(tables.scale) if tables.per_row else tables.scale
        if tables.offset is None:
            return add("elementwise_mul", {"X": value, "Y": scale}, {"axis": -1}, result=result)
        scaled = add("elementwise_mul", {"X": value, "Y": scale}, {"axis": -1})
        return add("elementwise_add", {"X": scaled, "Y": row_values(tables.offset)}, {"axis": -1}, result=result)

    def lookup_reads_sequences(self, op: OpRef) -> bool:
        ids_slot = "x" if op.type == "embedding_with_scaled_gradient" else "Ids"
        return any(self.block._find_var_recursive(name).lod_level > 0 for name in op.raw.input(ids_slot))

    def _build_lookup_fused(self, op: OpRef, tables: LookupTables, op_type: str) -> None:
        ids_slot, out_slot = ("x", "out") if op.type == "embedding_with_scaled_gradient" else ("Ids", "Out")
        padding = op.raw.attr("padding_idx") if op.raw.has_attr("padding_idx") else -1
        inputs = {"Ids": op.raw.input(ids_slot), "Codes": [tables.codes], "Scale": [tables.scale]}
        values = tables.byte_values if tables.byte_values is not None else tables.code_values
        for slot, name in (("Offset", tables.offset), ("Values", values)):
            if name is not None:
                inputs[f"{slot}@OPTIONAL"] = [name]  # how a custom op's optional input is named in a ProgramDesc
        out = op.raw.output(out_slot)
        reader, pooling = None, "sum"  # lookup_table (v1): its ids end in a 1, which its output drops
        if op.type != "lookup_table":
            reader, pooling = self._bag_reduce(out[0], padding)
        if reader is not None:  # the op pools: it writes the reduction's output, which goes with the rows
            out = reader.output("Out")
            self.block._remove_op(self._index(reader))
        at = self._index(op.raw)
        self.block._insert_op(at + 1, type=op_type, inputs=inputs, outputs={"Out": out},
                              attrs=self._fused_attrs(tables, pooling, padding))
        self.block._remove_op(at)

    def _bag_reduce(self, rows: str, padding_idx: int) -> tuple[Any, str]:
        """The reduce_sum / reduce_mean that is the only reader of the lookup's ``rows`` and that the fused op
        can do, and its pooling; (None, "none") when there is none."""
        reader = self._single_consumer(rows)
        kinds = {"reduce_sum": "sum", "reduce_mean": "mean"}
        if (reader is None or reader.type not in kinds or reader.attr("reduce_all")
                or rows in {v.name for v in self.model.fetch_targets}):
            return None, "none"
        pooling = self._bag_pooling(kinds[reader.type], reader.attr("dim"), reader.attr("keep_dim"),
                                    len(self.block.var(rows).shape), padding_idx)
        return (reader, pooling) if pooling else (None, "none")

    def _new_var_name(self, base: str) -> str:
        name, k = base, 1
        while self.block._find_var_recursive(name) is not None:
            k += 1
            name = f"{base}_{k}"
        return name

    def _single_consumer(self, var_name: str) -> Any | None:
        users = [op for op in self.block.ops if var_name in op.input_arg_names]
        return users[0] if len(users) == 1 else None

    def _producer(self, var_name: str) -> Any | None:
        for op in self.block.ops:
            if var_name in op.output_arg_names:
                return op
        return None

    def added_param(self, add: OpRef) -> Operand | None:
        return self._bias_param(add.raw)

    def bias_operand(self, op: OpRef) -> Operand | None:
        out = op.raw.output_arg_names[0]
        add = self._single_consumer(out)
        if add is None or add.type != "elementwise_add" or add.input("X")[0] != out:
            return None
        return self._bias_param(add)

    def _bias_param(self, add: Any) -> Operand | None:
        """The bias parameter ``add`` adds (directly or through a reshape2)."""
        y = add.input("Y")[0]
        holder, slot = add, "Y"
        producer = self._producer(y)
        if producer is not None and producer.type in ("reshape2", "reshape"):
            holder, slot = producer, "X"
        operand = self._operand_in_slot(OpRef(holder, holder.type, None, ""), slot)
        return operand if operand is not None and operand.is_param else None

    def _fusable_conv_biases(self) -> None:
        """Add each conv's 1-D bias with ``axis=1`` instead of Paddle 3's ``reshape2`` to [1, C, 1, 1] + ``axis=-1``.

        ``conv_bias_onednn_fuse_pass`` rejects the latter, so the conv would run unfused (an fp32
        output, a separate add) and no residual add could fuse into it. Same values.
        """
        for conv in [op for op in self.block.ops if op.type in CONV_TYPES]:
            add = self._single_consumer(conv.output("Output")[0])
            if add is None or add.type != "elementwise_add" or add.input("X") != conv.output("Output"):
                continue
            reshaped = add.input("Y")[0]
            reshape = self._producer(reshaped)
            if reshape is None or reshape.type != "reshape2" or self._single_consumer(reshaped) is not add:
                continue
            bias = self.block._find_var_recursive(reshape.input("X")[0])
            if bias is None or not bias.persistable or len(bias.shape) != 1:
                continue
            add._rename_input(reshaped, bias.name)
            add._set_attr("axis", 1)
            if not any(set(reshape.output_arg_names) & set(op.input_arg_names) for op in self.block.ops):
                self.block._remove_op(self._index(reshape))

    def _conv_before_bn(self, bn: OpRef) -> tuple[OpRef, Operand | None] | None:
        if bn.raw.has_attr("is_test") and not bn.raw.attr("is_test"):
            return None
        producer = self._producer(bn.raw.input("X")[0])
        bias = None
        if producer is not None and producer.type == "elementwise_add":
            conv_out = producer.input("X")[0]
            bias = self._bias_param(producer)
            if bias is None or self._single_consumer(conv_out) is not producer:
                return None
            producer = self._producer(conv_out)
        if producer is None or producer.type not in CONV_TYPES:
            return None
        if self._single_consumer(producer.output("Output")[0]) is None:
            return None
        conv = OpRef(producer, producer.type, producer.type, self._scope_name(producer))
        return (conv, bias) if self.weight_operand(conv) is not None else None

    def _bn_params(self, bn: OpRef) -> tuple[np.ndarray, ...]:
        get = lambda slot: self.get_param(bn.raw.input(slot)[0]).astype(np.float64)  # noqa: E731
        return get("Scale"), get("Bias"), get("Mean"), get("Variance"), float(bn.raw.attr("epsilon"))

    def _replace_bn(self, conv: OpRef, bias: Operand | None, bn: OpRef, folded_bias: np.ndarray) -> None:
        bias_name = self._new_param_name((bias.name if bias else conv.raw.output_arg_names[0]) + ".bn_folded")
        self._add_param(bias_name, folded_bias)
        y = bn.raw.output("Y")[0]
        at = self._index(bn.raw)
        if bias is not None:
            self._set_operand(bias, bias_name)
            add = self._producer(bn.raw.input("X")[0])
            add._rename_output(add.output("Out")[0], y)
        else:
            self.block._insert_op(
                at,
                type="elementwise_add",
                inputs={"X": [bn.raw.input("X")[0]], "Y": [bias_name]},
                outputs={"Out": [y]},
                attrs={"axis": 1},
            )
            at += 1
        self.block._remove_op(at)

    # ---- reading a quantized program back ---------------------------------------------
    def _unquantize(self) -> tuple[list[tuple[Any, ActivationGrid]], list[StoredWeight]]:
        fold_shifts(self.model.program)  # zero points stand for the shifts again
        markers: list[tuple[Any, ActivationGrid]] = []
        weights: list[StoredWeight] = []
        index = 0
        while index < len(self.block.ops):
            op = self.block.ops[index]
            source = op.input("X")[0] if "X" in op.input_names and op.input("X") else None
            persistable = source is not None and self.block._find_var_recursive(source).persistable
            if op.type == "quantize_linear" and not persistable:
                grid = self._grid(op)
                markers.append((self._marker_for_pair(index), grid))
            elif persistable and op.type in ("dequantize_linear", "cast"):
                chain = [op] if op.type == "dequantize_linear" else [op, self._single_consumer(op.output("Out")[0])]
                if chain[-1] is not None and chain[-1].type in ("dequantize_linear", "elementwise_mul"):
                    weights.extend(self._float_weight(chain))
                    continue  # the next op moved to ``index``
            index += 1
        return markers, weights

    def _grid(self, quantize: Any) -> ActivationGrid:
        bits = quantize.attr("bit_length")
        top = quantize.attr("qmax") if quantize.has_attr("qmax") else qmax(bits)
        unsigned = quantize.has_attr("qmin") and quantize.attr("qmin") >= 0
        zero = int(self.get_param(quantize.input("ZeroPoint")[0]).ravel()[0]) if quantize.input("ZeroPoint") else 0
        threshold = float(self.get_param(quantize.input("Scale")[0]).ravel()[0])
        return ActivationGrid(threshold / top, zero, 0 if unsigned else -top - 1, top)

    def _marker_for_pair(self, index: int) -> Any:
        """Replace the pair ``quantize_linear`` (at ``index``) -> ``dequantize_linear`` by one marker cast."""
        quantize = self.block.ops[index]
        at, dequantize = next((i, o) for i, o in enumerate(self.block.ops) if i > index
                              and o.type == "dequantize_linear" and o.input("X") == quantize.output("Y"))
        params = [quantize.input(slot)[0] for slot in ("Scale", "ZeroPoint") if quantize.input(slot)]
        source, codes, out = quantize.input("X")[0], quantize.output("Y")[0], dequantize.output("Y")[0]
        self.block._remove_op(at)
        self.block._remove_op(index)  # ``quantize`` and ``dequantize`` are gone: not to be read again
        self.block._remove_var(codes)
        self.block._insert_op(index, type="cast", inputs={"X": [source]}, outputs={"Out": [out]},
                              attrs={"in_dtype": core.VarDesc.VarType.FP32, "out_dtype": core.VarDesc.VarType.FP32})
        for name in params:
            self._drop_if_unused(name)
        return self.block.ops[index]

    def _float_weight(self, chain: list[Any]) -> list[StoredWeight]:
        """Replace the dequantizing ``chain`` of an integer weight by a float parameter.

        ``dequantize_linear`` reads thresholds, cast -> ``elementwise_mul`` steps. Codes wider than 8 bits
        come back as a float weight only (no record): they have no int8 form to export.
        """
        codes_name = chain[0].input("X")[0]
        codes = self.get_param(codes_name)
        if chain[0].type == "dequantize_linear":
            axis = chain[0].attr("quant_axis")
            thresholds = self.get_param(chain[0].input("Scale")[0]).ravel()
            steps = scale_from_threshold(thresholds, chain[0].attr("bit_length"))
        else:
            steps = self.get_param(chain[1].input("Y")[0]).ravel()
            axis = chain[1].attr("axis") if steps.size > 1 else -1
        axis = None if axis < 0 or steps.size == 1 else axis
        steps = np.asarray(steps, np.float32)
        value = dequantize(codes, steps if axis is not None else float(steps[0]), axis).astype(np.float32)
        name = self._add_param(self._float_param_name(codes_name), value)
        out = chain[-1].output_arg_names[0]
        for reader in self.block.ops:
            if out in reader.input_arg_names:
                reader._rename_input(out, name)
        inputs = [n for op in chain for n in op.input_arg_names]
        outputs = [n for op in chain for n in op.output_arg_names]
        for op in chain:
            self.block._remove_op(self._index(op))
        for n in outputs:
            self.block._remove_var(n)
        for n in inputs:
            self._drop_if_unused(n)
        return [StoredWeight(name, codes, steps, axis)] if codes.dtype == np.int8 else []

    def int8_weight_codes(self) -> int:
        count = 0
        with self._editing():
            for op in self.block.ops:
                if op.type != "dequantize_linear":
                    continue
                var = self.block._find_var_recursive(op.input("X")[0])
                if var is None or not var.persistable or var.dtype != core.VarDesc.VarType.FP32:
                    continue
                tensor = self.model.scope.find_var(var.name).get_tensor()
                codes = np.array(tensor)
                if not (np.array_equal(codes, np.rint(codes)) and np.abs(codes).max(initial=0) <= 128):
                    continue  # not codes: a float weight some other tool dequantizes
                var.desc.set_dtype(core.VarDesc.VarType.INT8)
                tensor.set(np.clip(codes, -128, 127).astype(np.int8), core.CPUPlace())
                count += 1
        return count

    def clone(self) -> LegacyGraph:
        model = self.model
        with self._editing():
            program = model.program.clone()
        copy = Model(
            program, list(model.feed_names), [], model.scope, model.family, model.source,
            model.executor,
        )
        copy.fetch_targets = [copy.program.global_block().var(v.name) for v in model.fetch_targets]
        return LegacyGraph(copy)
