"""Packed embedding tables in paddle.inference: size, lookup latency against the float lookup, output error.

A recommender-style table (nothing real of this kind ships in a wheel): 1,000,000 x 64 fp32 rows whose
norms are log-normal (a few hot rows of large norm), looked up with Zipf(1.1)-distributed ids as real
feature ids are, 32 samples x 20 ids per batch, mean-pooled (a bag of features). The model is
``ids -> embedding -> mean over the bag``, saved as a PIR program and as a legacy one, quantized by
``qembed.quant_embedding_model`` per scheme, each scheme also with the compiled lookup (``fused_lookup``: one
``qembed_lookup`` op doing lookup, dequantization and the mean) where it loads (the platform wheel's, or
``python -m qembed.build_ext``'s; ``--fused on`` requires it, ``off`` leaves it out); the others pin
``fused_lookup=False`` (the op sequence). Per model: the file size, the
median latency of one batch in ``paddle.inference`` (qcore's default predictor: oneDNN, the int8 switch
on), every model's runs interleaved with the float model's in one loop, and the pooled output's error
against float over 100 Zipf batches (relative L2 and cosine).

    python benchmarks/embed_lookup.py [--rows 1000000] [--repeats 2000] [--fused auto|on|off] [--onnx RUNTIMES]

Writes ``benchmarks/results/embed_lookup.md`` (atomically).
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np

from qcore.deploy.host import describe_cpu

RESULTS = Path(__file__).parent / "results"
DIM, BATCH, BAG = 64, 32, 20
SCHEMES = {  # name -> quant_embedding config; None: the float model
    "float": None,
    "int8, per-row": {"per_row": True},
    "int4, per-row, packed": {"quantize_bits": 4, "per_row": True, "asymmetric": False},
    "int4, per-row + offsets, packed": {"quantize_bits": 4, "per_row": True, "asymmetric": True},
    "int2, per-row + offsets, packed": {"quantize_bits": 2, "per_row": True, "asymmetric": True},
}


def fused_build() -> str:
    """Which ``qembed_lookup`` library ran (the wheel's or this machine's build) and its code path."""
    from qembed import ext

    return f"`{ext.loaded()}`, {ext.isa()} code path" if ext.loaded() else "not loaded"


def with_fused(configs: dict[str, dict | None], fused: str) -> dict[str, dict | None]:
    """``configs`` (name -> quant_embedding config, None: float) read by the op sequence, each quantized one also
    by the compiled lookup when ``fused`` is "on", or "auto" and it loads."""
    from qembed import ext

    sequence = {name: None if config is None else {**config, "fused_lookup": False} for name, config in configs.items()}
    if fused == "on":
        ext.require()
    elif fused == "off" or not ext.load():
        return sequence
    return {**sequence, **{f"{name}, fused": {**config, "fused_lookup": True}
                           for name, config in configs.items() if config is not None}}


def recommender_table(rows: int, rng: np.random.Generator) -> np.ndarray:
    norms = rng.lognormal(mean=-2.0, sigma=0.6, size=(rows, 1))
    return (rng.standard_normal((rows, DIM)) * norms / np.sqrt(DIM)).astype(np.float32)


def zipf_ids(rows: int, n: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` batches of ``BATCH x BAG`` ids: Zipf(1.1) ranks over a random permutation of the rows."""
    ranks = rng.zipf(1.1, size=(n, BATCH, BAG)) - 1
    perm = rng.permutation(rows)
    return perm[np.minimum(ranks, rows - 1)].astype(np.int64)


def save_float_model(table: np.ndarray, directory: Path, family: str) -> None:
    import paddle

    from qcore.paddle_env import static_mode

    scope = paddle.static.Scope()
    with static_mode(family, scope):
        main, startup = paddle.static.Program(), paddle.static.Program()
        with paddle.static.program_guard(main, startup):
            ids = paddle.static.data("ids", [-1, BAG], "int64")
            weight = paddle.static.create_parameter(list(table.shape), "float32", name="table")
            pooled = paddle.mean(paddle.nn.functional.embedding(ids, weight), axis=1)  # paddle.sum fails on legacy
        exe = paddle.static.Executor(paddle.CPUPlace())
        exe.run(startup)
        scope.var("table").get_tensor().set(table, paddle.CPUPlace())
        paddle.static.save_inference_model(str(directory / "inference"), [ids], [pooled], exe, program=main)


def file_bytes(files) -> int:  # noqa: ANN001 - ModelFiles or an .onnx path
    if isinstance(files, Path):
        return files.stat().st_size
    return sum(p.stat().st_size for p in files.directory.iterdir() if p.is_file())


