"""A weight-only quantized decoder written directly as an OpenVINO model, in the forms the OpenVINO CPU plugin
fuses: ``ScaledDotProductAttention`` over a cache that is concatenated once per step (and becomes the model's state,
:func:`qcore.export.openvino_genai.make_stateful`), and each quantized linear as a constant of its codes (``u4`` /
``u8``) decompressed by ``Convert -> Subtract(zero point) -> Multiply(step)`` into the ``MatMul`` (what the plugin
runs as a compressed fully-connected layer).

The rotary angles are never computed in the model: ``cos`` / ``sin`` come from float32 tables gathered by
``position_ids``. Computed in the graph, ``position * frequency`` would run in bf16 where the CPU has it (the
plugin's default precision there), and a bf16 angle of a few hundred radians is wrong by radians: positions past
~200 lost a fifth of their top-1 agreement with the simulation that way.

I/O (as ``openvino_genai.LLMPipeline`` feeds a model): ``input_ids``, ``attention_mask``, ``position_ids`` (int64)
and ``beam_idx`` (int32, the cache's batch order); ``past_key_<i>`` / ``past_value_<i>`` ``[batch, kv_heads,
past, head_dim]`` parameters and ``present_key_<i>`` / ``present_value_<i>`` results (before they are made state);
``logits``. Keys are masked by index: query ``s`` of ``S`` new tokens sees keys ``0 .. T - S + s`` (``T`` the
mask's width), those the mask zeroes, and in a windowed layer only its last ``window`` keys.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from qcore.groupwise import GroupCodes
from qcore.mapped import drop_pages

from ..weight_only.plan import WeightOnlyResult
from .layout import DecoderLayout, parameters_and_codes, rotary_cache

#: Name prefix of the lookups of the rotary tables (a weight compressor must leave them alone: they are no
#: embedding table).
ROTARY = "rotary_table"
#: Added to the scores of hidden keys (``exp`` of it is 0 in float32 and bf16).
MASKED = -1e30


def _ops() -> Any:
    from openvino import opset13

    return opset13


def _constant(values: np.ndarray, kind: str) -> Any:
    """A ``u4`` / ``u8`` constant of unsigned ``values`` (4-bit ones packed two a byte, the first in the low nibble)."""
    import openvino as ov

    from qcore.export.nbits_layout import packed

    tensor = ov.Tensor(ov.Type.u4 if kind == "u4" else ov.Type.u8, list(values.shape))
    tensor.data.reshape(-1)[:] = packed(values.reshape(-1), 4 if kind == "u4" else 8)
    return ov.op.Constant(tensor)


def compressed_constants(q: GroupCodes) -> tuple[Any, Any, Any]:
    """The constants of the ``[K, N]`` codes ``q``: unsigned codes ``[N, groups, group]`` and zero points ``[N,
    groups, 1]`` (``u4`` / ``u8``; the symmetric grids' implicit ``2 ** (bits - 1)`` written out), steps ``[N,
    groups, 1]`` float32."""
    ops = _ops()
    k, n = q.codes.shape
    groups, kind = k // q.group_size, "u4" if q.bits == 4 else "u8"
    shift = 2 ** (q.bits - 1) if q.zero_points is None else 0
    codes = (q.codes.T.astype(np.int16) + shift).astype(np.uint8).reshape(n, groups, q.group_size)
    zero = (np.full((n, groups, 1), shift, np.uint8) if q.zero_points is None
            else np.ascontiguousarray(q.zero_points.T, np.uint8)[..., None])
    steps = ops.constant(np.ascontiguousarray(q.scales.T, np.float32)[..., None])
    drop_pages(q.codes)  # copied into the constants: the memory-mapped pages can go
    return _constant(codes, kind), _constant(zero, kind), steps


def decompressed(constants: tuple[Any, Any, Any]) -> Any:
    """The ``[N, K]`` float32 weight of :func:`compressed_constants` as the decompression subgraph the CPU plugin
    keeps compressed, ``(codes - zero) * step`` (exactly :meth:`GroupCodes.dequantize`)."""
    ops = _ops()
    codes, zero, steps = constants
    n, groups, group = codes.get_output_shape(0)
    weight = ops.multiply(ops.subtract(ops.convert(codes, "f32"), ops.convert(zero, "f32")), steps)
    return ops.reshape(weight, ops.constant(np.array([n, groups * group], np.int64)), special_zero=False)


class _DecoderWriter:
    """Builds one decoder's model from its parameters (``state``), codes by parameter name and layout."""

    def __init__(self, layout: DecoderLayout, state: dict[str, np.ndarray], codes: dict[str, GroupCodes],
                 input_scales: dict[str, np.ndarray]) -> None:
        self.layout, self.cfg, self.state = layout, layout.cfg, state
        self.codes, self.input_scales = codes, input_scales
        self._table: Any = None

    def weight(self, name: str) -> Any:
        """The ``[out, in]`` weight of the ``[in, out]`` parameter ``name`` (codes decompressed, or float)."""
        if name in self.codes:
            return decompressed(compressed_constants(self.codes[name]))
        return _ops().constant(np.ascontiguousarray(self.state[name].T, np.float32), shared_memory=True)

    def linear(self, x: Any, name: str) -> Any:
        """``x @ W (+ b)`` for the ``[in, out]`` parameter ``name`` and its bias, if any (Qwen2's q/k/v)."""
        ops = _ops()
        if name in self.input_scales:
            x = ops.multiply(x, ops.constant((1.0 / self.input_scales[name]).astype(np.float32)))
        y = ops.matmul(x, self.weight(name), transpose_a=False, transpose_b=True)
        bias = self.state.get(name.removesuffix("weight") + "bias")
        return y if bias is None else ops.add(y, ops.constant(bias.astype(np.float32)))

    def rms_norm(self, x: Any, name: str) -> Any:
        """``x / sqrt(mean(x ** 2) + eps) * weight`` over the last axis (the form OpenVINO fuses as RMS)."""
        ops = _ops()
        mean = ops.reduce_mean(ops.power(x, ops.constant(np.float32(2.0))), ops.constant(np.array([-1], np.int64)),
                               keep_dims=True)
        inverse = ops.divide(ops.constant(np.float32(1.0)),
                             ops.sqrt(ops.add(mean, ops.constant(np.float32(self.cfg.rms_eps)))))
        return ops.multiply(ops.multiply(x, inverse), ops.constant(self.state[name].astype(np.float32)))

    def heads(self, x: Any, count: int) -> Any:
        """``[batch, seq, count * head_dim]`` -> ``[batch, count, seq, head_dim]``."""
        ops = _ops()
        split = ops.reshape(x, ops.constant(np.array([0, 0, count, self.cfg.head_dim], np.int64)), special_zero=True)
        return ops.transpose(split, ops.constant(np.array([0, 2, 1, 3], np.int64)))

    def rotate(self, x: Any, cos: Any, sin: Any) -> Any:
        """``x * cos + rotate_half(x) * sin`` (channel ``i`` against ``i + head_dim / 2``)."""
        ops = _ops()
        half = self.cfg.head_dim // 2
        first, second = ops.variadic_split(x, ops.constant(np.int64(-1)),
                                           ops.constant(np.array([half, half], np.int64))).outputs()
        turned = ops.concat([ops.negative(second), first], -1)
        return ops.add(ops.multiply(x, cos), ops.multiply(turned, sin))

    def attention(self, i: int, x: Any, io: dict[str, Any], masks: dict[int | None, Any],
                  rotary: dict[float, tuple[Any, Any]]) -> tuple[Any, Any, Any]:
        ops, cfg, layout, p = _ops(), self.cfg, self.layout, f"layers.{i}.attn"
        q = self.heads(self.linear(x, f"{p}.q_proj.weight"), cfg.num_heads)
        k = self.heads(self.linear(x, f"{p}.k_proj.weight"), cfg.num_kv_heads)
        v = self.heads(self.linear(x, f"{p}.v_proj.weight"), cfg.num_kv_heads)
        if layout.qk_norm:
            q, k = self.rms_norm(q, f"{p}.q_norm.weight"), self.rms_norm(k, f"{p}.k_norm.weight")
        cos, sin = rotary[layout.thetas[i]]
        q, k = self.rotate(q, cos, sin), self.rotate(k, cos, sin)
        beam = io["beam_idx"]
        past_k, past_v = (ops.gather(io[f"past_{kind}_{i}"], beam, ops.constant(np.int64(0)))
                          for kind in ("key", "value"))
        k, v = ops.concat([past_k, k], 2), ops.concat([past_v, v], 2)
        group = cfg.num_heads // cfg.num_kv_heads
        if group > 1:  # each kv head read by `group` query heads
            expand = ops.constant(np.array([1, 1, group, 1, 1], np.int64))
            shape = ops.constant(np.array([0, cfg.num_heads, -1, cfg.head_dim], np.int64))
            k_all, v_all = (ops.reshape(ops.broadcast(ops.unsqueeze(t, ops.constant(np.int64(2))), expand,
                                                      broadcast_spec="BIDIRECTIONAL"), shape, special_zero=True)
                            for t in (k, v))
        else:
            k_all, v_all = k, v
        out = ops.scaled_dot_product_attention(q, k_all, v_all, masks[layout.windows[i]],
                                               ops.constant(np.float32(layout.attention_scale)), causal=False)
        out = ops.transpose(out, ops.constant(np.array([0, 2, 1, 3], np.int64)))
        out = ops.reshape(out, ops.constant(np.array([0, 0, cfg.num_heads * cfg.head_dim], np.int64)),
                          special_zero=True)
        return self.linear(out, f"{p}.o_proj.weight"), k, v

    def mlp(self, i: int, x: Any) -> Any:
        ops, p = _ops(), f"layers.{i}.mlp"
        gate, up = self.linear(x, f"{p}.gate_proj.weight"), self.linear(x, f"{p}.up_proj.weight")
        act = ops.swish(gate) if self.layout.activation == "silu" else ops.gelu(gate, "tanh")
        return self.linear(ops.multiply(act, up), f"{p}.down_proj.weight")

    def masks(self, io: dict[str, Any]) -> dict[int | None, Any]:
        """``[batch, 1, seq, total]`` additive masks, one per window size in the layout (None: causal only)."""
        ops = _ops()
        mask = io["attention_mask"]
        total = ops.gather(ops.shape_of(mask), ops.constant(np.int64(1)), ops.constant(np.int64(0)))
        seq = ops.gather(ops.shape_of(io["input_ids"]), ops.constant(np.int64(1)), ops.constant(np.int64(0)))
        keys = ops.range(ops.constant(np.int64(0)), total, ops.constant(np.int64(1)), "i64")  # [T]
        queries = ops.unsqueeze(ops.range(ops.subtract(total, seq), total, ops.constant(np.int64(1)), "i64"),
                                ops.constant(np.int64(1)))  # [S, 1]
        padded = ops.unsqueeze(ops.greater(mask, ops.constant(np.int64(0))), ops.constant(np.array([1, 2], np.int64)))
        out = {}
        for window in sorted(set(self.layout.windows), key=lambda w: -1 if w is None else w):
            seen = ops.less_equal(keys, queries)  # [S, T]
            if window is not None:
                seen = ops.logical_and(seen, ops.greater(keys, ops.subtract(queries, ops.constant(np.int64(window)))))
            allowed = ops.logical_and(padded, seen)  # [B, 1, S, T]
            out[window] = ops.select(allowed, ops.constant(np.float32(0.0)), ops.constant(np.float32(MASKED)))
        return out

    def embedding(self, ids: Any) -> Any:
        ops = _ops()
        rows = ops.gather(self.table(), ids, ops.constant(np.int64(0)))
        if self.layout.embed_scale is not None:
            rows = ops.multiply(rows, ops.constant(np.float32(self.layout.embed_scale)))
        return rows

    def table(self) -> Any:
        """The ``[vocab, hidden]`` table, its constants shared by the lookup and the tied head: the codes (of the
        transposed table: ``[vocab, hidden]`` already) decompressed for each reader, so the plugin keeps both
        compressed, or one float constant."""
        name = "embed_tokens.weight"
        if self._table is None:
            self._table = (compressed_constants(self.codes[name]) if name in self.codes
                           else _ops().constant(np.ascontiguousarray(self.state[name], np.float32),
                                                shared_memory=True))  # the table: no second copy while saving
        return decompressed(self._table) if name in self.codes else self._table

    def head(self, x: Any) -> Any:
        ops = _ops()
        if not self.cfg.tie_embeddings:
            return self.linear(x, "lm_head.weight")
        return ops.matmul(x, self.table(), transpose_a=False, transpose_b=True)

    def build(self) -> Any:
        import openvino as ov

        ops, cfg, layout = _ops(), self.cfg, self.layout
        io: dict[str, Any] = {}
        for name, shape, kind in (("input_ids", [-1, -1], ov.Type.i64), ("attention_mask", [-1, -1], ov.Type.i64),
                                  ("position_ids", [-1, -1], ov.Type.i64), ("beam_idx", [-1], ov.Type.i32)):
            io[name] = ops.parameter(shape, kind, name=name)
        for i in range(cfg.num_layers):
            for kind in ("key", "value"):
                name = f"past_{kind}_{i}"
                io[name] = ops.parameter([-1, cfg.num_kv_heads, -1, cfg.head_dim], ov.Type.f32, name=name)
        for parameter in io.values():
            parameter.output(0).set_names({parameter.get_friendly_name()})
        masks = self.masks(io)
        rotary = {}
        for theta in sorted(set(layout.thetas)):
            tables = rotary_cache(theta, cfg.head_dim, cfg.context_length)
            rotary[theta] = tuple(  # [batch, 1, seq, head_dim]: each frequency for both halves
                ops.unsqueeze(ops.gather(ops.constant(np.concatenate([t, t], axis=1)), io["position_ids"],
                                         ops.constant(np.int64(0)), name=f"{ROTARY}.{kind}.{theta:g}"),
                              ops.constant(np.int64(1))) for kind, t in zip(("cos", "sin"), tables))

        h = self.embedding(io["input_ids"])
        results = []
        for i in range(cfg.num_layers):
            a, k, v = self.attention(i, self.rms_norm(h, f"layers.{i}.{layout.attn_norm}.weight"), io, masks, rotary)
            if layout.attn_out_norm is not None:
                a = self.rms_norm(a, f"layers.{i}.{layout.attn_out_norm}.weight")
            h = ops.add(h, a)
            f = self.mlp(i, self.rms_norm(h, f"layers.{i}.{layout.ffn_norm}.weight"))
            if layout.ffn_out_norm is not None:
                f = self.rms_norm(f, f"layers.{i}.{layout.ffn_out_norm}.weight")
            h = ops.add(h, f)
            for kind, value in (("key", k), ("value", v)):
                results.append(ops.result(value, name=f"present_{kind}_{i}"))
        logits = ops.result(self.head(self.rms_norm(h, "norm.weight")), name="logits")
        for result in [logits, *results]:
            result.output(0).set_names({result.get_friendly_name()})
            result.input(0).get_source_output().set_names({result.get_friendly_name()})
        return ov.Model([logits, *results], list(io.values()), "decoder")


def decoder_model(model: Any, result: WeightOnlyResult) -> Any:
    """The OpenVINO model (``openvino.Model``, cache as parameters and results) of ``model`` (a :mod:`qptq.llm`
    port quantized in place by :func:`qptq.weight_only.quantize_`, ``grid="int"``) with ``result``'s codes."""
    return _DecoderWriter(DecoderLayout.of(model), *parameters_and_codes(model, result)).build()
