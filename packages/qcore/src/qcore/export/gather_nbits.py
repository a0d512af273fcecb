"""Quantized embedding tables as ONNX lookups, with a tied LM head reading the same codes.

A ``[vocab, hidden]`` table comes as the :class:`~qcore.groupwise.GroupCodes` of its transpose (``[hidden,
vocab]``, groups along ``hidden``): the weight of the tied head ``h @ table.T``, whose column ``v`` is row
``v`` of the table. Two forms, one per runtime, because neither reads the other's single copy of the codes
compressed (measured with ONNX Runtime 1.32 and OpenVINO 2026.4.1):

* ``"onnxruntime"``: the head is ``MatMulNBits`` (:mod:`.nbits`), the lookup ``com.microsoft.GatherBlockQuantized``
  (uint8 data with a ``bits`` attribute, 4 or 8) reading ``MatMulNBits``' ``B`` initializer as it is, ``[vocab,
  blocks, block * bits / 8]`` quantized along its last axis: the codes are stored once. ONNX Runtime requires
  ``B`` three-dimensional and the scales two-dimensional, while ``GatherBlockQuantized`` wants scales of its
  data's rank, so the steps (4 bytes a group) and zero points (1 byte a group) are stored a second time as
  ``[vocab, blocks, 1]``. The OpenVINO runtime runs this form, but decompresses the table to f32 when it
  compiles the model.
* ``"openvino-runtime"``: one uint4 / uint8 ``[vocab, hidden]`` initializer (codes unsigned, zero points
  explicit) read by ``GatherBlockQuantized`` (the OpenVINO frontend's accepted data types) and by
  ``DequantizeLinear`` with ``block_size`` (opset 21) feeding the head's ``Transpose`` + ``MatMul``; the
  OpenVINO runtime keeps both compressed (u4 / u8 constants in its runtime model). Its frontend refuses packed
  4-bit uint8 data, int8 data and non-constant inputs. ONNX Runtime runs this form too, dequantizing the whole
  table at every head call.

:func:`gather_nbits` writes the lookup alone (tables without a head: qembed's); :func:`replace_tables` rewrites
paddle2onnx's ``Gather`` (and ``Transpose`` -> ``MatMul`` head) on a table named in the codes. Float16 scales (qembed's
``scale_dtype``) stay float16 on disk in the ONNX Runtime form, read through a ``Cast`` to float32; the OpenVINO form
writes them float32 (its frontend takes constant scales only). Both compute the rows in float32.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import ConfigError, ExportError
from ..groupwise import GroupCodes
from . import links
from .nbits_layout import INT8_ACTIVATIONS, MS_DOMAIN, matmul_nbits, nbits_arrays, packed

#: The runtimes a table form is written for.
TABLE_RUNTIMES = ("onnxruntime", "openvino-runtime")
#: ``DequantizeLinear``'s ``block_size`` (the OpenVINO form's head) is opset 21.
BLOCK_DQ_OPSET = 21


def _check_runtime(runtime: str) -> None:
    if runtime not in TABLE_RUNTIMES:
        raise ConfigError(f"runtime={runtime!r} has no quantized-table form; use one of {TABLE_RUNTIMES}")


def _float_input(values: np.ndarray, name: str, half: bool) -> tuple[list[Any], list[Any]]:
    """The float32 input ``name`` holding ``values``: an initializer, or (``half``) a float16 initializer widened by
    a ``Cast`` (half the bytes on disk, the same values). Returns its nodes and initializers."""
    from onnx import TensorProto, helper, numpy_helper

    if not half:
        return [], [numpy_helper.from_array(np.ascontiguousarray(values, np.float32), name)]
    stored = numpy_helper.from_array(np.ascontiguousarray(values, np.float16), f"{name}.float16")
    return [helper.make_node("Cast", [stored.name], [name], to=TensorProto.FLOAT, name=f"{name}.cast")], [stored]


def ort_lookup(q: GroupCodes, ids: str, y: str, name: str, b_name: str) -> tuple[list[Any], list[Any]]:
    """``GatherBlockQuantized`` on ``MatMulNBits``' ``B`` (initializer ``b_name``), reshaped to rows of ``hidden``."""
    from onnx import helper, numpy_helper

    arrays = nbits_arrays(q)
    blocks = arrays.b.shape[1]
    scale_nodes, inits = _float_input(arrays.scales[..., None], f"{name}.scales", q.scales.dtype == np.float16)
    inits.append(numpy_helper.from_array(np.array([blocks * arrays.block], np.int64), f"{name}.width"))
    inputs = [b_name, ids, f"{name}.scales"]
    if arrays.zero_codes is not None:
        inits.append(numpy_helper.from_array(packed(arrays.zero_codes[..., None], q.bits), f"{name}.zero_points"))
        inputs.append(f"{name}.zero_points")
    padded = blocks * arrays.block != arrays.k
    rows = f"{name}.rows" if padded else y
    nodes = [*scale_nodes,
             helper.make_node("GatherBlockQuantized", inputs, [f"{name}.blocks"], name=name, domain=MS_DOMAIN,
                              bits=q.bits, block_size=arrays.block, gather_axis=0, quantize_axis=2),
             helper.make_node("Shape", [ids], [f"{name}.ids_shape"], name=f"{name}.ids_shape"),
             helper.make_node("Concat", [f"{name}.ids_shape", f"{name}.width"], [f"{name}.shape"], axis=0,
                              name=f"{name}.shape"),
             helper.make_node("Reshape", [f"{name}.blocks", f"{name}.shape"], [rows], name=f"{name}.reshape")]
    if padded:  # one power-of-two block per row, wider than hidden: its padding cut off
        inits += [numpy_helper.from_array(np.array([v], np.int64), f"{name}.{k}")
                  for k, v in (("start", 0), ("end", arrays.k), ("axis", -1))]
        nodes.append(helper.make_node("Slice", [rows, f"{name}.start", f"{name}.end", f"{name}.axis"], [y],
                                      name=f"{name}.slice"))
    return nodes, inits


