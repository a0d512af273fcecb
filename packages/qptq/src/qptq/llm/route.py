"""One call from an LLM checkpoint to a quantized file a runtime generates with: :func:`quantize_llm`.

The source is a GGUF file of a supported architecture (:data:`LOADERS`) or a PaddleNLP checkpoint directory of
Llama, Mistral or Qwen2 (:mod:`.paddlenlp`); calibration is token ids (an array or windows) or plain text, cut into
windows with the source's own tokenizer. The decoder is read, calibrated and quantized one layer at a time
(:mod:`.streaming`, from :mod:`.sources`: memory holds one layer, the calibration hidden states and the codes),
its linears (and, with ``embedding_bits``, its table) coded as :func:`qptq.weight_only.quantize_` would on the whole
model, and written in ``format``:

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
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from qcore.errors import ConfigError, DataError
from qcore.outputs import check_output_dir, check_output_file

from ..progress import Progress
from ..weight_only.config import WeightOnlyConfig
from ..weight_only.plan import WeightOnlyResult
from . import gemma3, llama, paddlenlp
from .genai_folders import TokenizerFiles, tokenizer_files

#: Formats :func:`quantize_llm` writes: the suffix the output must have ("" for a folder) and the grid family.
LLM_FORMATS = {"gguf": (".gguf", "gguf"), "onnxruntime-genai": ("", "int"), "openvino-genai": ("", "int")}
#: The least share of positions whose top token the runtime and the simulation must agree on.
MIN_AGREEMENT = 0.9
#: Tokens of the window a runtime's logits are checked on.
PROBE = 64
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
    (:func:`calibration_windows`), needed by GPTQ and clip search. Returns the report, verification included.

    The decoder is read and quantized one layer at a time (:func:`.streaming.quantize_streaming`). Under
    ``paddle.distributed`` (several initialised ranks) each rank calibrates on its share of the windows, the
    Hessians are summed exactly, and rank 0 writes the same bytes one process would.
    """
    from qcore.distributed import on_rank0, world

    from .sources import open_source
    from .streaming import quantize_streaming

    source, out = Path(source), Path(out)
    arch = _check(source, out, config, format, calibration)
    tensors = open_source(source)
    tokenizer, files = read_tokenizer(source)
    windows = None if calibration is None else calibration_windows(calibration, tokenizer)
    rank, size = world()
    if windows is not None and len(windows) < size:
        raise DataError(f"{len(windows)} calibration windows for {size} ranks; give at least one window a rank")
    probe = (windows[0] if windows else np.asarray(tokenizer.encode(PROBE_TEXT).ids, np.int64)[None])[:, :PROBE]
    cfg = tensors.config
    shown = show_progress and rank == 0
    layers = Progress("quantizing layers", "layer", total=cfg.num_layers) if shown else None
    start = time.perf_counter()
    try:
        done = quantize_streaming(tensors, config, None if windows is None else windows[rank::size], probe,
                                  on_layer=layers.step if layers else None, spill_to=_existing_parent(out))
    finally:
        if layers is not None:
            layers.close()
    done.result.seconds = time.perf_counter() - start
    model, result = done.model, done.result
    coded = {f"{layer.name}.weight": layer.shape for layer in result.layers}
    float_bytes = 4 * (sum(v.size for v in model.state.values())
                       + sum(int(np.prod(shape)) for name, shape in coded.items() if name not in model.state))

    def write() -> tuple[Path, dict[str, Any], int]:
        if format == "gguf":
            from .gguf_export import save_gguf

            written = save_gguf(model, result, source, out)
            return written, verify_gguf(written, model, result, probe, done.probe_logits), written.stat().st_size
        from .genai_folders import save_openvino_genai, save_ortgenai

        save, verify = ((save_ortgenai, verify_ortgenai) if format == "onnxruntime-genai"
                        else (save_openvino_genai, verify_openvino_genai))
        written = save(model, result, files, out)
        model.state.clear()  # the float parameters: written, and the check runs the folder, not them
        size = sum(p.stat().st_size for p in written.iterdir() if p.is_file())
        return written, verify(written, probe, done.probe_logits, cfg), size

    written, verified, size = on_rank0(write, str(out))
    return LlmReport(written, format, arch, size, float_bytes, result, verified)


def _existing_parent(path: Path) -> Path:
    """The nearest directory above ``path`` that exists (the output's parent may not yet)."""
    parent = path.resolve().parent
    while not parent.is_dir():
        parent = parent.parent
    return parent


def read_tokenizer(source: Path) -> tuple[Any, TokenizerFiles]:
    """The tokenizer of a GGUF file or PaddleNLP checkpoint directory, and the tokenizer files of the runtimes'
    folders (no weights are read)."""
    if source.is_dir():
        from tokenizers import Tokenizer

        checkpoint = paddlenlp.open_checkpoint(source)
        tokenizer = Tokenizer.from_file(str(source / paddlenlp.TOKENIZER))
        return tokenizer, paddlenlp.checkpoint_tokenizer(checkpoint, tokenizer)
    from .gguf_weights import read_metadata, tokenizer_from_metadata

    metadata = read_metadata(source)
    tokenizer = tokenizer_from_metadata(metadata)
    return tokenizer, tokenizer_files(tokenizer, metadata)


