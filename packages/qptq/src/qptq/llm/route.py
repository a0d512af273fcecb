"""One call from an LLM checkpoint to a quantized file a runtime generates with: :func:`quantize_llm`.

The source is a GGUF file of a supported architecture (:data:`LOADERS`) or a PaddleNLP checkpoint directory of
Llama, Mistral or Qwen2 (:mod:`.paddlenlp`); calibration is token ids (an array or windows) or plain text, cut into
windows with the source's own tokenizer. The decoder is read in float32 (:mod:`.gguf_weights`, :mod:`.paddlenlp`),
its linears (and, with ``embedding_bits``, its table) quantized in place by
:func:`qptq.weight_only.quantize_`, and written in ``format``:

* ``"gguf"``: llama.cpp's file (:mod:`.gguf_export`), codes chosen on its block grids (``grid="gguf"``,
  ``group_size=32``), metadata and tokenizer from the source. Verified by reading the written file back with the
  ``gguf`` package and comparing every tensor with the simulation (bit-exact), and, where ``llama-cpp-python`` is
  installed, llama.cpp's logits against the simulation's on a calibration window. GGUF sources only: the file's
  metadata and tokenizer are copied from the source, which a PaddleNLP checkpoint does not have (convert it with
  llama.cpp's ``convert_hf_to_gguf.py`` first, or write one of the two folders).
* ``"openvino-genai"``: an OpenVINO GenAI folder (:mod:`.genai_folders`): the stateful model :mod:`.openvino_graph`
  writes (codes as compressed ``u4`` / ``u8`` constants, the KV cache as state) and the tokenizer IRs. Verified by
  the IR's logits in the OpenVINO runtime (its default precision: bf16 where the CPU has it) against the
  simulation's.
* ``"onnxruntime-genai"``: an ONNX Runtime GenAI folder (:mod:`.genai_folders`): the graph :mod:`.ort_graph`
  writes (``MatMulNBits`` on the ``"int"`` grids, ``GroupQueryAttention``), ``genai_config.json``, the tokenizer.
  Verified by the logits of ``onnxruntime_genai`` (where installed, else ONNX Runtime's session on the same file)
  against the simulation's on a calibration window.

Every problem with the input is one :class:`~qcore.errors.ConfigError` line before any work.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from qcore.errors import ConfigError, DataError
from qcore.outputs import check_output_dir, check_output_file

from ..progress import Progress, progress
from ..weight_only.config import WeightOnlyConfig
from ..weight_only.layer import quantize_
from ..weight_only.plan import WeightOnlyResult
from . import gemma3, llama, paddlenlp
from .genai_folders import TokenizerFiles, tokenizer_files

#: Formats :func:`quantize_llm` writes: the suffix the output must have ("" for a folder) and the grid family.
LLM_FORMATS = {"gguf": (".gguf", "gguf"), "onnxruntime-genai": ("", "int"), "openvino-genai": ("", "int")}
#: The least share of positions whose top token the runtime and the simulation must agree on.
MIN_AGREEMENT = 0.9
#: Tokens per calibration window cut from text, and the most windows taken.
WINDOW, WINDOWS = 256, 32
#: What the runtime's logits are checked on when no calibration data was given (plain prose: the positions of
#: ids a tokenizer never makes from text, e.g. special tokens, say little about a model's use).
PROBE_TEXT = ("The river runs past the old mill, where the miller keeps his books and counts the sacks of grain "
              "each evening. In spring the water rises, and the children of the village watch the wheel turn "
              "faster than it did all winter. Nobody remembers who built the mill, but everyone knows its sound.")


#: Readers of the decoders of :mod:`qptq.llm` by GGUF ``general.architecture``.
LOADERS: dict[str, Callable[[Path], tuple[Any, Any]]] = {"llama": llama.load_gguf, "gemma3": gemma3.load_gguf}


@dataclass
class LlmReport:
    """What :func:`quantize_llm` wrote and how it checked it."""

    output: Path
    format: str
    architecture: str
    file_bytes: int
    float_bytes: int  # the decoder's parameters in float32
    result: WeightOnlyResult
    verified: dict[str, Any] = field(default_factory=dict)

    def formats(self) -> dict[str, int]:
        """Weights per grid (block type), e.g. ``{"Q4_0": ..., "Q8_0": ...}``."""
        counts: dict[str, int] = {}
        for layer in self.result.layers:
            counts[layer.grid] = counts.get(layer.grid, 0) + layer.shape[0] * layer.shape[1]
        return counts


def source_architecture(source: str | os.PathLike[str]) -> str:
    """The ``general.architecture`` of a GGUF file, or the family of a PaddleNLP checkpoint directory
    (:func:`.paddlenlp.open_checkpoint`); one line when it is not a readable source of a supported one."""
    from qcore.export.gguf import require_gguf

    path = Path(source)
    if path.is_dir():
        return paddlenlp.open_checkpoint(path).family
    if not path.is_file():
        raise ConfigError(f"{path}: no such file or directory; give a GGUF checkpoint (.gguf) or a PaddleNLP "
                          "checkpoint directory")
    gguf = require_gguf()
    try:
        arch = gguf.GGUFReader(str(path)).fields["general.architecture"].contents()
    except Exception as exc:  # noqa: BLE001 - any reader failure is the same answer: not a GGUF we can read
        raise ConfigError(f"{path} is not a readable GGUF file ({exc}); give a llama.cpp .gguf checkpoint") from None
    if arch not in LOADERS:
        raise ConfigError(f"{path} holds a {arch!r} model; the decoders read here are {sorted(LOADERS)}")
    return arch


def calibration_windows(data: str | os.PathLike[str] | np.ndarray | Sequence[Sequence[int]], tokenizer: Any,
                        length: int = WINDOW, count: int = WINDOWS) -> list[np.ndarray]:
    """``[1, length]`` int64 windows: from a text file (``.txt``, tokenized with ``tokenizer``), a ``.npy`` of
    token ids, or ids given directly: ``[n]`` ids are cut into at most ``count`` windows of ``length``,
    ``[windows, any length]`` ids are taken as they are."""
    from .common import token_windows

    if isinstance(data, (str, os.PathLike)):
        path = Path(data)
        if not path.is_file():
            raise DataError(f"calibration data {path}: no such file; give a .txt of text or a .npy of token ids")
        if path.suffix == ".npy":
            ids = np.load(path)
        else:
            ids = np.asarray(tokenizer.encode(path.read_text(encoding="utf-8")).ids, np.int64)
    else:
        ids = np.asarray(data, np.int64)
    if ids.ndim == 1:
        fit = len(ids) // length
        if fit == 0:
            raise DataError(f"the calibration data has {len(ids)} tokens, fewer than one window of {length}; "
                            "give more text")
        ids = token_windows(ids, length, min(fit, count))
    if ids.ndim != 2 or not np.issubdtype(ids.dtype, np.integer):
        raise DataError(f"calibration token ids have shape {ids.shape}; give [tokens] or [windows, length] ints")
    return [w[None] for w in ids]


def _check(source: Path, out: Path, config: WeightOnlyConfig, format: str, calibration: Any) -> str:
    if config.calibrated and calibration is None:
        raise ConfigError(f"algo={config.algo!r}{', clip_search' if config.clip_search else ''} needs calibration "
                          "data: give a .txt of text or a .npy of token ids (--data), or use algo='rtn'")
    if isinstance(calibration, (str, os.PathLike)) and not Path(calibration).is_file():
        raise DataError(f"calibration data {calibration}: no such file; give a .txt of text or a .npy of token ids")
    if format not in LLM_FORMATS:
        raise ConfigError(f"format={format!r} is not written; use one of {sorted(LLM_FORMATS)}")
    suffix, grid = LLM_FORMATS[format]
    if suffix and out.suffix != suffix:
        raise ConfigError(f"the {format} output {out} must end with {suffix}")
    if config.grid != grid:
        raise ConfigError(f"format={format!r} stores codes on the {grid!r} grids: quantize with "
                          f"WeightOnlyConfig(grid={grid!r}{', group_size=32' if grid == 'gguf' else ''})")
    arch = source_architecture(source)
    if format == "gguf" and source.is_dir():
        raise ConfigError(f"format='gguf' copies its metadata and tokenizer from a GGUF source; {source} is a "
                          "PaddleNLP checkpoint: write format='onnxruntime-genai' or 'openvino-genai', or convert it "
                          "with llama.cpp's convert_hf_to_gguf.py first")
    if suffix:
        check_output_file(out, "output")
    else:
        check_output_dir(out, [source])
    if out.resolve() == source.resolve():
        raise ConfigError(f"the output {out} is the input model; write to another file")
    return arch


def quantize_llm(source: str | os.PathLike[str], out: str | os.PathLike[str], config: WeightOnlyConfig,
                 calibration: Any = None, *, format: str = "gguf", show_progress: bool = False) -> LlmReport:
    """Quantize the decoder in ``source`` (a GGUF file or a PaddleNLP checkpoint directory) as ``config`` says and
    write ``out`` in ``format`` (:data:`LLM_FORMATS`); ``calibration``: text file, ``.npy`` of ids or ids
    (:func:`calibration_windows`), needed by GPTQ and clip search. Returns the report, verification included."""
    source, out = Path(source), Path(out)
    arch = _check(source, out, config, format, calibration)
    model, tokenizer, files = read_source(source, arch)
    float_bytes = sum(4 * int(np.prod(p.shape)) for p in model.parameters())
    windows = None if calibration is None else calibration_windows(calibration, tokenizer)
    batches: Iterable[np.ndarray] | None = windows
    if show_progress and windows is not None:
        batches = progress(windows, "calibrating", "window")
    import paddle

    linears = sum(isinstance(layer, paddle.nn.Linear) for _, layer in model.named_sublayers())
    counter = Progress("quantizing weights", "linear", total=linears) if show_progress else None
    try:
        result = quantize_(model, config, batches, progress=counter.step if counter else None)
    finally:
        if counter is not None:
            counter.close()
    window = windows[0] if windows else np.asarray(tokenizer.encode(PROBE_TEXT).ids, np.int64)[None]
    if format == "gguf":
        from .gguf_export import save_gguf

        written = save_gguf(model, result, source, out)
        verified = verify_gguf(written, model, window)
        size = written.stat().st_size
    else:
        from .genai_folders import save_openvino_genai, save_ortgenai

        save, verify = ((save_ortgenai, verify_ortgenai) if format == "onnxruntime-genai"
                        else (save_openvino_genai, verify_openvino_genai))
        written = save(model, result, files, out)
        verified = verify(written, model, window)
        size = sum(p.stat().st_size for p in written.iterdir() if p.is_file())
    return LlmReport(written, format, arch, size, float_bytes, result, verified)


def read_source(source: Path, arch: str) -> tuple[Any, Any, TokenizerFiles]:
    """The float32 decoder of ``source`` (architecture ``arch``), its tokenizer and the tokenizer files of the
    runtimes' folders."""
    if source.is_dir():
        return paddlenlp.load_checkpoint(source)
    from .gguf_weights import read_metadata

    model, tokenizer = LOADERS[arch](source)
    return model, tokenizer, tokenizer_files(tokenizer, read_metadata(source))


