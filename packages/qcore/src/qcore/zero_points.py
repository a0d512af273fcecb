"""Asymmetric activation grids in legacy programs: zero points for runtimes, shifts for the executor.

An activation on an asymmetric grid (:func:`qcore.quant.asymmetric_range`) is quantized as
``x - offset`` with a symmetric QDQ pair, then ``offset`` is added back. Runtimes that read the
``ZeroPoint`` input of ``quantize_linear`` / ``dequantize_linear`` (OpenVINO) run that as one
integer zero point ``z = -offset / step`` and keep their int8 kernels; the two shift ops would
stop them (measured on PP-OCRv4 rec: float speed). Paddle's executor and its native kernels
ignore ``ZeroPoint`` (measured, Paddle 3.3.1), so they need the shifts.

So a program in memory always carries the shifts, marked with :data:`SHIFT_ATTR` when the
runtime reads zero points (and ``ZeroPoint`` then holds ``z``). :func:`fold_shifts` drops the
marked shifts from the copy that is saved; :func:`unfold_zero_points` puts them back into a loaded
program, so the executor runs a saved model as the runtime does.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import paddle

from .quant import scale_from_threshold

#: Attribute of a shift op (an ``elementwise_add`` of a one-element constant) that a saved program
#: carries as its QDQ pair's zero point instead.
SHIFT_ATTR = "qcore_zero_point_shift"


def insert_shift(block: Any, scope: Any, index: int, x: str, out: str, const: str, bias: float, marked: bool) -> None:
    """Insert ``out = x + bias`` at ``index`` of ``block``; ``bias`` is stored as parameter ``const`` in ``scope``."""
    source = block._find_var_recursive(x)
    block.create_var(name=out, shape=source.shape, dtype=source.dtype)
    block.create_var(name=const, shape=[1], dtype="float32", persistable=True)
    scope.var(const).get_tensor().set(np.array([bias], np.float32), paddle.CPUPlace())
    op = block._insert_op(index, type="elementwise_add", inputs={"X": [x], "Y": [const]}, outputs={"Out": [out]},
                          attrs={"axis": -1})
    if marked:
        op._set_attr(SHIFT_ATTR, True)  # an attribute the op does not declare is kept only when set afterwards


def fold_shifts(program: Any) -> int:
    """Remove every marked shift op from ``program`` (a copy about to be saved); returns how many."""
    block = program.global_block()
    removed = 0
    for index in reversed(range(len(block.ops))):
        op = block.ops[index]
        if not op.has_attr(SHIFT_ATTR):
            continue
        x, out, const = op.input("X")[0], op.output("Out")[0], op.input("Y")[0]
        for reader in block.ops:
            if out in reader.input_arg_names:
                reader._rename_input(out, x)
        block._remove_op(index)
        block._remove_var(out)
        block._remove_var(const)
        removed += 1
    return removed


def _param(scope: Any, name: str) -> np.ndarray:
    return np.array(scope.find_var(name).get_tensor())


def unfold_zero_points(program: Any, scope: Any) -> int:
    """Give every activation QDQ pair of a loaded ``program`` with a non-zero zero point its marked
    shifts (what the executor needs to run it as the runtime does); returns how many pairs."""
    block = program.global_block()
    pairs = 0
    index = 0
    while index < len(block.ops):
        op = block.ops[index]
        index += 1
        if op.type != "quantize_linear" or not op.input("ZeroPoint") or block.var(op.input("X")[0]).persistable:
            continue
        x, z = op.input("X")[0], _param(scope, op.input("ZeroPoint")[0]).ravel()
        if z.size != 1 or not z[0]:
            continue
        dequantize = next((d for d in block.ops[index:] if d.type == "dequantize_linear"
                           and d.input("X") == op.output("Y")), None)
        if dequantize is None:
            continue
        step = scale_from_threshold(float(_param(scope, op.input("Scale")[0]).ravel()[0]), op.attr("bit_length"))
        offset = -float(z[0]) * step
        shifted, restored = f"{x}.zp_shifted", f"{dequantize.output('Y')[0]}.zp_restored"
        insert_shift(block, scope, index - 1, x, shifted, f"{shifted}@bias", -offset, True)
        op._rename_input(x, shifted)
        at = next(i for i, o in enumerate(block.ops) if o is dequantize) + 1
        dequantized = dequantize.output("Y")[0]
        readers = [o for o in block.ops[at:] if dequantized in o.input_arg_names]
        insert_shift(block, scope, at, dequantized, restored, f"{restored}@bias", offset, True)
        for reader in readers:
            reader._rename_input(dequantized, restored)
        pairs += 1
        index = at + 1
    return pairs
