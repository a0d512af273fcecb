"""Small models in every on-disk format, for the tests of every q* package.

Tests build their models here instead of downloading any: a conv + batch_norm + relu +
fc network (and optionally an embedding lookup), saved by ``paddle.jit.save`` as PIR and as
a legacy ProgramDesc in each of Paddle's legacy file layouts.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import paddle

from qcore.model_io import load_model, save_model

FORMATS = ("pir", "legacy_pdmodel", "legacy_combined", "legacy_separate")
INPUT_SHAPE = (1, 8, 8)


class TinyConvNet(paddle.nn.Layer):
    """conv2d(+bias) -> batch_norm -> relu -> depthwise conv -> relu -> fc."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = paddle.nn.Conv2D(1, 8, 3, padding=1)
        self.bn = paddle.nn.BatchNorm2D(8)
        self.dw = paddle.nn.Conv2D(8, 8, 3, padding=1, groups=8, bias_attr=False)
        self.fc = paddle.nn.Linear(8 * 8 * 8, 10)

    def forward(self, x: paddle.Tensor) -> paddle.Tensor:
        y = paddle.nn.functional.relu(self.bn(self.conv(x)))
        y = paddle.nn.functional.relu(self.dw(y))
        return self.fc(paddle.flatten(y, 1))


class TinyEmbeddingNet(paddle.nn.Layer):
    """Embedding lookup (id 0 is padding) -> mean over the sequence -> fc: a recommender's shape."""

    def __init__(self, vocab: int = 64, dim: int = 16, classes: int = 4, scale_grad_by_freq: bool = False) -> None:
        super().__init__()
        # scale_grad_by_freq exports as embedding_with_scaled_gradient instead of lookup_table_v2 / embedding
        self.emb = paddle.nn.Embedding(vocab, dim, padding_idx=0, scale_grad_by_freq=scale_grad_by_freq)
        self.fc = paddle.nn.Linear(dim, classes)

    def forward(self, ids: paddle.Tensor) -> paddle.Tensor:
        return self.fc(paddle.mean(self.emb(ids), axis=1))


class TinyResNet(paddle.nn.Layer):
    """stem -> identity block -> projection block (strided, conv shortcut); conv + batch_norm units."""

    def __init__(self) -> None:
        super().__init__()

        def unit(cin: int, cout: int, k: int = 3, stride: int = 1) -> paddle.nn.Sequential:
            conv = paddle.nn.Conv2D(cin, cout, k, stride=stride, padding=k // 2, bias_attr=False)
            return paddle.nn.Sequential(conv, paddle.nn.BatchNorm2D(cout))

        self.stem = unit(1, 8)
        self.identity = paddle.nn.LayerList([unit(8, 8), unit(8, 8)])
        self.projection = paddle.nn.LayerList([unit(8, 16, stride=2), unit(16, 16)])
        self.shortcut = unit(8, 16, k=1, stride=2)

    def forward(self, x: paddle.Tensor) -> paddle.Tensor:
        relu = paddle.nn.functional.relu
        y = relu(self.stem(x))
        y = relu(y + self.identity[1](relu(self.identity[0](y))))
        return relu(self.shortcut(y) + self.projection[1](relu(self.projection[0](y))))


EMBEDDING_INPUT_SPEC = (paddle.static.InputSpec([None, 6], "int64", "ids"),)


def make_tiny_net(seed: int = 0) -> TinyConvNet:
    """A TinyConvNet with non-trivial batch-norm statistics, in eval mode."""
    paddle.seed(seed)
    net = TinyConvNet()
    rng = np.random.default_rng(seed)
    net.bn.weight.set_value(rng.uniform(0.5, 1.5, 8).astype("float32"))
    net.bn.bias.set_value(rng.normal(0, 0.1, 8).astype("float32"))
    net.bn._mean.set_value(rng.normal(0, 0.2, 8).astype("float32"))
    net.bn._variance.set_value(rng.uniform(0.5, 2.0, 8).astype("float32"))
    net.eval()
    return net


def sample_input(n: int = 4, seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, *INPUT_SHAPE)).astype("float32")


