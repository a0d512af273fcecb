"""Weight-only quantization of a decoder one layer at a time, read from its checkpoint
(:func:`quantize_streaming`): memory holds one decoder layer, the calibration hidden states and the codes
chosen so far, whatever the model's size.

The embedding rows of the calibration windows start the hidden states; then, layer by layer, the layer's
parameters are read from the :class:`~.sources.TensorSource` in float32 into the port's block
(:mod:`.llama` / :mod:`.gemma3`), its linears calibrated and quantized by
:func:`qptq.weight_only.layer.quantize_block`, and the hidden states moved on through it (quantized with
``sequential=True``, GPTQ's order; float otherwise). The final norm, an untied LM head (calibrated on the last
hidden states) and, with ``embedding_bits``, the table come last. A short probe window runs through the same
layers, so the simulation's logits to check a runtime against come out without the whole model ever being built.

The codes equal :func:`qptq.weight_only.quantize_`'s on the whole model read in memory, for either order (both use
the same blocks and exact Hessians), except that mixed precision (``ratio``) chooses within each layer here.
Under ``paddle.distributed`` each rank passes its share of the windows and the Hessians are summed exactly over
the ranks: every rank gets the one-process codes.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import paddle
from paddle import nn

from ..weight_only.config import WeightOnlyConfig
from ..weight_only.layer import (
    calibrate_linears,
    call_block,
    merge_results,
    quantize_block,
    quantize_linears,
    quantizes_table,
    selected_linears,
)
from ..weight_only.plan import WeightOnlyResult, quantize_tables, table_rows
from .common import RMSNorm
from .layout import DecoderLayout
from .sources import TensorSource, port_of


@dataclass
class StreamedDecoder:
    """What the writers (:mod:`.ort_graph`, :mod:`.openvino_graph`, :mod:`.gguf_export`) read of a decoder quantized
    layer by layer: its hyper-parameters and, in float32, every parameter the result holds no codes for (norms,
    biases, a float table or head; a quantized table as its dequantized rows)."""

    cfg: Any
    state: dict[str, np.ndarray]

    def state_dict(self) -> dict[str, np.ndarray]:
        return self.state


@dataclass
class StreamedQuantization:
    """:func:`quantize_streaming`'s outcome: the decoder for the writers, the codes, and the simulation's logits
    of the probe window (``[T, vocab]``)."""

    model: StreamedDecoder
    result: WeightOnlyResult
    probe_logits: np.ndarray
    spill: Any = None  # the temporary directory the codes are memory-mapped from, kept while this lives


def _spill(result: WeightOnlyResult, names: Sequence[str], directory: Path) -> None:
    """Move the codes of ``names`` to ``.npy`` files in ``directory``, memory-mapped back (the codes of a large model
    outgrow memory; the writers read them once)."""
    for name in names:
        q = result.codes[name]
        path = directory / f"{name}.npy"
        np.save(path, q.codes)
        result.codes[name] = replace(q, codes=np.load(path, mmap_mode="r"))


class _Tail(nn.Layer):
    """The final norm and an untied LM head: what the last hidden states pass through to the logits."""

    def __init__(self, norm: RMSNorm, lm_head: nn.Linear) -> None:
        super().__init__()
        self.norm, self.lm_head = norm, lm_head

    def forward(self, h: paddle.Tensor) -> paddle.Tensor:
        return self.lm_head(self.norm(h))


def _load(layer: nn.Layer, values: dict[str, np.ndarray]) -> nn.Layer:
    layer.set_state_dict({name: paddle.to_tensor(value) for name, value in values.items()})
    return layer.eval()


@paddle.no_grad()
def quantize_streaming(source: TensorSource, config: WeightOnlyConfig, windows: Sequence[np.ndarray] | None,
                       probe: np.ndarray, progress: Callable[[str], None] | None = None,
                       on_layer: Callable[[int], None] | None = None, spill_to: Path | None = None
                       ) -> StreamedQuantization:
    """Quantize the decoder of ``source`` layer by layer as ``config`` says (module docstring).

    ``windows``: this rank's calibration token ids, ``[1, T]`` each (None: round to nearest, nothing run);
    ``probe``: ``[1, P]`` ids whose logits the simulation gives back; ``progress(linear)`` after each linear is
    quantized, ``on_layer(i)`` after each decoder layer; ``spill_to``: a directory to hold each layer's codes in a
    temporary directory of, memory-mapped (default: in memory).
    """
    cfg = source.config
    port = port_of(cfg)
    scale = DecoderLayout.of(SimpleNamespace(cfg=cfg)).embed_scale
    weight_name: Callable[[str, Any], str] = lambda name, layer: f"{name}.weight"  # noqa: E731
    per_length: dict[int, list[tuple[Any, ...]]] = {}  # every layer's rotary tables and mask, by window length

    def layer_arguments(i: int, length: int) -> tuple[Any, ...]:
        if length not in per_length:
            per_length[length] = port.layer_inputs(cfg, 0, length)
        return (*per_length[length][i], None, None)

    table = source.tensor("embed_tokens.weight")
    tables = WeightOnlyResult()  # round to nearest needs no calibration: coded first, reported last
    if quantizes_table("embed_tokens", cfg.hidden_size, config):
        quantize_tables({"embed_tokens": table}, {"embed_tokens": "embed_tokens.weight"}, config, tables)

    def embed(rows: np.ndarray) -> paddle.Tensor:
        out = paddle.to_tensor(rows)
        return out if scale is None else out * scale

    # calibration reads the float table (as on the whole model, whose tables are coded after its linears); the
    # probe reads what the runtime will, the coded table's rows
    hidden = [embed(table[w]) for w in windows or ()]
    coded_table = tables.codes.get("embed_tokens.weight")
    probe_h = embed(table[probe] if coded_table is None else
                    table_rows(coded_table, probe.ravel()).reshape(*probe.shape, -1))
    del table  # a float table is read again at the end: memory holds one layer between
    state: dict[str, np.ndarray] = {}
    result = WeightOnlyResult()
    spill = None if spill_to is None else tempfile.TemporaryDirectory(prefix=".codes-", dir=spill_to)
    for i in range(cfg.num_layers):
        block = port.Block(cfg)
        values = {name: source.tensor(f"layers.{i}.{name}") for name in block.state_dict()}
        _load(block, values)
        linears = selected_linears(((f"layers.{i}.{n}", sub) for n, sub in block.named_sublayers()), config)
        if hidden:
            batches = [(h, *layer_arguments(i, h.shape[1])) for h in hidden]
            part, hidden = quantize_block(block, linears, batches, config, progress, names=weight_name)
        else:
            part = quantize_linears(linears, None, [[n] for n, _ in linears], config, progress, weight_name)
        merge_results(result, part)
        if spill is not None:
            _spill(result, list(part.codes), Path(spill.name))
        probe_h = block(probe_h, *layer_arguments(i, probe.shape[1]))[0]
        coded = {f"{n}.weight" for n, _ in linears}
        state.update({f"layers.{i}.{n}": v for n, v in values.items() if f"layers.{i}.{n}" not in coded})
        del block, values
        if on_layer is not None:
            on_layer(i)

    norm = _load(RMSNorm(cfg.hidden_size, cfg.rms_eps), {"weight": source.tensor("norm.weight")})
    state["norm.weight"] = norm.weight.numpy()
    if cfg.tie_embeddings:
        head_weight = None
    else:
        head = _load(nn.Linear(cfg.hidden_size, cfg.vocab_size, bias_attr=False),
                     {"weight": source.tensor("lm_head.weight")})
        linears = selected_linears([("lm_head", head)], config)
        if linears:
            hessians, shared = None, [["lm_head"]]
            if hidden:
                hessians, shared = calibrate_linears(_Tail(norm, head), linears, [(h,) for h in hidden], call_block)
            merge_results(result, quantize_linears(linears, hessians, shared, config, progress, weight_name))
        else:
            state["lm_head.weight"] = head.weight.numpy()
        head_weight = head.weight
    del hidden

    table = source.tensor("embed_tokens.weight") if coded_table is None else table_rows(coded_table)
    merge_results(result, tables)
    state["embed_tokens.weight"] = table
    x = norm(probe_h)
    logits = (x.numpy()[0] @ table.T if head_weight is None  # numpy: no second copy of the table
              else paddle.matmul(x, head_weight).numpy()[0])
    return StreamedQuantization(StreamedDecoder(cfg, state), result, logits, spill)
