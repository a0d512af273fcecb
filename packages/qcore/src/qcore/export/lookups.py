"""qembed's quantized lookups in an ONNX runtime's quantized-table form (:func:`.gather_nbits.gather_nbits`).

:meth:`qcore.graph.Graph.quantize_lookup` writes a table as int8 codes (or packed bytes plus a byte -> values
table) read by a lookup, a cast and a multiply by the (looked-up) scale, plus a looked-up offset for affine
rows. paddle2onnx converts that sequence op by op: the table stays 1 byte (or less) a value, but every lookup
runs 5 to 12 ONNX ops. :func:`write_lookups` finds each such sequence in paddle2onnx's graph and writes it as
one ``GatherBlockQuantized`` (a ``Gather`` + ``Add`` more for offsets), in ``runtime``'s form:

* int8 codes stay 8-bit, packed int4 codes 4-bit; packed int2 codes are written as 4-bit codes (the contrib
  op reads 4 and 8 bits only): half a byte a value, twice the Paddle file's;
* one scale for the table is written once per row (4 bytes a row more), per-row scales as they are;
* offsets (affine rows) cannot be an integer zero point, so they are looked up and added after the op;
* log codes are no linear grid: their sequence is left as paddle2onnx wrote it;
* padding rows read as zeros: their scale (and offset) is written as 0;
* float16 per-row scales (qembed's ``scale_dtype``) stay float16 in the ONNX Runtime form (cast to float32 in the
  graph; the OpenVINO runtime then cannot run that form) and are written float32 in the OpenVINO form; float16
  offsets stay float16 in both, cast after their lookup;
* the OpenVINO form needs a power-of-two block of at least 16 dividing the row: a row of ``dim`` values takes
  the largest such block (the scale repeated per block); a table whose rows have none keeps its sequence.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import ExportError
from ..graph import Graph, OpRef
from ..groupwise import GroupCodes
from ..optable import LOOKUP, seed_types
from ..packing import unpack_fields
from . import links
from .gather_nbits import _check_runtime, gather_nbits
from .nbits_layout import MS_DOMAIN

#: Width of the codes the runtime forms are written with, by the width of the Paddle model's codes.
_EXPORT_BITS = {2: 4, 4: 4, 8: 8}
_SMALLEST_BLOCK = 16


def code_lookups(graph: Graph) -> list[tuple[OpRef, str]]:
    """Every lookup of ``graph`` reading int8 codes (a table :meth:`~qcore.graph.Graph.quantize_lookup` wrote), with
    the codes parameter's name."""
    params = set(graph.param_names())
    found = []
    for op in graph.ops(seed_types(LOOKUP)):
        codes = [n for n in graph.input_names(op) if n in params and graph.get_param(n).dtype == np.int8]
        if codes:
            found.append((op, codes[0]))
    return found


def unpad_code_lookups(graph: Graph) -> dict[str, int]:
    """Take ``padding_idx`` off every lookup of int8 codes in ``graph`` (an export's legacy clone): paddle2onnx 2.1
    aborts on an int8 table with one. Returns codes parameter -> padding row, which :func:`write_lookups` zeroes.
    Per-row tables carry their padding on the scale lookup and have none here; a PIR one is one ExportError line."""
    padded = {}
    for op, codes in code_lookups(graph):
        padding = graph.attr(op, "padding_idx", -1)
        if padding is None or padding == -1:
            continue
        if graph.family == "pir":  # its padding_idx is an int64 attribute, which PIR's Python API cannot set
            raise ExportError(f"the lookup of {codes!r} (one scale for the table, padding_idx {padding}) cannot be "
                              "exported from a PIR program: paddle2onnx 2.1 aborts on an int8 table with a padding "
                              "row; quantize the table with per_row=True (or export the legacy form)")
        graph.set_attr(op, "padding_idx", -1)
        padded[codes] = int(padding)
    return padded


@dataclass
class _Lookup:
    """One quantized lookup found in the graph: what it reads and the tensor it ends in."""

    codes: np.ndarray  # [rows, dim] integer codes (signed, or unsigned with offsets)
    scales: np.ndarray  # [rows] (one scale: repeated)
    offsets: np.ndarray | None  # [rows]
    bits: int  # the Paddle model's code width (2, 4, 8)
    ids: str
    end: Any  # the node whose output is the dequantized rows
    codes_name: str
    half: bool = False  # the scales (and offsets) were stored float16


