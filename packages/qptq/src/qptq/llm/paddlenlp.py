"""PaddleNLP checkpoints read with no model code: a directory with ``config.json`` (the hyper-parameters, PaddleNLP's
and Hugging Face's keys), the weights and ``tokenizer.json`` (+ ``tokenizer_config.json``).

Weights: ``model_state.pdparams`` (``paddle.load``), ``model.safetensors``, or shards listed by
``model.safetensors.index.json`` / ``model_state.pdparams.index.json``; safetensors files are memory-mapped and read a
tensor at a time; bf16, fp16 or f32, read into the port in float32. Paddle's ``Linear`` weights are ``[in, out]``,
as the port's, so they are taken as stored.

Architectures (``architectures`` or ``model_type``): Llama, Mistral (Llama's weights) and Qwen2 (Llama with biases on
the q/k/v projections), all as :class:`.llama.Llama`; parameter names map onto the port's by :data:`LAYER_TENSORS`
under each family's prefix (:data:`FAMILIES`). Mistral's sliding window (v0.1: 4096) caps the context written to
the runtimes' configs (``min(max_position_embeddings, sliding_window)``): within it the window hides no key, so the
port's full attention is exact there.

Every problem found in the directory's small files (config, index, safetensors headers) is one
:class:`~qcore.errors.ConfigError` or :class:`~qcore.errors.DataError` line before any weight is read
(:func:`open_checkpoint`).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from qcore.errors import ConfigError, DataError

from .config import DecoderConfig
from .genai_folders import TokenizerFiles

CONFIG = "config.json"
TOKENIZER = "tokenizer.json"
TOKENIZER_CONFIG = "tokenizer_config.json"
#: Weight files, looked for in this order: an index of shards, or one file.
WEIGHT_FILES = ("model.safetensors.index.json", "model_state.pdparams.index.json", "model.safetensors",
                "model_state.pdparams")

#: ``config.json``'s ``architectures`` entry (else its ``model_type``) -> the family read here.
ARCHITECTURES = {"LlamaForCausalLM": "llama", "MistralForCausalLM": "mistral", "Qwen2ForCausalLM": "qwen2"}
#: Per family: the base model's parameter prefix (PaddleNLP's ``base_model_prefix``) and whether q/k/v have biases.
FAMILIES = {"llama": ("llama", False), "mistral": ("mistral", False), "qwen2": ("qwen2", True)}
#: A decoder layer's parameters: checkpoint name after ``<prefix>.layers.<i>.`` -> port name after ``layers.<i>.``.
LAYER_TENSORS = {
    "input_layernorm.weight": "input_norm.weight", "post_attention_layernorm.weight": "post_norm.weight",
    "self_attn.q_proj.weight": "attn.q_proj.weight", "self_attn.k_proj.weight": "attn.k_proj.weight",
    "self_attn.v_proj.weight": "attn.v_proj.weight", "self_attn.o_proj.weight": "attn.o_proj.weight",
    "mlp.gate_proj.weight": "mlp.gate_proj.weight", "mlp.up_proj.weight": "mlp.up_proj.weight",
    "mlp.down_proj.weight": "mlp.down_proj.weight",
}
#: Qwen2's q/k/v biases, named as :data:`LAYER_TENSORS`.
QKV_BIASES = {"self_attn.q_proj.bias": "attn.q_proj.bias", "self_attn.k_proj.bias": "attn.k_proj.bias",
              "self_attn.v_proj.bias": "attn.v_proj.bias"}
#: ``config.json`` switches whose checkpoints hold other tensors than the port's (PaddleNLP's fused projections,
#: Llama's optional biases): refused.
UNPORTED_SWITCHES = ("fuse_attention_qkv", "fuse_attention_ffn", "attention_bias", "mlp_bias", "use_sliding_window")


@dataclass(frozen=True)
class Checkpoint:
    """A checked checkpoint directory: its family, hyper-parameters, ``config.json`` and where each weight is
    (checkpoint name -> file; every name of one file maps to it when there is no index)."""

    directory: Path
    family: str
    config: DecoderConfig
    raw: dict[str, Any]
    files: tuple[Path, ...]
    index: dict[str, Path] | None

    def tensor_names(self) -> dict[str, str]:
        """Port parameter name -> checkpoint name."""
        prefix, _ = FAMILIES[self.family]
        cfg = self.config
        table = {"embed_tokens.weight": f"{prefix}.embed_tokens.weight", "norm.weight": f"{prefix}.norm.weight"}
        if not cfg.tie_embeddings:
            table["lm_head.weight"] = "lm_head.weight"  # PaddleNLP's untied head: [hidden, vocab]
        layer = LAYER_TENSORS | (QKV_BIASES if cfg.qkv_bias else {})
        for i in range(cfg.num_layers):
            table.update({f"layers.{i}.{dst}": f"{prefix}.layers.{i}.{src}" for src, dst in layer.items()})
        return table


def _json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{path} is not readable JSON ({exc}); give the checkpoint's own file") from None


def family_of(raw: dict[str, Any], path: Path) -> str:
    """The family of a ``config.json`` (its ``architectures``, else ``model_type``); one line when it is not read."""
    names = list(raw.get("architectures") or [])
    for name in names:
        if name in ARCHITECTURES:
            return ARCHITECTURES[name]
    if not names and raw.get("model_type") in FAMILIES:
        return raw["model_type"]
    said = names or raw.get("model_type")
    raise ConfigError(f"{path} describes {said!r}; the checkpoints read here are {sorted(ARCHITECTURES)}")


def decoder_config(raw: dict[str, Any], family: str, path: Path) -> DecoderConfig:
    """The port's hyper-parameters from ``config.json`` (Hugging Face's defaults where a key is absent)."""
    for switch in UNPORTED_SWITCHES:
        if raw.get(switch):
            raise ConfigError(f"{path} sets {switch}={raw[switch]!r}, whose tensors the port does not have; "
                              f"save the checkpoint with {switch}=false")
    if raw.get("rope_scaling"):
        raise ConfigError(f"{path} scales the rotary positions ({raw['rope_scaling']}); only unscaled rotary "
                          "positions are ported")
    if raw.get("hidden_act", "silu") != "silu":
        raise ConfigError(f"{path} has hidden_act={raw['hidden_act']!r}; {family} is ported with SwiGLU ('silu')")
    try:
        hidden, heads = int(raw["hidden_size"]), int(raw["num_attention_heads"])
        context = int(raw.get("max_position_embeddings", 2048))
        window = raw.get("sliding_window") if family == "mistral" else None
        return DecoderConfig(
            vocab_size=int(raw["vocab_size"]), hidden_size=hidden, intermediate_size=int(raw["intermediate_size"]),
            num_layers=int(raw["num_hidden_layers"]), num_heads=heads,
            num_kv_heads=int(raw.get("num_key_value_heads") or heads),
            head_dim=int(raw.get("head_dim") or hidden // heads), rope_theta=float(raw.get("rope_theta", 10000.0)),
            rms_eps=float(raw.get("rms_norm_eps", 1e-6)),
            context_length=context if window is None else min(context, int(window)),
            tie_embeddings=bool(raw.get("tie_word_embeddings", False)), qkv_bias=FAMILIES[family][1])
    except KeyError as exc:
        raise ConfigError(f"{path} has no {exc.args[0]}; give the checkpoint's own config.json") from None
    except ValueError as exc:
        raise ConfigError(f"{path}: {exc}") from None


def _weight_files(directory: Path) -> tuple[tuple[Path, ...], dict[str, Path] | None]:
    for name in WEIGHT_FILES:
        path = directory / name
        if not path.is_file():
            continue
        if not name.endswith(".index.json"):
            return (path,), None
        shards = {key: directory / file for key, file in _json(path).get("weight_map", {}).items()}
        missing = sorted({p.name for p in shards.values() if not p.is_file()})
        if missing:
            raise ConfigError(f"{path} lists shards that are not in {directory}: {', '.join(missing[:3])}")
        if not shards:
            raise ConfigError(f"{path} has no weight_map; give the index the checkpoint was saved with")
        return tuple(sorted(set(shards.values()))), shards
    raise ConfigError(f"{directory} holds no weights: give model_state.pdparams, model.safetensors or "
                      "model.safetensors.index.json with its shards")


def open_checkpoint(directory: str | os.PathLike[str]) -> Checkpoint:
    """Check a checkpoint directory without reading its weights: ``config.json`` of a family read here, weight files
    (every shard an index lists), ``tokenizer.json``; safetensors' names are checked to be PaddleNLP's."""
    directory = Path(directory)
    path = directory / CONFIG
    if not path.is_file():
        raise ConfigError(f"{directory} has no {CONFIG}; give a PaddleNLP checkpoint directory (config.json, "
                          "model_state.pdparams or safetensors, tokenizer.json) or a .gguf file")
    raw = _json(path)
    family = family_of(raw, path)
    config = decoder_config(raw, family, path)
    files, index = _weight_files(directory)
    if not (directory / TOKENIZER).is_file():
        raise ConfigError(f"{directory} has no {TOKENIZER}; save the tokenizer with the checkpoint "
                          "(tokenizer.save_pretrained) so the runtimes' folders can hold it")
    checkpoint = Checkpoint(directory, family, config, raw, files, index)
    names = set(index) if index is not None else (
        _safetensors_names(files[0]) if files[0].suffix == ".safetensors" else None)
    if names is not None:
        check_names(checkpoint, names)
    return checkpoint


def _safetensors_names(path: Path) -> set[str]:
    from safetensors import safe_open

    with safe_open(str(path), framework="np") as f:
        return set(f.keys())


def check_names(checkpoint: Checkpoint, names: set[str]) -> None:
    """One line when the checkpoint's parameter names are not those of its family in PaddleNLP's layout."""
    wanted = set(checkpoint.tensor_names().values())
    missing = sorted(wanted - names)
    if not missing:
        return
    prefix = FAMILIES[checkpoint.family][0]
    if any(n.startswith("model.layers.") for n in names):
        raise DataError(f"{checkpoint.directory} is in Hugging Face's layout (model.layers.*, [out, in] weights); "
                        f"save it with PaddleNLP (its {prefix}.* names, [in, out] weights) and quantize that")
    raise DataError(f"{checkpoint.directory} has no {missing[0]} (and {len(missing) - 1} more {prefix}.* tensors "
                    f"of a {checkpoint.family} checkpoint); it has e.g. {sorted(names)[0]}")


def _float32(value: Any) -> np.ndarray:
    """A stored tensor (``paddle.Tensor`` of any float dtype) as float32 numpy."""
    return value.astype("float32").numpy()


class CheckpointSource:
    """The port's parameters of a checked checkpoint, read one at a time in float32 by the port's names
    (:class:`qptq.llm.sources.TensorSource`): safetensors files are memory-mapped and read a tensor at a time;
    a ``.pdparams`` file is a pickle, loaded whole once (in its stored dtype) and kept while it is read."""

    def __init__(self, checkpoint: Checkpoint) -> None:
        self.checkpoint, self.config = checkpoint, checkpoint.config
        self._names = checkpoint.tensor_names()
        self._loaded: dict[Path, dict[str, Any]] = {}
        self._shapes = _port_shapes(checkpoint.config)

    def tensor(self, name: str) -> np.ndarray:
        source = self._names[name]
        path = (self.checkpoint.index or {}).get(source, self.checkpoint.files[0])
        if path.suffix == ".safetensors":
            from safetensors import safe_open

            with safe_open(str(path), framework="paddle") as f:
                value = _rows_float32(f.get_slice(source))
        else:
            if path not in self._loaded:
                import paddle

                self._loaded = {path: paddle.load(str(path))}  # one pickled file held at a time
                if self.checkpoint.index is None:
                    check_names(self.checkpoint, set(self._loaded[path]))
            value = _float32(self._loaded[path][source])
        if list(value.shape) != self._shapes[name]:
            raise DataError(f"{source} is {list(value.shape)} in {self.checkpoint.directory}; its config.json makes "
                            f"it {self._shapes[name]} (Paddle's [in, out] for a linear): is the config the "
                            "checkpoint's?")
        return value


#: Elements converted to float32 at a time when a stored tensor is read (bounds the copies beside the result).
READ_CHUNK = 1 << 24


def _rows_float32(stored: Any) -> np.ndarray:
    """A safetensors slice (``safe_open(...).get_slice``) in float32, converted a block of rows at a time."""
    shape = list(stored.get_shape())
    out = np.empty(shape, np.float32)
    if not shape:
        return _float32(stored[:]).reshape(())
    step = max(1, READ_CHUNK // max(1, int(np.prod(shape[1:]))))
    for lo in range(0, shape[0], step):
        out[lo: lo + step] = _float32(stored[lo: lo + step])
    return out


def _port_shapes(cfg: DecoderConfig) -> dict[str, list[int]]:
    """Every port parameter's shape, from the hyper-parameters alone."""
    hidden, q, kv = cfg.hidden_size, cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    layer = {"input_norm.weight": [hidden], "post_norm.weight": [hidden], "attn.q_proj.weight": [hidden, q],
             "attn.k_proj.weight": [hidden, kv], "attn.v_proj.weight": [hidden, kv], "attn.o_proj.weight": [q, hidden],
             "mlp.gate_proj.weight": [hidden, cfg.intermediate_size],
             "mlp.up_proj.weight": [hidden, cfg.intermediate_size],
             "mlp.down_proj.weight": [cfg.intermediate_size, hidden],
             "attn.q_proj.bias": [q], "attn.k_proj.bias": [kv], "attn.v_proj.bias": [kv]}
    shapes = {"embed_tokens.weight": [cfg.vocab_size, hidden], "norm.weight": [hidden],
              "lm_head.weight": [hidden, cfg.vocab_size]}
    for i in range(cfg.num_layers):
        shapes.update({f"layers.{i}.{name}": shape for name, shape in layer.items()})
    return shapes