def verify_gguf(path: Path, model: Any, window: np.ndarray) -> dict[str, Any]:
    """Read ``path`` back (the ``gguf`` package's reader) and compare every tensor with ``model``'s simulated
    parameters; with ``llama-cpp-python`` installed, llama.cpp's logits of ``window`` with the model's.
    Raises :class:`~qcore.errors.DataError` when the file does not hold the simulation."""
    import importlib.util

    from .gguf_export import gguf_table
    from .gguf_weights import read_gguf

    back = read_gguf(path).tensors
    state = model.state_dict()
    worst = 0.0
    for name, where in gguf_table(model).items():
        diff = np.abs(where.to_paddle(back[where.name]) - state[name].numpy()).max()
        worst = max(worst, float(diff))
    if worst != 0.0:
        raise DataError(f"{path} does not hold the simulated weights (largest difference {worst:g}); please report")
    verified: dict[str, Any] = {"gguf_reader": "every tensor equals the simulation"}
    if importlib.util.find_spec("llama_cpp") is None:
        verified["llama.cpp"] = "not run (install llama-cpp-python)"
        return verified
    verified["llama.cpp"] = llama_cpp_agreement(path, model, window[:, :64])
    return verified


def verify_ortgenai(folder: Path, model: Any, window: np.ndarray) -> dict[str, Any]:
    """The logits of ``window`` (a calibration window, or :data:`PROBE_TEXT`) from the folder, run by
    ``onnxruntime_genai`` where it is installed (else by ONNX Runtime's session on ``model.onnx``), against
    ``model``'s."""
    import importlib.util

    ids = window[:, :64]
    if importlib.util.find_spec("onnxruntime_genai") is not None:
        import onnxruntime_genai as og

        genai_model = og.Model(str(folder))
        generator = og.Generator(genai_model, og.GeneratorParams(genai_model))
        generator.append_tokens(ids[0].tolist())
        theirs, runner = np.asarray(generator.get_output("logits"))[0], "onnxruntime-genai"
    else:
        import onnxruntime as ort

        cfg = model.cfg
        session = ort.InferenceSession(str(folder / "model.onnx"), providers=["CPUExecutionProvider"])
        empty = np.zeros((1, cfg.num_kv_heads, 0, cfg.head_dim), np.float32)
        feed = {i.name: empty for i in session.get_inputs() if i.name.startswith("past_")}
        feed.update(input_ids=ids, attention_mask=np.ones_like(ids))
        theirs, runner = session.run(["logits"], feed)[0][0], "onnxruntime (session)"
    return {runner: agreement(theirs, model, ids)}