class _Graph:
    """paddle2onnx's graph read once: initializers as arrays, producers and readers (``Identity`` skipped)."""

    def __init__(self, model: Any) -> None:
        from onnx import numpy_helper

        g = model.graph
        self.inits = {i.name: i for i in g.initializer}
        self.array = lambda name: numpy_helper.to_array(self.inits[name])
        self.producer, self.readers = links.producers(g), links.readers(g)

    def source(self, name: str) -> str:
        """``name`` with the ``Identity`` nodes in front of it skipped."""
        node = self.producer.get(name)
        while node is not None and node.op_type == "Identity":
            name = node.input[0]
            node = self.producer.get(name)
        return name

    def next(self, name: str) -> Any | None:
        """The one node reading ``name`` (``Identity`` and ``Shape`` readers skipped), else None."""
        readers = [n for n in self.readers.get(name, []) if n.op_type != "Shape"]
        if len(readers) != 1:
            return None
        if readers[0].op_type == "Identity":
            return self.next(readers[0].output[0])
        return readers[0]

    def row_values(self, name: str, ids: str) -> tuple[np.ndarray, np.ndarray] | None:
        """A per-row table looked up with ``ids`` (``Gather``, after paddle2onnx's padding mask ``Mul`` or not, and
        cast to float32 or not): its values ``[rows]`` as stored and a padding mask (1 kept, 0 padding); None for
        anything else."""
        node = self.producer.get(self.source(name))
        if node is not None and node.op_type == "Cast":  # float16 values widened after the lookup
            node = self.producer.get(self.source(node.input[0]))
        if node is None or node.op_type != "Gather" or node.input[1] != ids:
            return None
        table, mask = self.source(node.input[0]), None
        masked = self.producer.get(table)
        if masked is not None and masked.op_type == "Mul":
            table, mask_name = (self.source(i) for i in masked.input)
            if mask_name not in self.inits:
                return None
            mask = self.array(mask_name).reshape(-1)
        if table not in self.inits:
            return None
        values = self.array(table).reshape(-1)
        return values, np.ones_like(values) if mask is None else mask


def _find(g: _Graph, gather: Any, padded: Mapping[str, int]) -> _Lookup | None:
    """The quantized lookup starting at ``gather`` (a ``Gather`` of int8 codes), or None when the sequence behind
    it is not a linear one :meth:`~qcore.graph.Graph.quantize_lookup` writes (log codes)."""
    codes_name, ids = gather.input
    codes = g.array(codes_name)
    current = gather.output[0]
    node = g.next(current)
    if node is None or node.op_type != "Cast":
        return None
    bits = 8
    if node.attribute[0].i == 7:  # to int64: packed bytes, turned into values by a lookup in the byte table
        while node is not None and not (node.op_type == "Gather" and node.input[0] in g.inits):
            current, node = node.output[0], g.next(node.output[0])
        if node is None:
            return None
        byte_values = g.array(node.input[0])  # [256, codes per byte]
        bits = 8 // byte_values.shape[1]
        field_value = byte_values[128 : 128 + (1 << bits), 0]  # byte f (< 128) holds field f first
        if not np.array_equal(field_value, np.round(field_value)):
            return None  # log levels
        dim = codes.shape[1] * byte_values.shape[1]
        current, node = node.output[0], g.next(node.output[0])
        while node is not None and node.op_type in ("Reshape", "Slice"):
            if node.op_type == "Slice":  # the padding codes of the last byte cut off
                dim = int(g.array(g.source(node.input[2])).reshape(-1)[0])
            current, node = node.output[0], g.next(node.output[0])
        codes = field_value[unpack_fields(codes, bits, dim)].astype(np.int8)
    else:
        current, node = node.output[0], g.next(node.output[0])
    if node is None or node.op_type != "Mul":
        return None
    other = next((i for i in node.input if g.source(i) != g.source(current)), None)
    if other is None:
        return None
    rows = len(codes)
    scale = g.row_values(other, ids)
    if scale is not None:
        scales, mask = scale
        if scales.dtype not in (np.float32, np.float16):
            return None
    elif g.source(other) in g.inits and g.array(g.source(other)).size == 1:  # one scale for the table
        scales = np.full(rows, g.array(g.source(other)).reshape(-1)[0], np.float32)
        mask = np.ones(rows, np.float32)
        if codes_name in padded:
            mask[padded[codes_name]] = 0
    else:
        return None
    end, offsets = node, None
    add = g.next(node.output[0])
    if add is not None and add.op_type == "Add":
        found = g.row_values(next(i for i in add.input if g.source(i) != g.source(node.output[0])), ids)
        if found is not None:
            offsets = (found[0] * found[1]).astype(np.float32)
            end = add
    return _Lookup(codes, (scales * mask).astype(np.float32), offsets, bits, ids, end, codes_name,
                   scales.dtype == np.float16)