def read_state(checkpoint: Checkpoint) -> dict[str, np.ndarray]:
    """The port's parameters in float32 by its names (:class:`CheckpointSource`)."""
    source = CheckpointSource(checkpoint)
    return {name: source.tensor(name) for name in checkpoint.tensor_names()}


def checkpoint_tokenizer(checkpoint: Checkpoint, tokenizer: Any) -> TokenizerFiles:
    """The runtimes' tokenizer files: ``tokenizer.json`` as saved, ``tokenizer_config.json`` with its special tokens
    as plain strings (filled from ``config.json``'s ids where absent), and the ids generation needs."""
    raw, directory = checkpoint.raw, checkpoint.directory
    config = _json(directory / TOKENIZER_CONFIG) if (directory / TOKENIZER_CONFIG).is_file() else {}
    ids: dict[str, Any] = {}
    for kind in ("bos", "eos", "pad"):
        token = config.get(f"{kind}_token")
        if isinstance(token, dict):  # a serialized AddedToken
            token = config[f"{kind}_token"] = token.get("content")
        index = raw.get(f"{kind}_token_id")
        if index is None and token is not None:
            index = tokenizer.token_to_id(token)
        if token is None and isinstance(index, int):
            config[f"{kind}_token"] = tokenizer.id_to_token(index)
        ids[kind] = index
    if ids["eos"] is None:
        raise ConfigError(f"{directory} names no end-of-sequence token (config.json eos_token_id, or eos_token in "
                          f"{TOKENIZER_CONFIG}); add one so generation can stop")
    config.setdefault("tokenizer_class", "PreTrainedTokenizerFast")
    text = (directory / TOKENIZER).read_text(encoding="utf-8")
    return TokenizerFiles(text, config, ids["bos"], ids["eos"], ids["pad"])


def load_checkpoint(directory: str | os.PathLike[str]) -> tuple[Any, Any, TokenizerFiles]:
    """The decoder of a PaddleNLP checkpoint directory in float32 (:class:`.llama.Llama`), its tokenizer
    (``tokenizers.Tokenizer``) and the tokenizer files for the runtimes' folders."""
    from tokenizers import Tokenizer

    from .common import load_state
    from .llama import Llama

    checkpoint = open_checkpoint(directory)
    model = Llama(checkpoint.config)
    load_state(model, read_state(checkpoint))
    tokenizer = Tokenizer.from_file(str(checkpoint.directory / TOKENIZER))
    return model, tokenizer, checkpoint_tokenizer(checkpoint, tokenizer)