def verify_openvino_genai(folder: Path, model: Any, window: np.ndarray) -> dict[str, Any]:
    """The logits of ``window`` (a calibration window, or :data:`PROBE_TEXT`) from the folder's stateful IR in the
    OpenVINO runtime (fed as ``LLMPipeline`` feeds it: mask, positions, ``beam_idx``) against ``model``'s."""
    import openvino as ov

    from qcore.export.openvino_genai import MODEL_XML

    ids = window[:, :64]
    request = ov.Core().compile_model(str(folder / MODEL_XML), "CPU").create_infer_request()
    request.reset_state()
    length = ids.shape[1]
    feed = {"input_ids": ids, "attention_mask": np.ones((1, length), np.int64),
            "position_ids": np.arange(length, dtype=np.int64)[None], "beam_idx": np.zeros(1, np.int32)}
    theirs = request.infer(feed)["logits"][0]
    return {"openvino (stateful IR)": agreement(np.asarray(theirs, np.float32), model, ids)}


def agreement(theirs: np.ndarray, model: Any, ids: np.ndarray) -> dict[str, float]:
    """A runtime's logits of ``ids`` (``[1, T]``; ``theirs`` ``[T, vocab]``) against ``model``'s simulation: the
    largest difference relative to the logits' spread, and the share of positions whose top token agrees."""
    import paddle

    with paddle.no_grad():
        ours = model(paddle.to_tensor(ids))[0].numpy()[0]
    return {"max_abs_diff_over_std": float(np.abs(theirs - ours).max() / ours.std()),
            "top1_agreement": float(np.mean(theirs.argmax(-1) == ours.argmax(-1)))}


def llama_cpp_logits(path: str | os.PathLike[str], ids: np.ndarray) -> np.ndarray:
    """llama.cpp's logits (``[T, vocab]`` float32) of ``ids`` (``[1, T]``) from the GGUF file ``path``."""
    import llama_cpp

    llm = llama_cpp.Llama(str(path), n_ctx=max(64, ids.shape[1]), n_threads=os.cpu_count() or 1,
                          logits_all=True, verbose=False)
    llm.eval([int(i) for i in ids[0]])
    return np.asarray(llm.scores[: ids.shape[1]], np.float32)


def llama_cpp_agreement(path: Path, model: Any, ids: np.ndarray) -> dict[str, float]:
    """llama.cpp's logits of ``ids`` (``[1, T]``) from ``path`` against ``model``'s (:func:`agreement`)."""
    return agreement(llama_cpp_logits(path, ids), model, ids)
