"""A weight-only quantized decoder written directly as the ONNX graph ONNX Runtime runs fastest: its contrib ops,
the form ONNX Runtime GenAI's generator is built around.

Per layer: ``SkipSimplifiedLayerNormalization`` (the residual add and RMSNorm in one), ``MatMulNBits`` for every
quantized linear (:mod:`qcore.export.nbits_layout`; a bias, as Qwen2's q/k/v, added after it),
``GroupQueryAttention`` with the rotary embedding inside it (cos / sin tables of the layer's base) and the KV cache
in one buffer shared by past and present (GenAI's ``past_present_share_buffer``: a decode step writes its key and
value in place instead of copying the cache), Gemma's per-head q/k norms and sliding window as its
``local_window_size``. The table is ``GatherBlockQuantized`` on the same codes as the tied head's ``MatMulNBits``
when it is quantized.

I/O: GenAI's names (:data:`qcore.export.ortgenai.INPUTS` / ``OUTPUTS``): ``input_ids`` ``[batch, seq]``,
``attention_mask`` ``[batch, total]`` (int64), a key and a value cache per layer ``[batch, kv_heads, past,
head_dim]``; outputs ``logits`` and the present caches. The weights are taken from the port's simulation
(:mod:`.layout` says how its blocks are wired), so the graph computes what the port computes up to the runtime's
arithmetic (with ``accuracy_level=4`` the matmuls quantize their activations to int8 per block, as llama.cpp's
kernels do).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from qcore.export.external_data import ExternalData
from qcore.export.gather_nbits import ort_lookup
from qcore.export.nbits_layout import INT8_ACTIVATIONS, MS_DOMAIN, matmul_nbits, nbits_arrays
from qcore.export.ortgenai import INPUTS, OUTPUTS
from qcore.groupwise import GroupCodes, join_outputs
from qcore.mapped import drop_pages

from ..weight_only.plan import WeightOnlyResult
from .layout import DecoderLayout, parameters_and_codes, rotary_cache

OPSET = 17


class _Graph:
    """Nodes and initializers being written, with unique names; the initializers' bytes go to ``weights`` as they
    are made when it is given (:class:`~qcore.export.external_data.ExternalData`), else stay in the graph."""

    def __init__(self, weights: ExternalData | None = None) -> None:
        self.nodes: list[Any] = []
        self.inits: list[Any] = []
        self.weights = weights

    def node(self, op: str, inputs: list[str], name: str, outputs: int | list[str] = 1, domain: str = "",
             **attrs: Any) -> list[str]:
        """Add a node named ``name``; its outputs are ``outputs`` (names), or that many named after the node."""
        from onnx import helper

        if isinstance(outputs, int):
            outputs = [name] if outputs == 1 else [f"{name}.out{i}" for i in range(outputs)]
        self.nodes.append(helper.make_node(op, inputs, outputs, name=name, domain=domain, **attrs))
        return outputs

    def const(self, value: np.ndarray, name: str) -> str:
        from onnx import numpy_helper

        self.inits.append(numpy_helper.from_array(np.ascontiguousarray(value), name) if self.weights is None
                          else self.weights.array(value, name))
        return name

    def add(self, nodes: list[Any], inits: list[Any]) -> None:
        """Nodes and initializers made elsewhere (:mod:`qcore.export`'s op builders)."""
        self.nodes.extend(nodes)
        self.inits.extend(inits if self.weights is None else [self.weights.tensor(t) for t in inits])


class _DecoderWriter:
    """Writes one decoder's graph from its parameters (``state``), codes by parameter name and layout."""

    def __init__(self, layout: DecoderLayout, state: dict[str, np.ndarray], codes: dict[str, GroupCodes],
                 input_scales: dict[str, np.ndarray], accuracy_level: int, weights: ExternalData | None) -> None:
        self.layout, self.cfg, self.state, self.codes = layout, layout.cfg, state, codes
        self.input_scales, self.accuracy_level = input_scales, accuracy_level
        self.g = _Graph(weights)

    def add_bias(self, y: str, weights: list[str], out: str) -> str:
        """``out = y + b``, ``b`` the biases of ``weights`` (``[in, out]`` parameters whose outputs ``y`` holds side by
        side; zeros for one without), or ``y`` itself when none has a bias."""
        names = [w.removesuffix("weight") + "bias" for w in weights]
        if not any(n in self.state for n in names):
            return y
        bias = np.concatenate([self.state[n] if n in self.state else np.zeros(self.width(w), np.float32)
                               for n, w in zip(names, weights)]).astype(np.float32)
        name = names[0] if len(names) == 1 else f"{out}.bias"
        return self.g.node("Add", [y, self.g.const(bias, name)], f"{name}.add", [out])[0]

    def width(self, weight: str) -> int:
        """Output channels of the ``[in, out]`` parameter ``weight``."""
        return int((self.codes[weight].codes if weight in self.codes else self.state[weight]).shape[1])

    def linear(self, x: str, weight: str, out: str | None = None) -> str:
        """``out = x @ W (+ b)`` (default name: the weight's) for the ``[in, out]`` parameter ``weight`` and its bias,
        if any: ``MatMulNBits`` on its codes, else float."""
        g, out = self.g, out or f"{weight}.out"
        product = f"{weight}.product" if weight.removesuffix("weight") + "bias" in self.state else out
        if weight in self.input_scales:
            inverse = (1.0 / self.input_scales[weight]).astype(np.float32)
            x = g.node("Mul", [x, g.const(inverse, f"{weight}.awq_inverse")], f"{weight}.awq")[0]
        if weight not in self.codes:
            g.node("MatMul", [x, g.const(self.state[weight], weight)], f"{weight}.matmul", [product])
        else:
            self.nbits(self.codes[weight], x, product, f"{weight}.nbits")
        return self.add_bias(product, [weight], out)

    def nbits(self, q: GroupCodes, x: str, y: str, name: str, sources: Sequence[GroupCodes] = ()) -> str:
        """``y = x @ dequantize(q)`` as ``MatMulNBits``; then the pages of ``q``'s codes (or of ``sources``, the
        codes ``q`` was joined from) are dropped, when they are memory-mapped (:func:`qcore.mapped.drop_pages`)."""
        node, inits = matmul_nbits(q, x, y, name, self.accuracy_level)
        self.g.add([node], inits)
        for written in sources or [q]:
            drop_pages(written.codes)
        return y

    def fused(self, x: str, weights: list[str], name: str, widths: list[int], split: bool | None = None
              ) -> list[str]:
        """``x @ W`` for each of ``weights``: one ``MatMulNBits`` on their codes side by side when they are on one
        grid (fewer, larger kernels; decode runs them at the speed of their bytes), returned whole unless
        ``split`` (default: when the layout normalises q and k); else a node per weight."""
        g = self.g
        joined = None if any(w in self.input_scales for w in weights) or any(w not in self.codes for w in weights) \
            else join_outputs([self.codes[w] for w in weights])
        if joined is None:
            return [self.linear(x, w) for w in weights]
        product = self.nbits(joined, x, f"{name}.product", f"{name}.nbits", [self.codes[w] for w in weights])
        y = self.add_bias(product, weights, f"{name}.out")
        if not (self.layout.qk_norm if split is None else split):
            return [y]
        sizes = g.const(np.array(widths, np.int64), f"{name}.widths")
        return g.node("Split", [y, sizes], f"{name}.split", outputs=len(widths), axis=-1)

    def rms_norm(self, x: str, weight: str, skip: str | None = None) -> tuple[str, str | None]:
        """RMSNorm of ``x`` (of ``x + skip`` with ``skip``); returns it and, with ``skip``, the sum."""
        g, eps = self.g, float(self.cfg.rms_eps)
        w = g.const(self.state[weight].astype(np.float32), weight)
        if skip is None:
            return g.node("SimplifiedLayerNormalization", [x, w], f"{weight}.norm", axis=-1, epsilon=eps)[0], None
        out = g.node("SkipSimplifiedLayerNormalization", [x, skip, w], f"{weight}.norm", outputs=4,
                     domain=MS_DOMAIN, epsilon=eps)
        return out[0], out[3]

    def head_norm(self, x: str, weight: str) -> str:
        """RMSNorm over each head of ``x`` ``[batch, seq, heads * head_dim]`` (Gemma's q / k norms)."""
        g = self.g
        shape = g.const(np.array([0, 0, -1, self.cfg.head_dim], np.int64), f"{weight}.heads_shape")
        flat = g.const(np.array([0, 0, -1], np.int64), f"{weight}.flat_shape")
        heads = g.node("Reshape", [x, shape], f"{weight}.heads")[0]
        normed, _ = self.rms_norm(heads, weight)
        return g.node("Reshape", [normed, flat], f"{weight}.flat")[0]

    def attention(self, i: int, x: str, seqlens: str, total: str, rotary: dict[float, tuple[str, str]]) -> str:
        cfg, layout, g, p = self.cfg, self.layout, self.g, f"layers.{i}.attn"
        widths = [cfg.num_heads * cfg.head_dim] + [cfg.num_kv_heads * cfg.head_dim] * 2
        qkv = self.fused(x, [f"{p}.{n}_proj.weight" for n in "qkv"], f"{p}.qkv", widths)
        if len(qkv) == 1:  # GroupQueryAttention takes them packed
            q, k, v = qkv[0], "", ""
        else:
            q, k, v = qkv
        if layout.qk_norm:  # never packed (fused() splits them)
            q, k = self.head_norm(q, f"{p}.q_norm.weight"), self.head_norm(k, f"{p}.k_norm.weight")
        cos, sin = rotary[layout.thetas[i]]
        window = layout.windows[i]
        present = [f"{p}.out", OUTPUTS["present_key_names"] % i, OUTPUTS["present_value_names"] % i]
        out = g.node("GroupQueryAttention",
                     [q, k, v, INPUTS["past_key_names"] % i, INPUTS["past_value_names"] % i, seqlens, total, cos, sin],
                     f"{p}.gqa", outputs=present, domain=MS_DOMAIN, num_heads=cfg.num_heads,
                     kv_num_heads=cfg.num_kv_heads, scale=float(layout.attention_scale), do_rotary=1,
                     rotary_interleaved=0, local_window_size=-1 if window is None else window)
        return self.linear(out[0], f"{p}.o_proj.weight")

    def mlp(self, i: int, x: str) -> str:
        g, p = self.g, f"layers.{i}.mlp"
        inter = self.cfg.intermediate_size
        gate, up = self.fused(x, [f"{p}.gate_proj.weight", f"{p}.up_proj.weight"], f"{p}.gate_up", [inter, inter],
                              split=True)
        if self.layout.activation == "silu":
            act = g.node("Mul", [gate, g.node("Sigmoid", [gate], f"{p}.sigmoid")[0]], f"{p}.silu")[0]
        else:
            act = g.node("FastGelu", [gate], f"{p}.gelu", domain=MS_DOMAIN)[0]
        return self.linear(g.node("Mul", [act, up], f"{p}.gated")[0], f"{p}.down_proj.weight")

    def embedding(self, ids: str) -> str:
        g, table = self.g, "embed_tokens.weight"
        if table in self.codes:
            q, b_name = self.codes[table], f"{table}.nbits.B"  # B: written by the tied head's MatMulNBits
            nodes, inits = ort_lookup(q, ids, "embed_tokens.rows", "embed_tokens.lookup", b_name)
            if not self.cfg.tie_embeddings:
                g.const(nbits_arrays(q).b, b_name)
            g.add(nodes, inits)
            rows = "embed_tokens.rows"
        else:
            rows = g.node("Gather", [g.const(self.state[table], table), ids], "embed_tokens.rows")[0]
        if self.layout.embed_scale is not None:
            scale = g.const(np.array(self.layout.embed_scale, np.float32), "embed_tokens.scale")
            rows = g.node("Mul", [rows, scale], "embed_tokens.scaled")[0]
        return rows

    def head(self, x: str) -> str:
        """The logits: the tied table (its codes' ``MatMulNBits``, whose ``B`` the lookup reads) or ``lm_head``."""
        g, table = self.g, "embed_tokens.weight"
        if not self.cfg.tie_embeddings:
            return self.linear(x, "lm_head.weight", "logits")
        if table in self.codes:
            return self.nbits(self.codes[table], x, "logits", f"{table}.nbits")
        # the float table [vocab, hidden] read transposed by Gemm (no second copy of it)
        flat = g.node("Reshape", [x, g.const(np.array([-1, self.cfg.hidden_size], np.int64), "head.flat_shape")],
                      "head.flat")[0]
        scores = g.node("Gemm", [flat, table], "head.gemm", transB=1)[0]
        batch_seq = g.node("Slice", [g.node("Shape", [x], "head.shape")[0],
                                     g.const(np.array([0], np.int64), "head.start"),
                                     g.const(np.array([2], np.int64), "head.end")], "head.batch_seq")[0]
        vocab = g.const(np.array([self.cfg.vocab_size], np.int64), "head.vocab")
        shape = g.node("Concat", [batch_seq, vocab], "head.logits_shape", axis=0)[0]
        return g.node("Reshape", [scores, shape], "logits")[0]

    def build(self) -> Any:
        from onnx import TensorProto, helper

        cfg, layout, g = self.cfg, self.layout, self.g
        mask = INPUTS["attention_mask"]
        summed = g.node("ReduceSum", [mask, g.const(np.array([1], np.int64), "mask.axis")], "mask.sum", keepdims=0)[0]
        seqlens = g.node("Cast", [g.node("Sub", [summed, g.const(np.array(1, np.int64), "one")], "mask.last")[0]],
                         "seqlens_k", to=TensorProto.INT32)[0]
        width = g.node("Gather", [g.node("Shape", [mask], "mask.shape")[0], g.const(np.array(1, np.int64), "axis1")],
                       "mask.width")[0]
        total = g.node("Cast", [width], "total_sequence_length", to=TensorProto.INT32)[0]
        rotary = {}
        for theta in sorted(set(layout.thetas)):
            cos, sin = rotary_cache(theta, cfg.head_dim, cfg.context_length)
            rotary[theta] = (g.const(cos, f"cos_cache.{theta:g}"), g.const(sin, f"sin_cache.{theta:g}"))

        h = self.embedding(INPUTS["input_ids"])  # the residual stream
        x, _ = self.rms_norm(h, f"layers.0.{layout.attn_norm}.weight")
        pending = ""  # the last feed-forward output, not yet added to h
        for i in range(cfg.num_layers):
            if i:  # the previous feed-forward's output added to h, and this layer's norm, in one node
                x, h = self.rms_norm(pending, f"layers.{i}.{layout.attn_norm}.weight", h)
            a = self.attention(i, x, seqlens, total, rotary)
            if layout.attn_out_norm is not None:
                a, _ = self.rms_norm(a, f"layers.{i}.{layout.attn_out_norm}.weight")
            x, h = self.rms_norm(a, f"layers.{i}.{layout.ffn_norm}.weight", h)
            pending = self.mlp(i, x)
            if layout.ffn_out_norm is not None:
                pending, _ = self.rms_norm(pending, f"layers.{i}.{layout.ffn_out_norm}.weight")
        x, _ = self.rms_norm(pending, "norm.weight", h)
        self.head(x)

        kv = [cfg.num_kv_heads, None, cfg.head_dim]
        inputs = [helper.make_tensor_value_info(INPUTS["input_ids"], TensorProto.INT64, ["batch", "seq"]),
                  helper.make_tensor_value_info(mask, TensorProto.INT64, ["batch", "total"])]
        outputs = [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", "seq", cfg.vocab_size])]
        for i in range(cfg.num_layers):
            for kind in ("key", "value"):
                inputs.append(helper.make_tensor_value_info(INPUTS[f"past_{kind}_names"] % i, TensorProto.FLOAT,
                                                            ["batch", kv[0], "past", kv[2]]))
                outputs.append(helper.make_tensor_value_info(OUTPUTS[f"present_{kind}_names"] % i,
                                                             TensorProto.FLOAT, ["batch", kv[0], "present", kv[2]]))
        graph = helper.make_graph(g.nodes, "decoder", inputs, outputs, g.inits)
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET),
                                                       helper.make_opsetid(MS_DOMAIN, 1)])


def decoder_graph(model: Any, result: WeightOnlyResult, accuracy_level: int = INT8_ACTIVATIONS,
                  weights: ExternalData | None = None) -> Any:
    """The ONNX graph (``onnx.ModelProto``) of ``model`` (a :mod:`qptq.llm` port quantized in place by
    :func:`qptq.weight_only.quantize_`, ``grid="int"``) with ``result``'s codes; its initializers written to
    ``weights`` as they are made when given (the graph then holds none of their bytes), else held in the graph."""
    return _DecoderWriter(DecoderLayout.of(model), *parameters_and_codes(model, result), accuracy_level,
                          weights).build()