def save_tiny_net(
    net: paddle.nn.Layer, directory: Path, fmt: str, input_spec: Sequence[paddle.static.InputSpec] | None = None
) -> dict[str, str | None]:
    """Save ``net`` in format ``fmt`` under ``directory``; returns load kwargs for it.

    ``input_spec`` defaults to TinyConvNet's image input (use EMBEDDING_INPUT_SPEC for TinyEmbeddingNet).
    """
    directory = Path(directory)
    spec = list(input_spec or [paddle.static.InputSpec([None, *INPUT_SHAPE], "float32", "x")])
    if fmt == "pir":
        paddle.jit.save(net, str(directory / "inference"), input_spec=spec)
        return {"model_filename": None, "params_filename": None}
    staging = directory.parent / (directory.name + "_pdmodel")
    with paddle.pir_utils.OldIrGuard():
        paddle.jit.save(net, str(staging / "inference"), input_spec=spec)
    if fmt == "legacy_pdmodel":
        staging.rename(directory)
        return {"model_filename": None, "params_filename": None}
    names = {"legacy_combined": ("__model__", "__params__"), "legacy_separate": ("__model__", None)}[fmt]
    save_model(load_model(staging), directory, *names)
    return {"model_filename": names[0], "params_filename": names[1]}


class FftNet(paddle.nn.Layer):
    """A conv, then ``paddle.fft.rfft`` over the last axis: ``abs`` of it (paddle2onnx 2.1 writes a graph of the
    wrong output shape, (2, 3, 28, 28) where Paddle's is (2, 4, 28, 15)) or its ``real`` part (paddle2onnx 2.1
    aborts): the exports that must be refused."""

    def __init__(self, part: str = "abs") -> None:
        super().__init__()
        self.part = part
        self.conv = paddle.nn.Conv2D(3, 4, 1)

    def forward(self, x: paddle.Tensor) -> paddle.Tensor:
        y = paddle.fft.rfft(self.conv(x))
        return paddle.abs(y) if self.part == "abs" else paddle.real(y)


def save_fft_net(directory: Path, part: str = "abs") -> None:
    """Save :class:`FftNet` as a PIR model in ``directory`` (input ``x``: ``[N, 3, 28, 28]``)."""
    net = FftNet(part)
    net.eval()
    paddle.jit.save(net, str(Path(directory) / "inference"),
                    input_spec=[paddle.static.InputSpec([None, 3, 28, 28], "float32", "x")])


def save_tiny_llama_gguf(path: Path, seed: int = 1, layers: int = 2, *, hidden: int = 64, inter: int = 128,
                         head_dim: int = 16) -> Path:
    """A float32 GGUF of a random tiny Llama (``hidden`` wide, 4 heads of ``head_dim``, 2 KV heads, FFN ``inter``,
    ``layers`` layers, tied embedding) as llama.cpp's converter writes one: hyper-parameters, a SentencePiece
    vocabulary of 320 tokens (3 control, the 256 bytes, pieces), every tensor under its GGUF name. Needs the
    ``gguf`` package."""
    import gguf

    heads, kv_heads, vocab = 4, 2, 320
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("tiny-test-llama")
    w.add_context_length(256)
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(inter)
    w.add_block_count(layers)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(head_dim)
    w.add_file_type(0)
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    tokens += [f"\u2581w{i}" for i in range(vocab - len(tokens))]
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_scores([0.0] * 259 + [-float(i) for i in range(vocab - 259)])
    w.add_token_types([2, 3, 3] + [6] * 256 + [1] * (vocab - 259))
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)

    def matrix(rows: int, cols: int) -> np.ndarray:
        return rng.normal(0.0, 0.08, (rows, cols)).astype(np.float32)

    def norm() -> np.ndarray:
        return rng.uniform(0.8, 1.2, hidden).astype(np.float32)

    w.add_tensor("token_embd.weight", matrix(vocab, hidden))
    for i in range(layers):  # [out, in], as GGUF stores a linear
        for name, shape in (("attn_q", (heads * head_dim, hidden)), ("attn_k", (kv_heads * head_dim, hidden)),
                            ("attn_v", (kv_heads * head_dim, hidden)), ("attn_output", (hidden, heads * head_dim)),
                            ("ffn_gate", (inter, hidden)), ("ffn_up", (inter, hidden)),
                            ("ffn_down", (hidden, inter))):
            w.add_tensor(f"blk.{i}.{name}.weight", matrix(*shape))
        w.add_tensor(f"blk.{i}.attn_norm.weight", norm())
        w.add_tensor(f"blk.{i}.ffn_norm.weight", norm())
    w.add_tensor("output_norm.weight", norm())
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


#: The tiny checkpoints' families: (``architectures`` entry, ``model_type``, parameter prefix, q/k/v biases,
#: tied embedding, rotary base).
PADDLENLP_FAMILIES = {
    "llama": ("LlamaForCausalLM", "llama", "llama", False, False, 10000.0),
    "mistral": ("MistralForCausalLM", "mistral", "mistral", False, False, 10000.0),
    "qwen2": ("Qwen2ForCausalLM", "qwen2", "qwen2", True, True, 1000000.0),
}


