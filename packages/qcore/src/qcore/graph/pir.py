"""Graph backend for PIR programs (``.json`` models, Paddle 3's default IR).

Quantized form. Measured on Paddle 3.3.1 (CPU): ``pd_op.dequantize_linear`` returns
re-quantized values instead of dequantized ones in the executor, and a PIR model holding
``quantize_linear``/``dequantize_linear`` fails in Paddle Inference ("Tensor holds no
memory"). So the PIR form uses ops that run correctly in both:

* activations: ``pd_op.fake_quantize_dequantize_moving_average_abs_max`` with ``is_test``
  (its ``in_scale`` is the threshold; round-to-nearest-even, clip to [-qmax-1, qmax]);
* weights: an int8/int16 parameter -> ``pd_op.cast`` to float32 -> ``pd_op.multiply`` by a
  per-channel scale parameter shaped to broadcast. The file stores integer weights (1/4 of
  float for int8); Paddle Inference dequantizes them at run time and computes in float, so
  the PIR form saves size but does not run int8 kernels (the legacy form does).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import numpy as np
import paddle

from ..errors import GraphError
from ..model_io import Model
from ..optable import CONV_TYPES
from ..quant import qmax, scale_from_threshold
from .base import ROUND_HALF_EVEN, ActivationGrid, Graph, LookupTables, Operand, OpRef, QuantizedWeight, StoredWeight

_PARAM_OP = "builtin.parameter"
_ACT_QDQ = "pd_op.fake_quantize_dequantize_moving_average_abs_max"
_FLOAT_DTYPES = (paddle.float32, paddle.float64, paddle.float16, paddle.bfloat16)


def _defining_op(value: Any) -> Any | None:
    try:
        return value.get_defining_op()
    except Exception:  # block arguments have no defining op
        return None


class PirGraph(Graph):
    family = "pir"
    _CAST = "pd_op.cast"

    def __init__(self, model: Model) -> None:
        super().__init__(model)
        self.block = model.program.global_block()
        #: the startup program of the parameters built into this program (run it to initialise new ones)
        self.startup = paddle.static.Program()

    def _raw_ops(self) -> list[Any]:
        return list(self.block.ops)

    def _op_type(self, raw: Any) -> str:
        return raw.name()

    def _scope_name(self, raw: Any) -> str:
        return str(raw.attrs().get("struct_name", ""))

    def _param_name(self, value: Any) -> str | None:
        op = _defining_op(value)
        return op.attrs()["parameter_name"] if op is not None and op.name() == _PARAM_OP else None

    def _value_name(self, value: Any) -> str:
        param = self._param_name(value)
        if param is not None:
            return param
        op = _defining_op(value)
        if op is None:
            return f"arg{value.id}"
        if op.name() == "pd_op.data":
            return str(op.attrs()["name"])
        index = next(i for i, r in enumerate(op.results()) if r.is_same(value))
        position = next(i for i, o in enumerate(self.block.ops) if o.id() == op.id())
        return f"{op.name().split('.')[-1]}_{position}.out{index}"

    def _make_operand(self, op: OpRef, slot: str, index: int) -> Operand | None:
        value = op.raw.operand_source(index)
        if value is None or not value.initialized() or not value.is_dense_tensor_type():
            return None
        if value.dtype not in _FLOAT_DTYPES:
            return None
        param = self._param_name(value)
        return Operand(op, slot, index, value, param or self._value_name(value), param is not None)

    @staticmethod
    def _input_names(raw: Any) -> list[str]:
        try:
            return list(raw.get_input_names())
        except ValueError:  # builtin ops (combine, slice, ...) have no named inputs
            return []

    @staticmethod
    def _output_names(raw: Any) -> list[str]:
        try:
            return list(raw.get_output_names())
        except ValueError:
            return []

    def operands(self, op: OpRef) -> list[Operand]:
        names = self._input_names(op.raw)
        found = []
        for i in range(op.raw.num_operands()):
            operand = self._make_operand(op, names[i] if i < len(names) else str(i), i)
            if operand is not None:
                found.append(operand)
        return found

    def _operand_in_slot(self, op: OpRef, slot: str) -> Operand | None:
        names = self._input_names(op.raw)
        return self._make_operand(op, slot, names.index(slot)) if slot in names else None

    def output(self, op: OpRef) -> Any:
        return op.raw.result(0)

    def attrs(self, op: OpRef) -> dict[str, Any]:
        return dict(op.raw.attrs())

    def _weight_transposed(self, op: OpRef) -> bool:
        return bool(self.attrs(op).get("transpose_y", False))

    def attr(self, op: OpRef, name: str, default: Any = None) -> Any:
        return op.raw.attrs().get(name, default)

    def input_names(self, op: OpRef, slot: str | None = None) -> list[str]:
        indices = range(op.raw.num_operands()) if slot is None else [self._input_names(op.raw).index(slot)]
        return [self._value_name(op.raw.operand_source(i)) for i in indices]

    def output_names(self, op: OpRef, slot: str | None = None) -> list[str]:
        indices = range(op.raw.num_results()) if slot is None else [self._output_names(op.raw).index(slot)]
        return [self._value_name(op.raw.result(i)) for i in indices]

    def shape(self, name: str) -> list[int]:
        for raw in self.block.ops:
            for value in raw.results():
                if self._value_name(value) == name:
                    return list(value.shape)
        raise GraphError(f"no tensor named {name!r} in the program")

    # ---- editing ops ------------------------------------------------------------------
    def rename_input(self, op: OpRef, old: Any, new: Any) -> None:
        for i in range(op.raw.num_operands()):
            if op.raw.operand_source(i).is_same(old):
                op.raw.operand(i).set_source(new)

    def set_attr(self, op: OpRef, name: str, value: Any) -> None:
        if isinstance(value, bool):
            op.raw.set_bool_attr(name, value)
        elif isinstance(value, int):
            op.raw.set_int_attr(name, value)
        elif isinstance(value, str):
            op.raw.set_str_attr(name, value)
        else:
            raise GraphError(f"{op!r}: PIR attributes set here are bool, int or str; got {type(value).__name__}")

    def retype(self, op: OpRef, op_type: str) -> None:
        raise GraphError(f"{op!r}: a PIR op's type is fixed when it is built; build a {op_type} op instead")

    def _runs_on_onednn(self) -> bool:
        # Paddle 3.3.1's executor builds a PIR op's oneDNN kernel with that kernel's extra attributes at
        # their defaults, whatever the op holds: ``is_test`` false, which oneDNN's conv2d_transpose refuses
        # ("ConvTransposeOneDNN works only for inference"). Its reference CPU kernel runs it.
        return all(raw.name() != "pd_op.conv2d_transpose" for raw in self.block.ops)

    def _training_ops(self) -> list[Any]:
        return [raw for raw in self.block.ops if raw.attrs().get("is_test") is False]

    def _set_is_test(self, raw: Any, value: bool) -> None:
        raw.set_bool_attr("is_test", value)

    def bypass(self, op: OpRef, slot: str) -> None:
        op.raw.result(0).replace_all_uses_with(op.raw.operand_source(self._input_names(op.raw).index(slot)))
        self.block.remove_op(op.raw)

    def inserting_before(self, op: OpRef) -> contextlib.AbstractContextManager[None]:
        return self._inserting_before(op.raw)

    def fake_quant_activation(
        self, before: OpRef, x: Any, state: str, bits: int, moving_rate: float, *, test: bool,
        batch_abs_max: bool = False, initial: float = 0.0,
    ) -> Any:
        with self._inserting_before(before.raw):
            scale = self._state(f"{state}@scale", initial)
            accum, flag = self._state(f"{state}@accum", initial), self._state(f"{state}@state", 1.0 if initial else 0.0)
            if test:
                return paddle._C_ops.fake_quantize_dequantize_moving_average_abs_max(
                    x, scale, accum, flag, moving_rate, bits, True, ROUND_HALF_EVEN
                )[0]
            if batch_abs_max:
                out, batch_scale = paddle._C_ops.fake_quantize_dequantize_abs_max(x, bits, ROUND_HALF_EVEN)
                paddle._C_ops.assign_out_(batch_scale, scale)
                return out
            out, _, new_flag, new_accum = paddle._C_ops.fake_quantize_dequantize_moving_average_abs_max_(
                x, scale, accum, flag, moving_rate, bits, False, ROUND_HALF_EVEN
            )
            paddle._C_ops.assign_out_(new_flag, flag)
            paddle._C_ops.assign_out_(new_accum, accum)
            return out

    def fake_quant_weight(self, before: OpRef, w: Any, bits: int, axis: int | None) -> Any:
        with self._inserting_before(before.raw):
            if axis is not None:
                return paddle._C_ops.fake_channel_wise_quantize_dequantize_abs_max(w, bits, ROUND_HALF_EVEN, axis)[0]
            return paddle._C_ops.fake_quantize_dequantize_abs_max(w, bits, ROUND_HALF_EVEN)[0]

    def _state(self, name: str, value: float) -> Any:
        """A parameter of shape [1] the startup program sets to ``value`` (:attr:`startup`), never trained."""
        param = paddle.static.create_parameter(
            [1], "float32", name=name, default_initializer=paddle.nn.initializer.Constant(value)
        )
        param.stop_gradient = True
        return param

    # ---- building blocks ------------------------------------------------------------
    @contextlib.contextmanager
    def _inserting_before(self, raw: Any) -> Iterator[None]:
        """Ops built in the body go into this program, just before ``raw``."""
        with paddle.static.program_guard(self.model.program, self.startup):
            paddle.pir.set_insertion_point(raw)
            yield

    def _add_param(self, name: str, value: np.ndarray, before: OpRef | Any) -> Any:
        raw = before.raw if isinstance(before, OpRef) else before
        dtype = str(value.dtype) if value.dtype in (np.int8, np.int16, np.float16) else "float32"
        with self._inserting_before(raw):
            param = paddle.static.create_parameter(
                list(value.shape), dtype, name=name,
                default_initializer=paddle.nn.initializer.Constant(0.0),
            )
        param.stop_gradient = True
        self.set_param(name, value if dtype != "float32" else value.astype(np.float32))
        return param

    def param_names(self) -> list[str]:
        return sorted(op.attrs()["parameter_name"] for op in self.block.ops if op.name() == _PARAM_OP)

    def _key(self, value: Any) -> str:
        return str(value.id)

    def _param_value(self, name: str) -> Any:
        for op in self.block.ops:
            if op.name() == _PARAM_OP and op.attrs()["parameter_name"] == name:
                return op.result(0)
        raise KeyError(name)

    def _set_operand(self, operand: Operand, value: Any) -> None:
        old = operand.op.raw.operand_source(operand.index)
        operand.op.raw.operand(operand.index).set_source(value)
        self._drop_if_unused(old)

    def _drop_if_unused(self, value: Any) -> None:
        """Remove a parameter op nobody reads any more, so save does not write it."""
        op = _defining_op(value)
        if op is not None and op.name() == _PARAM_OP and value.use_empty():
            self.block.remove_op(op)

    # ---- rewrites -------------------------------------------------------------------
    def _fusable_conv_biases(self) -> None:
        """Nothing to do: PIR output runs float kernels, whose passes take Paddle 3's bias form."""

    def _build_act_qdq(
        self, operand: Operand, threshold: float, bits: int, unsigned: bool, offset: float, zero_point: bool
    ) -> Any:
        if unsigned:
            raise GraphError("unsigned activations are a legacy-program feature (oneDNN int8); PIR QDQ is signed")
        # ``zero_point``: PIR programs always carry asymmetric grids as shifts, which exporters read back
        scale, accum, state = (
            self._add_param(self._new_param_name(f"{operand.name}@{kind}"), np.array([v], np.float32), operand.op)
            for kind, v in (("scale", threshold), ("accum", 1.0), ("state", 1.0))
        )
        with self._inserting_before(operand.op.raw):
            x = paddle._C_ops.scale(operand.value, 1.0, -offset, True) if offset else operand.value
            out = paddle._C_ops.fake_quantize_dequantize_moving_average_abs_max(x, scale, accum, state, 0.9, bits,
                                                                                 True, 0)[0]
            return paddle._C_ops.scale(out, 1.0, offset, True) if offset else out

    def _build_channel_scale(self, operands: list[Operand], factors: np.ndarray) -> None:
        first = operands[0]
        param = self._add_param(self._new_param_name(f"{first.name}@smooth"), factors, first.op)
        with self._inserting_before(first.op.raw):
            scaled = paddle._C_ops.multiply(first.value, param)
        for operand in operands:
            self._set_operand(operand, scaled)

    def _build_weight_dq(self, operand: Operand, weight: QuantizedWeight) -> Any:
        codes = self._add_param(self._new_param_name(f"{operand.name}.quantized"), weight.codes, operand.op)
        scales = np.asarray(scale_from_threshold(weight.thresholds, weight.bits), np.float32)
        shape = [1] * weight.codes.ndim
        if weight.axis is not None:
            shape[weight.axis] = -1
        scale = self._add_param(
            self._new_param_name(f"{operand.name}@scale"), scales.reshape(shape), operand.op
        )
        with self._inserting_before(operand.op.raw):
            return paddle._C_ops.multiply(paddle._C_ops.cast(codes, paddle.float32), scale)

    def _build_lookup_dq(self, op: OpRef, weight: Operand, tables: LookupTables) -> None:
        padding_idx = int(op.raw.attrs().get("padding_idx", -1))
        last = len(op.raw.result(0).shape) - 1  # positive axes, as the legacy form needs
        with self._inserting_before(op.raw):
            value, _ = self._dequantized_rows(op.raw.operand_source(0), tables, padding_idx, last)
        self._replace_result(op.raw, value)

    def _build_mixed_lookup_dq(self, op: OpRef, weight: Operand, cold: LookupTables, hot: LookupTables,
                               weights: Any) -> None:
        ids = op.raw.operand_source(0)
        padding_idx = int(op.raw.attrs().get("padding_idx", -1))
        last = len(op.raw.result(0).shape) - 1
        count = weights.shape[0]
        with self._inserting_before(op.raw):
            cold_value, stored = self._dequantized_rows(ids, cold, padding_idx, last)
            scale = paddle._C_ops.embedding(ids, cold.scale, -1, False)  # unpadded: a padding row is never hot
            if cold.half:
                scale = paddle._C_ops.cast(scale, paddle.float32)
            is_hot = paddle._C_ops.scale(paddle._C_ops.sign(paddle._C_ops.abs(scale)), -1.0, 1.0, True)
            digits = paddle._C_ops.cast(paddle._C_ops.slice(stored, [last], [0], [count], [1], []), paddle.float32)
            position = paddle._C_ops.sum(paddle._C_ops.multiply(paddle._C_ops.multiply(digits, weights), is_hot),
                                         [last], paddle.float32, False)
            hot_value, _ = self._dequantized_rows(paddle._C_ops.cast(position, paddle.int64), hot, -1, last)
            value = paddle._C_ops.add(cold_value, hot_value)
        self._replace_result(op.raw, value)

    @staticmethod
    def _dequantized_rows(ids: Any, tables: LookupTables, padding_idx: int, last: int) -> tuple[Any, Any]:
        """The float32 rows of ``tables`` at ``ids`` and the stored (int8) rows they come from."""
        # per row, the scale lookup zeroes the padding row, so the int8 lookup needs no padding_idx (paddle2onnx
        # 2.1 aborts on an int8 table with one)
        rows = paddle._C_ops.embedding(ids, tables.codes, -1 if tables.per_row else padding_idx, False)
        if tables.byte_values is not None:  # packed: byte + 128 indexes the values of its codes
            index = paddle._C_ops.scale(paddle._C_ops.cast(rows, paddle.int64), 1.0, 128.0, True)
            value = paddle._C_ops.flatten(paddle._C_ops.embedding(index, tables.byte_values, -1, False), last,
                                          last + 1)
            if tables.padded:
                value = paddle._C_ops.slice(value, [last], [0], [tables.dim], [1], [])
        else:
            value = paddle._C_ops.cast(rows, paddle.float32)
            if tables.log_step is not None:  # sign(c) * exp(log_step * (1 - |c|))
                step = tables.log_step
                power = paddle._C_ops.scale(paddle._C_ops.abs(value), -step, step, True)
                value = paddle._C_ops.multiply(paddle._C_ops.sign(value), paddle._C_ops.exp(power))

        def row_values(table: Any) -> Any:  # a per-row table's looked-up values, as float32
            looked_up = paddle._C_ops.embedding(ids, table, padding_idx, False)
            return paddle._C_ops.cast(looked_up, paddle.float32) if tables.half else looked_up

        value = paddle._C_ops.multiply(value, row_values(tables.scale) if tables.per_row else tables.scale)
        if tables.offset is not None:
            value = paddle._C_ops.add(value, row_values(tables.offset))
        return value, rows

    def _build_lookup_fused(self, op: OpRef, tables: LookupTables, op_type: str) -> None:
        padding_idx = int(op.raw.attrs().get("padding_idx", -1))
        values = tables.byte_values if tables.byte_values is not None else tables.code_values
        reader, pooling = self._bag_reduce(op.raw, padding_idx)
        attrs = self._fused_attrs(tables, pooling, padding_idx)
        with self._inserting_before(op.raw):
            (value,) = paddle._C_ops._run_custom_op(op_type, op.raw.operand_source(0), tables.codes, tables.scale,
                                                    tables.offset, values, *attrs.values())
        if reader is not None:  # the op pools: the reduction, its axis and the rows it read go
            axis = _defining_op(reader.operand_source(1))
            self._replace_result(reader, value)
            self.block.remove_op(op.raw)
            if axis.result(0).use_empty():
                self.block.remove_op(axis)
        else:
            self._replace_result(op.raw, value)

    def _bag_reduce(self, lookup: Any, padding_idx: int) -> tuple[Any, str]:
        """The sum / mean that is the only reader of ``lookup``'s rows and that the fused op can do, and its
        pooling; (None, "none") when there is none."""
        rows = lookup.result(0)
        reader = self._single_user(rows)
        kinds = {"pd_op.sum": "sum", "pd_op.mean": "mean"}
        if reader is None or reader.name() not in kinds or any(rows.is_same(t) for t in self.model.fetch_targets):
            return None, "none"
        axis = _defining_op(reader.operand_source(1))
        if axis is None or axis.name() != "pd_op.full_int_array":
            return None, "none"
        pooling = self._bag_pooling(kinds[reader.name()], axis.attrs()["value"], reader.attrs()["keepdim"],
                                    len(rows.shape), padding_idx)
        return (reader, pooling) if pooling else (None, "none")

    def _single_user(self, value: Any) -> Any | None:
        users = value.all_used_ops()
        return users[0] if len(users) == 1 else None

    def added_param(self, add: OpRef) -> Operand | None:
        for index in range(2):
            found = self._bias_of_add(add.raw, add.raw.operand_source(index))
            if found is not None:
                return found
        return None

    def bias_operand(self, op: OpRef) -> Operand | None:
        out = op.raw.result(0)
        add = self._single_user(out)
        if add is None or add.name() != "pd_op.add":
            return None
        return self._bias_of_add(add, out)

    def _bias_of_add(self, add: Any, conv_out: Any) -> Operand | None:
        """The bias parameter operand of ``add`` (directly or through a reshape)."""
        other = next(i for i in range(2) if not add.operand_source(i).is_same(conv_out))
        value = add.operand_source(other)
        producer = _defining_op(value)
        if producer is not None and producer.name() == "pd_op.reshape":
            holder, index = producer, 0
        else:
            holder, index = add, other
        ref = OpRef(holder, holder.name(), None, "")
        operand = self._make_operand(ref, str(index), index)
        return operand if operand is not None and operand.is_param else None

    @staticmethod
    def _is_conv_output(value: Any) -> bool:
        op = _defining_op(value)
        return op is not None and op.name().split(".")[-1] in CONV_TYPES

    def _conv_before_bn(self, bn: OpRef) -> tuple[OpRef, Operand | None] | None:
        if not bn.raw.attrs().get("is_test", True):
            return None
        x = bn.raw.operand_source(0)
        producer = _defining_op(x)
        bias = None
        if producer is not None and producer.name() == "pd_op.add":
            conv_out = next((v for v in producer.operands_source() if self._is_conv_output(v)), None)
            if conv_out is None or self._single_user(x) is None:
                return None
            bias = self._bias_of_add(producer, conv_out)
            if bias is None or self._single_user(conv_out) is None:
                return None
            producer = _defining_op(conv_out)
        if producer is None or producer.name().split(".")[-1] not in CONV_TYPES:
            return None
        if self._single_user(producer.result(0)) is None:
            return None
        seed = producer.name().split(".")[-1]
        conv = OpRef(producer, producer.name(), seed, self._scope_name(producer))
        return (conv, bias) if self.weight_operand(conv) is not None else None

    def _bn_params(self, bn: OpRef) -> tuple[np.ndarray, ...]:
        names = bn.raw.get_input_names()
        get = lambda slot: self.get_param(self._param_name(bn.raw.operand_source(names.index(slot))))  # noqa: E731
        return (
            get("scale").astype(np.float64), get("bias").astype(np.float64), get("mean").astype(np.float64),
            get("variance").astype(np.float64), float(bn.raw.attrs()["epsilon"]),
        )

    def _replace_bn(self, conv: OpRef, bias: Operand | None, bn: OpRef, folded_bias: np.ndarray) -> None:
        if bias is not None:
            old_shape = self.get_param(bias.name).shape
            new = self._new_param_name(bias.name + ".bn_folded")
            self._set_operand(bias, self._add_param(new, folded_bias.reshape(old_shape), bias.op))
            out = bn.raw.operand_source(0)
        else:
            channels = folded_bias.size
            new = self._new_param_name(self._value_name(conv.raw.result(0)) + ".bn_folded_bias")
            param = self._add_param(new, folded_bias.reshape([1, channels, 1, 1]), bn)
            with self._inserting_before(bn.raw):
                out = paddle._C_ops.add(bn.raw.operand_source(0), param)
        bn.raw.result(0).replace_all_uses_with(out)
        inputs = [bn.raw.operand_source(i) for i in range(1, bn.raw.num_operands())]
        self.block.remove_op(bn.raw)
        for value in inputs:
            self._drop_if_unused(value)

    # ---- reading a quantized program back ---------------------------------------------
    def _unquantize(self) -> tuple[list[tuple[Any, ActivationGrid]], list[StoredWeight]]:
        markers: list[tuple[Any, ActivationGrid]] = []
        weights: list[StoredWeight] = []
        for op in [o for o in self.block.ops if o.name() == _ACT_QDQ]:
            top = qmax(int(op.attrs()["bit_length"]))
            step = float(self.get_param(self._param_name(op.operand_source(1))).ravel()[0]) / top
            shifts = self._shifts(op)
            with self._inserting_before(op):
                marker = paddle._C_ops.cast((shifts[0] if shifts else op).operand_source(0), paddle.float32)
            offset = 0.0
            if shifts is not None:  # x - offset -> QDQ -> + offset: the grid's zero point is -offset / step
                offset = float(shifts[1].attrs()["bias"])
                self._replace_result(shifts[1], marker)
            self._replace_result(op, marker)
            if shifts is not None:  # the shift before the pair, read by nothing now
                self.block.remove_op(shifts[0])
            markers.append((marker.get_defining_op(), ActivationGrid(step, -round(offset / step), -top - 1, top)))
        for name in [n for n in self.param_names() if self.get_param(n).dtype.kind == "i"]:
            weights.extend(self._float_weight(self._param_value(name).get_defining_op()))
        return markers, weights

    def _shifts(self, qdq: Any) -> tuple[Any, Any] | None:
        """The ``scale`` ops that put the activation of ``qdq`` on an asymmetric grid (``x - offset`` before
        it, ``+ offset`` after it, as :meth:`_build_act_qdq` writes them), or None."""
        before, after = _defining_op(qdq.operand_source(0)), self._single_user(qdq.result(0))

        def shift(op: Any) -> float | None:
            if op is None or op.name() != "pd_op.scale" or not op.attrs().get("bias_after_scale", False) \
                    or "bias" not in op.attrs():
                return None
            factor = _defining_op(op.operand_source(1))
            if factor is None or factor.name() != "pd_op.full" or float(factor.attrs()["value"]) != 1.0:
                return None
            return float(op.attrs()["bias"])

        b, a = shift(before), shift(after)
        if b is None or a is None or b != -a or len(qdq.operand_source(0).all_used_ops()) != 1:
            return None
        return before, after

    def _replace_result(self, op: Any, value: Any) -> None:
        """Make every reader (and fetch) of ``op``'s first result read ``value``; remove ``op`` and the
        parameters only it read."""
        old = op.result(0)
        old.replace_all_uses_with(value)
        self.model.fetch_targets = [value if t.is_same(old) else t for t in self.model.fetch_targets]
        inputs = [op.operand_source(i) for i in range(op.num_operands())]
        self.block.remove_op(op)
        for source in inputs:
            self._drop_if_unused(source)

    def _float_weight(self, param: Any) -> list[StoredWeight]:
        """Replace an integer parameter read through cast -> multiply by the float parameter it stands for."""
        users = param.result(0).all_used_ops()
        cast = users[0] if len(users) == 1 and users[0].name() == "pd_op.cast" else None
        multiply = self._single_user(cast.result(0)) if cast is not None else None
        if multiply is None or multiply.name() != "pd_op.multiply":
            return []  # an integer table read by a lookup, or an integer input of the model's own
        codes_name = param.attrs()["parameter_name"]
        codes = self.get_param(codes_name)
        steps = self.get_param(self._param_name(multiply.operand_source(1)))
        axis = next((i for i, n in enumerate(steps.shape) if n > 1), None)
        value = (codes * steps).astype(np.float32)
        name = self._float_param_name(codes_name)
        self._replace_result(multiply, self._add_param(name, value, multiply))
        self.block.remove_op(cast)
        self._drop_if_unused(param.result(0))
        return [StoredWeight(name, codes, steps.ravel().astype(np.float32), axis)] if codes.dtype == np.int8 else []

    def clone(self) -> PirGraph:
        model = self.model
        with self._editing():
            program = model.program.clone()
        positions = {}
        for i, op in enumerate(self.block.ops):
            for k, r in enumerate(op.results()):
                positions[r.id] = (i, k)
        ops = program.global_block().ops
        fetch = [ops[positions[v.id][0]].result(positions[v.id][1]) for v in model.fetch_targets]
        copy = Model(program, list(model.feed_names), fetch, model.scope, model.family, model.source, model.executor)
        return PirGraph(copy)