def _block(dim: int, runtime: str) -> int | None:
    """The group size a row of ``dim`` values is written with (None: the OpenVINO form has none)."""
    if runtime == "onnxruntime":
        return dim  # MatMulNBits' layout pads a row to a power-of-two block
    block = dim & -dim  # the largest power of two dividing dim
    return block if block >= _SMALLEST_BLOCK else None


def _group_codes(found: _Lookup, block: int) -> GroupCodes:
    """The lookup's table as the :class:`GroupCodes` of its transpose (one scale per ``block`` values of a row)."""
    rows, dim = found.codes.shape
    groups = dim // block
    scales = np.repeat(found.scales[None, :], groups, axis=0).astype(np.float16 if found.half else np.float32)
    zero = None if found.offsets is None else np.zeros((groups, rows), np.uint8)
    return GroupCodes(np.ascontiguousarray(found.codes.T), scales, zero, _EXPORT_BITS[found.bits], block)


def write_lookups(model: Any, runtime: str = "onnxruntime", padded: Mapping[str, int] | None = None) -> list[str]:
    """Rewrite every quantized lookup of the ONNX ``model`` (paddle2onnx's graph of a qembed model) in ``runtime``'s
    form, in place; ``padded``: what :func:`unpad_code_lookups` took off. Returns the codes tables rewritten.
    A table :func:`unpad_code_lookups` unpadded that is left as it was (log codes) is one ExportError line."""
    from onnx import TensorProto, helper, numpy_helper

    _check_runtime(runtime)
    padded = padded or {}
    g = _Graph(model)
    replaced: dict[int, list[Any]] = {}
    inits: list[Any] = []
    done: list[str] = []
    for n in list(model.graph.node):
        if n.op_type != "Gather" or n.input[0] not in g.inits or g.inits[n.input[0]].data_type != 3:  # INT8
            continue
        found = _find(g, n, padded)
        block = None if found is None else _block(found.codes.shape[1], runtime)
        if found is None or block is None:
            if n.input[0] in padded:
                raise ExportError(f"the lookup of {n.input[0]!r} has a padding_idx and one scale, and its codes are "
                                  "no linear grid this export writes (log codes): paddle2onnx 2.1 aborts on it; "
                                  "quantize the table with per_row=True")
            continue
        name = f"{found.codes_name}.lookup.{len(done)}"
        y = found.end.output[0] if found.offsets is None else f"{name}.rows"
        nodes, new = gather_nbits(_group_codes(found, block), found.ids, y, name, runtime)
        if found.offsets is not None:  # float16 offsets: looked up, then widened
            stored = np.float16 if found.half else np.float32
            new.append(numpy_helper.from_array(found.offsets.astype(stored).reshape(-1, 1), f"{name}.offsets"))
            offset = f"{name}.offset"
            nodes.append(helper.make_node("Gather", [f"{name}.offsets", found.ids], [offset], name=f"{name}.o"))
            if found.half:
                nodes.append(helper.make_node("Cast", [offset], [f"{offset}.float32"], to=TensorProto.FLOAT,
                                              name=f"{name}.o.cast"))
                offset = f"{offset}.float32"
            nodes.append(helper.make_node("Add", [y, offset], list(found.end.output), name=f"{name}.add"))
        replaced[id(found.end)] = nodes
        inits += new
        done.append(found.codes_name)
    if not done:
        return done
    nodes = [m for n in model.graph.node for m in replaced.get(id(n), [n])]
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    model.graph.initializer.extend(inits)
    links.prune(model)
    if not any(o.domain == MS_DOMAIN for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid(MS_DOMAIN, 1))
    return done