def tiny_bpe_tokenizer_json(vocab_size: int = 320) -> str:
    """A byte-level BPE ``tokenizer.json`` of exactly ``vocab_size`` tokens: ``<unk>``, ``<s>``, ``</s>`` (special),
    the 256 byte symbols, then merges of a space or a letter with a letter until the vocabulary is full."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    specials = ["<unk>", "<s>", "</s>"]
    vocab = {t: i for i, t in enumerate(specials + sorted(pre_tokenizers.ByteLevel.alphabet()))}
    letters = "etaoinshrdlucmfwypvbgk"
    merges = []
    for left, right in [("\u0120", c) for c in letters] + [(a, b) for a in letters for b in letters]:
        if len(vocab) == vocab_size:
            break
        vocab[left + right] = len(vocab)
        merges.append((left, right))
    tok = Tokenizer(models.BPE(vocab, merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(specials)
    return tok.to_str()


def save_tiny_paddlenlp_checkpoint(directory: Path, family: str = "llama", dtype: str = "bfloat16",
                                   weights: str = "pdparams", shards: int = 1, seed: int = 0, layers: int = 2,
                                   sliding_window: int | None = None) -> Path:
    """A random tiny decoder of ``family`` (``llama``, ``mistral``, ``qwen2``) saved as PaddleNLP saves one:
    ``config.json``, the weights under PaddleNLP's names with ``Linear`` weights ``[in, out]`` in ``dtype``
    (``weights="pdparams"``: ``model_state.pdparams``; ``"safetensors"``: ``model.safetensors``, or ``shards`` files
    with ``model.safetensors.index.json``), a byte-level BPE ``tokenizer.json`` and ``tokenizer_config.json``.
    Hidden 64, 4 heads of 16, 2 KV heads, FFN 128, vocabulary 320; Qwen2 with q/k/v biases and a tied embedding,
    Llama and Mistral with an LM head of their own (``[hidden, vocab]``); Mistral's ``sliding_window`` as given."""
    import json

    _, _, prefix, qkv_bias, tied, _ = PADDLENLP_FAMILIES[family]
    hidden, inter, heads, kv_heads, head_dim, vocab = 64, 128, 4, 2, 16, 320
    directory = _write_paddlenlp_config(Path(directory), family, dict(
        hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers, num_attention_heads=heads,
        num_key_value_heads=kv_heads, vocab_size=vocab, max_position_embeddings=256, dtype=dtype,
        **({"sliding_window": sliding_window} if family == "mistral" else {})))

    rng = np.random.default_rng(seed)
    state: dict[str, np.ndarray] = {f"{prefix}.embed_tokens.weight": rng.normal(0.0, 0.5, (vocab, hidden))}
    for i in range(layers):
        p = f"{prefix}.layers.{i}"
        for name, shape in (("self_attn.q_proj", (hidden, heads * head_dim)),
                            ("self_attn.k_proj", (hidden, kv_heads * head_dim)),
                            ("self_attn.v_proj", (hidden, kv_heads * head_dim)),
                            ("self_attn.o_proj", (heads * head_dim, hidden)), ("mlp.gate_proj", (hidden, inter)),
                            ("mlp.up_proj", (hidden, inter)), ("mlp.down_proj", (inter, hidden))):
            state[f"{p}.{name}.weight"] = rng.normal(0.0, 0.15, shape)  # [in, out], as paddle.nn.Linear
            if qkv_bias and name in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"):
                state[f"{p}.{name}.bias"] = rng.normal(0.0, 0.5, shape[1])
        state[f"{p}.input_layernorm.weight"] = rng.uniform(0.8, 1.2, hidden)
        state[f"{p}.post_attention_layernorm.weight"] = rng.uniform(0.8, 1.2, hidden)
    state[f"{prefix}.norm.weight"] = rng.uniform(0.8, 1.2, hidden)
    if not tied:
        state["lm_head.weight"] = rng.normal(0.0, 0.15, (hidden, vocab))  # PaddleNLP's LM head: [hidden, vocab]
    tensors = {name: paddle.to_tensor(value.astype(np.float32)).astype(dtype) for name, value in state.items()}
    if weights == "pdparams":
        paddle.save(tensors, str(directory / "model_state.pdparams"))
        return directory
    from safetensors.paddle import save_file

    if shards == 1:
        save_file(tensors, str(directory / "model.safetensors"))
        return directory
    names = list(tensors)
    weight_map = {}
    for k in range(shards):
        file = f"model-{k + 1:05d}-of-{shards:05d}.safetensors"
        part = names[k::shards]
        save_file({n: tensors[n] for n in part}, str(directory / file))
        weight_map.update({n: file for n in part})
    index = {"metadata": {"total_size": sum(int(t.numel()) * t.element_size() for t in tensors.values())},
             "weight_map": weight_map}
    (directory / "model.safetensors.index.json").write_text(json.dumps(index, indent=1), encoding="utf-8")
    return directory