def verify_gguf(path: Path, model: Any, result: WeightOnlyResult, ids: np.ndarray, reference: np.ndarray
                ) -> dict[str, Any]:
    """Read ``path`` back (the ``gguf`` package's reader, a tensor at a time) and compare every tensor with the
    simulation (``result``'s codes dequantized, ``model``'s float parameters); with ``llama-cpp-python``
    installed, llama.cpp's logits of ``ids`` with the simulation's (``reference``). Raises
    :class:`~qcore.errors.DataError` when the file does not hold the simulation."""
    import importlib.util

    from gguf import GGUFReader

    from .gguf_export import gguf_table
    from .gguf_weights import dequantized

    back = {t.name: t for t in GGUFReader(str(path)).tensors}
    codes = {f"{layer.name}.weight": result.codes[layer.weight] for layer in result.layers}
    state = model.state_dict()
    worst = 0.0
    for name, where in gguf_table(model).items():
        simulated = codes[name].dequantize() if name in codes else np.asarray(state[name], np.float32)
        if name in codes and name in state:  # a quantized table: its rows are the codes' columns
            simulated = simulated.T
        worst = max(worst, float(np.abs(where.to_paddle(dequantized(back[where.name])) - simulated).max()))
    if worst != 0.0:
        raise DataError(f"{path} does not hold the simulated weights (largest difference {worst:g}); please report")
    verified: dict[str, Any] = {"gguf_reader": "every tensor equals the simulation"}
    if importlib.util.find_spec("llama_cpp") is None:
        verified["llama.cpp"] = "not run (install llama-cpp-python)"
        return verified
    verified["llama.cpp"] = llama_cpp_agreement(path, ids, reference)
    return verified


def verify_ortgenai(folder: Path, ids: np.ndarray, reference: np.ndarray, cfg: Any) -> dict[str, Any]:
    """The logits of ``ids`` (``[1, T]``: a calibration window's start, or :data:`PROBE_TEXT`) from the folder, run
    by ``onnxruntime_genai`` where it is installed (else by ONNX Runtime's session on ``model.onnx``), against the
    simulation's (``reference``)."""
    import importlib.util

    if importlib.util.find_spec("onnxruntime_genai") is not None:
        import onnxruntime_genai as og

        genai_model = og.Model(str(folder))
        generator = og.Generator(genai_model, og.GeneratorParams(genai_model))
        generator.append_tokens(ids[0].tolist())
        theirs, runner = np.asarray(generator.get_output("logits"))[0], "onnxruntime-genai"
    else:
        import onnxruntime as ort

        session = ort.InferenceSession(str(folder / "model.onnx"), providers=["CPUExecutionProvider"])
        empty = np.zeros((1, cfg.num_kv_heads, 0, cfg.head_dim), np.float32)
        feed = {i.name: empty for i in session.get_inputs() if i.name.startswith("past_")}
        feed.update(input_ids=ids, attention_mask=np.ones_like(ids))
        theirs, runner = session.run(["logits"], feed)[0][0], "onnxruntime (session)"
    return {runner: agreement(theirs, reference)}


def verify_openvino_genai(folder: Path, ids: np.ndarray, reference: np.ndarray, cfg: Any) -> dict[str, Any]:
    """The logits of ``ids`` from the folder's stateful IR in the OpenVINO runtime (fed as ``LLMPipeline`` feeds
    it: mask, positions, ``beam_idx``) against the simulation's (``reference``)."""
    import openvino as ov

    from qcore.export.openvino_genai import MODEL_XML

    request = ov.Core().compile_model(str(folder / MODEL_XML), "CPU").create_infer_request()
    request.reset_state()
    length = ids.shape[1]
    feed = {"input_ids": ids, "attention_mask": np.ones((1, length), np.int64),
            "position_ids": np.arange(length, dtype=np.int64)[None], "beam_idx": np.zeros(1, np.int32)}
    theirs = request.infer(feed)["logits"][0]
    return {"openvino (stateful IR)": agreement(np.asarray(theirs, np.float32), reference)}


def agreement(theirs: np.ndarray, ours: np.ndarray) -> dict[str, float]:
    """A runtime's logits (``[T, vocab]``) against the simulation's: the largest difference relative to the
    logits' spread, and the share of positions whose top token agrees."""
    return {"max_abs_diff_over_std": float(np.abs(theirs - ours).max() / ours.std()),
            "top1_agreement": float(np.mean(theirs.argmax(-1) == ours.argmax(-1)))}


def llama_cpp_logits(path: str | os.PathLike[str], ids: np.ndarray) -> np.ndarray:
    """llama.cpp's logits (``[T, vocab]`` float32) of ``ids`` (``[1, T]``) from the GGUF file ``path``."""
    import llama_cpp

    llm = llama_cpp.Llama(str(path), n_ctx=max(64, ids.shape[1]), n_threads=os.cpu_count() or 1,
                          logits_all=True, verbose=False)
    llm.eval([int(i) for i in ids[0]])
    return np.asarray(llm.scores[: ids.shape[1]], np.float32)


def llama_cpp_agreement(path: Path, ids: np.ndarray, reference: np.ndarray) -> dict[str, float]:
    """llama.cpp's logits of ``ids`` (``[1, T]``) from ``path`` against the simulation's (:func:`agreement`)."""
    return agreement(llama_cpp_logits(path, ids), reference)