def scored(family: str, runtime: str, files: dict, predictors: dict, batches: np.ndarray, repeats: int
           ) -> list[tuple]:
    """Per model on one runtime: size, median latency of one batch (every model's runs interleaved with the float
    model's), ratio to float, and the pooled output's error against float over ``batches``."""
    from qcore.inference import run_predictor
    from qcore.scoring import interleaved_latency

    reference = [run_predictor(predictors["float"], {"ids": b})[0] for b in batches]
    ms = interleaved_latency(predictors, {"ids": batches[0]}, repeats=repeats, warmup=20)
    rows = []
    for name, f in files.items():
        got = [run_predictor(predictors[name], {"ids": b})[0] for b in batches]
        ref, out = np.concatenate(reference).ravel(), np.concatenate(got).ravel()
        rel = float(np.linalg.norm(out - ref) / np.linalg.norm(ref))
        per_sample = [np.sum(a * b, -1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1))
                      for a, b in zip(reference, got)]
        cos = float(np.mean(np.concatenate(per_sample)))
        size = file_bytes(f)
        rows.append((family, runtime, name, size, ms[name], ms[name] / ms["float"], rel, cos))
        print(family, runtime, name, f"{size / 2**20:.1f} MiB", f"{ms[name]:.3f} ms",
              f"{ms[name] / ms['float']:.2f}x", f"rel {rel:.4f} cos {cos:.5f}", flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=2000, help="interleaved rounds (one run of every model)")
    parser.add_argument("--fused", choices=["auto", "on", "off"], default="auto",
                        help="also the schemes with the compiled lookup (auto: where it loads)")
    parser.add_argument("--onnx", default="onnxruntime,openvino-runtime",
                        help="also each scheme exported for these ONNX runtimes (comma list; empty: none)")
    args = parser.parse_args()
    variants = with_fused(SCHEMES, args.fused)
    import paddle

    from qcore.export import export_onnx
    from qcore.inference import create_predictor
    from qcore.model_io import find_model_files
    from qcore.outputs import write_bytes
    from qembed import quant_embedding_model

    rng = np.random.default_rng(0)
    table = recommender_table(args.rows, rng)
    batches = zipf_ids(args.rows, 100, rng)
    rows_out = []
    with tempfile.TemporaryDirectory() as tmp:
        for family in ("pir", "legacy"):
            float_dir = Path(tmp) / family / "float"
            float_dir.mkdir(parents=True)
            save_float_model(table, float_dir, family)
            files = {}
            for name, config in variants.items():
                if config is None:
                    files[name] = find_model_files(float_dir)
                    continue
                out, _ = quant_embedding_model(float_dir, Path(tmp) / family / name.replace(" ", "_"), config)
                files[name] = out
            rows_out += scored(family, "paddle.inference", files, {n: create_predictor(f) for n, f in files.items()},
                               batches, args.repeats)
            for runtime in args.onnx.split(",") if args.onnx else []:  # the same tables in the runtime's form
                onnx_files = {n: export_onnx(f, Path(tmp) / family / f"{n.replace(' ', '_')}.{runtime}.onnx",
                                             runtime=runtime)
                              for n, f in files.items() if not n.endswith("fused")}
                rows_out += scored(family, runtime, onnx_files,
                                   {n: create_predictor(f, backend=runtime) for n, f in onnx_files.items()},
                                   batches, args.repeats)
    float_size = {(fam, rt): s for fam, rt, n, s, *_ in rows_out if n == "float"}
    lines = [
        "# Packed embedding tables: size, lookup latency, output error (paddle.inference, ONNX Runtime, OpenVINO)",
        "",
        f"Table: {args.rows:,} x {DIM} fp32, rows of log-normal norm; ids Zipf(1.1) over the rows, batch {BATCH} "
        f"x {BAG} ids, mean-pooled. Model `ids -> embedding -> mean`, saved as PIR and as legacy, quantized by "
        f"`quant_embedding_model`. Latency: median of {args.repeats} interleaved runs of one batch per model "
        "(paddle.inference: qcore's default predictor, oneDNN with the int8 switch, 2 threads; the ONNX runtimes: "
        "each model exported by `qcore.export.export_onnx(..., runtime=...)`, tables in that runtime's quantized "
        "form, interleaved with the float export on the same runtime, 2 threads, OpenVINO at its default "
        "precision). Error: pooled outputs against float "
        f"over 100 Zipf batches. `, fused`: the compiled `qembed_lookup` op ({fused_build()}) does lookup, "
        f"dequantization and the mean in one op. Machine: {describe_cpu()}, Paddle "
        f"{paddle.__version__}. Produced by `benchmarks/embed_lookup.py`.",
        "",
        "| IR | runtime | scheme | MiB on disk | x float | latency (ms) | x float lookup | output rel. L2 | "
        "output cosine |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for family, runtime, name, size, ms_, ratio, rel, cos in rows_out:
        lines.append(f"| {family} | {runtime} | {name} | {size / 2**20:.1f} | "
                     f"{size / float_size[family, runtime]:.3f} | {ms_:.3f} | {ratio:.2f} | {rel:.4f} | {cos:.5f} |")
    RESULTS.mkdir(exist_ok=True)
    write_bytes(RESULTS / "embed_lookup.md", ("\n".join(lines) + "\n").encode())
    print("\n".join(lines))


if __name__ == "__main__":
    main()