def _write_paddlenlp_config(directory: Path, family: str, shape: dict) -> Path:
    """``config.json`` of ``family`` with the hyper-parameters ``shape``, and a byte-level BPE tokenizer of 320
    tokens (``tokenizer.json`` + ``tokenizer_config.json``; ids above 319 are never made from text)."""
    import json

    arch, model_type, _, _, tied, theta = PADDLENLP_FAMILIES[family]
    directory.mkdir(parents=True, exist_ok=True)
    config = {"architectures": [arch], "model_type": model_type, "hidden_act": "silu", "rope_theta": theta,
              "rms_norm_eps": 1e-6, "tie_word_embeddings": tied, "bos_token_id": 1, "eos_token_id": 2, **shape}
    (directory / "config.json").write_text(json.dumps(config, indent=1), encoding="utf-8")
    (directory / "tokenizer.json").write_text(tiny_bpe_tokenizer_json(320), encoding="utf-8")
    (directory / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
         "unk_token": "<unk>"}, indent=1), encoding="utf-8")
    return directory


def save_random_paddlenlp_checkpoint(directory: Path, family: str, hidden: int, intermediate: int, layers: int,
                                     heads: int, kv_heads: int, vocab: int, context: int = 4096,
                                     dtype: str = "bfloat16", seed: int = 0) -> Path:
    """A random decoder of ``family`` at a real model's size, as PaddleNLP saves one: ``config.json``, safetensors
    shards of one decoder layer each (``dtype``) with ``model.safetensors.index.json``, written a layer at a time
    (memory: one layer), weights ``N(0, 1/sqrt(fan_in))``, norms 1. For timing and memory, not accuracy."""
    import json

    import paddle
    from safetensors.paddle import save_file

    _, _, prefix, qkv_bias, tied, _ = PADDLENLP_FAMILIES[family]
    head_dim = hidden // heads
    directory = _write_paddlenlp_config(Path(directory), family, dict(
        hidden_size=hidden, intermediate_size=intermediate, num_hidden_layers=layers, num_attention_heads=heads,
        num_key_value_heads=kv_heads, vocab_size=vocab, max_position_embeddings=context, dtype=dtype))
    rng = np.random.default_rng(seed)

    def weights(shape: tuple[int, ...]) -> np.ndarray:
        return (rng.standard_normal(shape, np.float32) / np.float32(np.sqrt(shape[0]))).astype(np.float32)

    parts: list[dict[str, np.ndarray]] = [{f"{prefix}.embed_tokens.weight": weights((vocab, hidden)) * 8,
                                           f"{prefix}.norm.weight": np.ones(hidden, np.float32)}]
    if not tied:
        parts[0]["lm_head.weight"] = weights((hidden, vocab))
    total, weight_map = 0, {}
    count = layers + 1
    for k in range(count):
        if k < layers:
            p = f"{prefix}.layers.{k}"
            part = {f"{p}.{name}.weight": weights(shape) for name, shape in (
                ("self_attn.q_proj", (hidden, heads * head_dim)), ("self_attn.k_proj", (hidden, kv_heads * head_dim)),
                ("self_attn.v_proj", (hidden, kv_heads * head_dim)), ("self_attn.o_proj", (heads * head_dim, hidden)),
                ("mlp.gate_proj", (hidden, intermediate)), ("mlp.up_proj", (hidden, intermediate)),
                ("mlp.down_proj", (intermediate, hidden)))}
            if qkv_bias:
                part.update({f"{p}.self_attn.{n}_proj.bias": np.zeros(w, np.float32)
                             for n, w in (("q", heads * head_dim), ("k", kv_heads * head_dim),
                                          ("v", kv_heads * head_dim))})
            part[f"{p}.input_layernorm.weight"] = np.ones(hidden, np.float32)
            part[f"{p}.post_attention_layernorm.weight"] = np.ones(hidden, np.float32)
        else:
            part = parts[0]
        file = f"model-{k + 1:05d}-of-{count:05d}.safetensors"
        tensors = {n: paddle.to_tensor(v).astype(dtype) for n, v in part.items()}
        save_file(tensors, str(directory / file))
        total += sum(int(t.numel()) * t.element_size() for t in tensors.values())
        weight_map.update({n: file for n in part})
        del tensors, part
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (directory / "model.safetensors.index.json").write_text(json.dumps(index, indent=1), encoding="utf-8")
    return directory
