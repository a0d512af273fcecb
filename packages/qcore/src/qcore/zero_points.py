"""Asymmetric activation grids in legacy programs: zero points for runtimes, shifts for the executor.

An activation on an asymmetric grid (:func:`qcore.quant.asymmetric_range`) is quantized as
``x - offset`` with a symmetric QDQ pair, then ``offset`` is added back. Runtimes that read the
``ZeroPoint`` input of ``quantize_linear`` / ``dequantize_linear`` (OpenVINO's Paddle frontend) run
that as one integer zero point ``z = -offset / step`` and keep their int8 kernels; the two shift ops
would stop them (measured on PP-OCRv4 rec: float speed). Paddle's executor and its native kernels
ignore ``ZeroPoint`` (measured, Paddle 3.3.1), so they need the shifts.

Three forms of one pair, all computing the simulation where they are read:

* **in memory**: the shifts, marked with :data:`SHIFT_ATTR` when the runtime reads zero points, and
  ``ZeroPoint`` holding ``z`` (the executor ignores it; exporters read it);
* **saved**: the shifts, and the pair reading the zero parameter :data:`ZERO` as its ``ZeroPoint``
  (Paddle's op requires one), its own parked in :data:`PARKED_ATTR` (that parameter stays in the
  params file). Paddle's executor and a plain ``paddle.inference.Config`` run the shifts; OpenVINO
  reading the file itself sees zero point 0 and runs them too (correct; its convs stayed int8, signed
  with a compensation term instead of unsigned, measured on a tiny net). Saved
  with both, OpenVINO applied the offset twice (measured: 4.8x the output's norm off);
* **for the runtime** (:func:`runtime_program`, what qcore's OpenVINO predictors read): ``ZeroPoint``
  back, the shifts folded into it.

Models saved by earlier versions carry ``z`` without shifts; loading gives them their shifts back
(:func:`unfold_zero_points`).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import paddle

from .paddle_env import static_mode
from .quant import scale_from_threshold

#: Attribute of a shift op (an ``elementwise_add`` of a one-element constant) that a saved program
#: carries as its QDQ pair's zero point instead.
SHIFT_ATTR = "qcore_zero_point_shift"
#: Attribute of a saved ``quantize_linear`` / ``dequantize_linear`` naming the ``ZeroPoint`` parameter it reads
#: when the shifts around it are folded (the saved program itself reads none: zero point 0).
PARKED_ATTR = "qcore_parked_zero_point"
#: The zero parameter parked pairs read instead.
ZERO = "qcore_zero_point@0"


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


def fold_shifts(program: Any, keep_constants: bool = False) -> int:
    """Remove every marked shift op from ``program``; returns how many. ``keep_constants`` leaves the shifts'
    constants declared (unread), so the program still matches a params file saved with them."""
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
        if not keep_constants:
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


def _marked_pairs(block: Any) -> list[Any]:
    """The activation ``quantize_linear`` / ``dequantize_linear`` ops between marked shifts."""
    shifted = {o.output("Out")[0] for o in block.ops if o.has_attr(SHIFT_ATTR)}
    quantizes = [o for o in block.ops if o.type == "quantize_linear" and o.input("X")[0] in shifted]
    codes = {q.output("Y")[0] for q in quantizes}
    return quantizes + [o for o in block.ops if o.type == "dequantize_linear" and o.input("X")[0] in codes]


def park_zero_points(program: Any, scope: Any) -> int:
    """The saved form: every marked pair reads :data:`ZERO` (made in ``program`` and ``scope`` when needed) as its
    ``ZeroPoint``, :data:`PARKED_ATTR` naming its own; returns how many ops."""
    block = program.global_block()
    pairs = [op for op in _marked_pairs(block) if op.input("ZeroPoint")[0] != ZERO]
    if pairs:
        block.create_var(name=ZERO, shape=[1], dtype="int32", persistable=True)
        scope.var(ZERO).get_tensor().set(np.zeros(1, np.int32), paddle.CPUPlace())
    for op in pairs:
        op._set_attr(PARKED_ATTR, op.input("ZeroPoint")[0])
        op._rename_input(op.input("ZeroPoint")[0], ZERO)
    return len(pairs)


def unpark_zero_points(program: Any) -> int:
    """Undo :func:`park_zero_points`; returns how many ops read their ``ZeroPoint`` again."""
    parked = [op for op in program.global_block().ops if op.has_attr(PARKED_ATTR)]
    for op in parked:
        op._rename_input(ZERO, op.attr(PARKED_ATTR))
        op.desc.remove_attr(PARKED_ATTR)
    return len(parked)


def runtime_program(model_bytes: bytes) -> bytes | None:
    """A saved legacy program as OpenVINO reads it to keep its int8 kernels: zero points in place of the marked
    shifts (whose constants stay declared, so the program's params file still fits), or None when it has none."""
    with static_mode("legacy"):
        program = paddle.static.Program.parse_from_string(model_bytes)
        unpark_zero_points(program)
        if not fold_shifts(program, keep_constants=True):
            return None
        return program.desc.serialize_to_string()