def _ov_table(q: GroupCodes, name: str) -> tuple[list[str], list[Any], int]:
    """The OpenVINO form's initializers (unsigned codes ``[vocab, hidden]``, steps, zero points; ONNX packs 4-bit
    tensors two a byte over the flattened tensor, not per row), their names and the block; one line for a group
    that is no power-of-two block dividing ``hidden``. The steps are float32 whatever their dtype: the OpenVINO
    frontend takes constant scales only, and with float16 ones ONNX Runtime computes the rows in float16."""
    from onnx import TensorProto, helper, numpy_helper

    hidden, vocab = q.codes.shape
    block = q.group_size
    if block < 16 or block & (block - 1):
        raise ConfigError(f"group_size={block} of a {hidden}-wide table cannot be a GatherBlockQuantized block for "
                          "the OpenVINO runtime; use a power of two >= 16 dividing it (32, 64, 128)")
    shift = 2 ** (q.bits - 1) if q.zero_points is None else 0
    codes = (q.codes.T.astype(np.int16) + shift).astype(np.uint8)
    zero = (np.full((vocab, hidden // block), shift, np.uint8) if q.zero_points is None
            else np.ascontiguousarray(q.zero_points.T, np.uint8))
    kind = TensorProto.UINT4 if q.bits == 4 else TensorProto.UINT8
    names = [f"{name}.codes", f"{name}.scales", f"{name}.zero_points"]
    inits = [helper.make_tensor(names[0], kind, codes.shape, packed(codes.reshape(-1), q.bits).tobytes(), raw=True),
             numpy_helper.from_array(np.ascontiguousarray(q.scales.T, np.float32), names[1]),
             helper.make_tensor(names[2], kind, zero.shape, packed(zero.reshape(-1), q.bits).tobytes(), raw=True)]
    return names, inits, block


def gather_nbits(q: GroupCodes, ids: str, y: str, name: str, runtime: str = "onnxruntime"
                 ) -> tuple[list[Any], list[Any]]:
    """The nodes computing ``y = table[ids]`` (rows dequantized) from the codes ``q`` of the transposed table,
    and their initializers (named after ``name``), in ``runtime``'s form."""
    from onnx import helper, numpy_helper

    _check_runtime(runtime)
    if runtime == "onnxruntime":
        b = numpy_helper.from_array(nbits_arrays(q).b, f"{name}.B")
        nodes, inits = ort_lookup(q, ids, y, name, b.name)
        return nodes, [b, *inits]
    names, inits, block = _ov_table(q, name)
    node = helper.make_node("GatherBlockQuantized", [names[0], ids, *names[1:]], [y], name=name, domain=MS_DOMAIN,
                            bits=q.bits, block_size=block, gather_axis=0, quantize_axis=1)
    return [node], inits


def _attribute(node: Any, name: str, default: Any) -> Any:
    from onnx import helper

    return next((helper.get_attribute_value(a) for a in node.attribute if a.name == name), default)


def replace_tables(model: Any, codes: dict[str, GroupCodes], runtime: str = "onnxruntime",
                   accuracy_level: int = INT8_ACTIVATIONS) -> set[str]:
    """Rewrite, in the ONNX ``model`` (paddle2onnx's float export), every ``Gather`` of a table named in ``codes``
    and every tied head reading it (``Transpose(table)`` -> ``MatMul``) in ``runtime``'s form; the float table
    is removed. Returns the tables done; one :class:`~qcore.errors.ExportError` line names a reader of a table
    it cannot rewrite, or an opset below 21 for the OpenVINO form."""
    from onnx import helper, numpy_helper

    _check_runtime(runtime)
    graph = model.graph
    if runtime == "openvino-runtime" and codes:
        opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
        if opset < BLOCK_DQ_OPSET:
            raise ExportError(f"the OpenVINO form of a quantized table needs opset {BLOCK_DQ_OPSET} (DequantizeLinear "
                              f"block_size); the graph is opset {opset}: export it with float_onnx(files, opset=21)")
    producers, readers = links.producers(graph), links.readers(graph)
    replaced: dict[int, list[Any]] = {}  # id(node) -> the nodes written instead of it (empty: removed)
    front: list[Any] = []  # nodes computing a table that was an initializer
    new_inits: list[Any] = []
    done: set[str] = set()
    for table, q in codes.items():
        found = readers.get(table, [])
        if not any(n.op_type == "Gather" for n in found):
            continue
        name = f"{table}.table"
        if runtime == "openvino-runtime":
            names, inits, block = _ov_table(q, name)
            new_inits += inits
        else:
            b_name = f"{table}.nbits.B"
            new_inits.append(numpy_helper.from_array(nbits_arrays(q).b, b_name))
        tied = False
        for n in found:
            lookup = f"{name}.gather.{len(replaced)}"
            if n.op_type == "Gather" and n.input[0] == table and _attribute(n, "axis", 0) == 0:
                if runtime == "onnxruntime":
                    replaced[id(n)], inits = ort_lookup(q, n.input[1], n.output[0], lookup, b_name)
                    new_inits += inits
                else:
                    replaced[id(n)] = [helper.make_node(
                        "GatherBlockQuantized", [names[0], n.input[1], *names[1:]], list(n.output), name=lookup,
                        domain=MS_DOMAIN, bits=q.bits, block_size=block, gather_axis=0, quantize_axis=1)]
            elif n.op_type == "Transpose" and list(_attribute(n, "perm", [1, 0])) == [1, 0]:
                heads = readers.get(n.output[0], [])
                if not heads or any(h.op_type != "MatMul" or h.input[1] != n.output[0] for h in heads):
                    raise ExportError(f"the transposed table {table!r} is read by something other than a MatMul's "
                                      "weight; only Gather lookups and a tied MatMul head can read a quantized table")
                tied = True
                if runtime == "openvino-runtime":
                    continue  # the Transpose reads the table's DequantizeLinear, written below
                replaced[id(n)] = []
                for i, head in enumerate(heads):
                    node, inits = matmul_nbits(q, head.input[0], head.output[0], f"{table}.nbits", accuracy_level)
                    node.name = f"{table}.nbits.{i}"
                    replaced[id(head)] = [node]
                    new_inits += inits[1:] if i == 0 else []  # B is written once, above
            elif not (n.op_type == "Constant" and n.output[0] == table):
                raise ExportError(f"{n.op_type} node {n.name!r} reads the quantized table {table!r}; only Gather "
                                  "lookups and a tied Transpose -> MatMul head can read it")
        dequantized = [helper.make_node("DequantizeLinear", names, [table], name=f"{name}.dequantize", axis=1,
                                        block_size=block)] if tied and runtime == "openvino-runtime" else []
        if table in producers:
            replaced[id(producers[table])] = dequantized
        else:
            front += dequantized
        done.add(table)
    nodes = list(front)
    for n in graph.node:
        nodes.extend(replaced.get(id(n), [n]))
    del graph.node[:]
    graph.node.extend(nodes)
    for init in [i for i in graph.initializer if i.name in done]:
        graph.initializer.remove(init)
    graph.initializer.extend(new_inits)
    if done and not any(o.domain == MS_DOMAIN for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid(MS_DOMAIN, 1))
    return done
