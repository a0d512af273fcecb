"""How weight-only LLM quantization scales with model size, memory and ranks: random-weight PaddleNLP checkpoints of
Qwen2.5's shapes (0.5B, 1.5B, 3B), quantized layer by layer to int4 GPTQ by ``quantize_llm`` (the route
``qcli ptq dynamic CKPT_DIR OUT --format ...`` runs) with a fixed calibration budget.

Per size and set-up: wall time of the call, split into calibration (running each layer over the calibration
windows: the range pass, the Hessian pass, the outputs) and quantization math (GPTQ, clip search), the rest
(reading, writing, the runtime's check); peak RSS (VmHWM) while quantizing and over the whole call, against the
issue's bound (2 GB + two decoder layers in float32 + the calibration hidden states); the bytes written, and
whether 2 ranks wrote the same bytes as 1 process. Set-ups: ``1 process, 1 thread``, ``1 process, 2 threads``,
``2 ranks, 1 thread each`` (``paddle.distributed.launch``: each rank has a core of its own). Then the fit
``calibration = a * tokens * parameters`` and ``math = b * sum(K^2 (N + K))`` over the linears, and what they
predict for an 8B Llama on a 16-core machine.

    python benchmarks/llm_scale.py --sizes 0.5b,1.5b --windows 64 --length 512 --work /tmp/llm-scale

Writes ``benchmarks/results/llm_scale.md``. Random weights: the time and memory of a real checkpoint of the same
shapes, not its accuracy (``benchmarks/llm_weight_only.py`` measures that).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from launch import worker_command  # noqa: E402
from peak_rss import peak_rss_mb  # noqa: E402

RESULTS = Path(__file__).parent / "results"
#: Qwen2.5's shapes: hidden, intermediate, layers, heads, KV heads, vocabulary (tied embedding); ``tiny``: a
#: check that the script runs.
SIZES = {"tiny": (256, 512, 2, 4, 2, 1024), "0.5b": (896, 4864, 24, 14, 2, 151936),
         "1.5b": (1536, 8960, 28, 12, 2, 151936), "3b": (2048, 11008, 36, 16, 2, 151936)}
#: Llama 3.1 8B's shapes (untied head), for the prediction.
LLAMA_8B = (4096, 14336, 32, 32, 8, 128256)
SETUPS = ("1 process, 1 thread", "1 process, 2 threads", "2 ranks, 1 thread each")
GB = 1 << 30


def linears(hidden: int, inter: int, layers: int, heads: int, kv: int, vocab: int) -> list[tuple[int, int]]:
    """``(K, N)`` of every quantized linear (the tied table is not a linear)."""
    head_dim = hidden // heads
    per_layer = [(hidden, heads * head_dim), (hidden, kv * head_dim), (hidden, kv * head_dim),
                 (heads * head_dim, hidden), (hidden, inter), (hidden, inter), (inter, hidden)]
    return per_layer * layers


def layer_parameters(shape: tuple[int, ...]) -> int:
    return sum(k * n for k, n in linears(*shape[:5], shape[5])) // shape[2]


def child(args: argparse.Namespace) -> None:
    """One process (or rank): quantize the checkpoint, write this rank's timings and peaks."""
    import paddle.distributed as dist

    import qptq.llm.route as route
    import qptq.llm.streaming as streaming
    from qptq.weight_only import WeightOnlyConfig

    if int(os.environ.get("PADDLE_TRAINERS_NUM", "1")) > 1:
        dist.init_parallel_env()
    rank = dist.get_rank() if dist.is_initialized() else 0
    inner = streaming.quantize_streaming
    streaming_peak: list[float] = []

    def peaked(*a: Any, **k: Any) -> Any:  # VmHWM once the last layer is done: the peak while quantizing
        out = inner(*a, **k)
        streaming_peak.append(peak_rss_mb())
        return out

    streaming.quantize_streaming = peaked
    written_peak: list[float] = []
    for name in ("verify_ortgenai", "verify_openvino_genai", "verify_gguf"):  # VmHWM once the output is written
        check = getattr(route, name)

        def checked(*a: Any, _check: Any = check, **k: Any) -> Any:
            written_peak.append(peak_rss_mb())
            return _check(*a, **k)

        setattr(route, name, checked)
    config = WeightOnlyConfig(bits=4, group_size=128, algo="gptq", clip_search=True, sequential=True)
    start = time.perf_counter()
    report = route.quantize_llm(args.checkpoint, args.out, config, args.ids, format=args.format)
    seconds = time.perf_counter() - start
    files = sorted(p for p in Path(args.out).rglob("*") if p.is_file())
    digest = hashlib.sha256(b"".join(p.name.encode() + p.read_bytes() for p in files)).hexdigest()
    Path(args.report).with_name(f"rank{rank}.json").write_text(json.dumps({
        "seconds": seconds, "calibration": report.result.calibration_seconds, "math": report.result.math_seconds,
        "streaming": report.result.seconds, "peak_quantizing_mb": streaming_peak[0],
        "peak_written_mb": written_peak[0] if written_peak else None, "peak_mb": peak_rss_mb(),
        "bytes": report.file_bytes, "digest": digest, "verified": report.verified}))


def checkpoint(work: Path, size: str) -> Path:
    from qdemo.testing import save_random_paddlenlp_checkpoint

    directory = work / f"qwen2-{size}"
    if not (directory / "model.safetensors.index.json").is_file():
        hidden, inter, layers, heads, kv, vocab = SIZES[size]
        print(f"writing a random {size} checkpoint to {directory}", flush=True)
        save_random_paddlenlp_checkpoint(directory, "qwen2", hidden, inter, layers, heads, kv, vocab)
    return directory


def run(setup: str, ckpt: Path, ids: Path, out: Path, fmt: str) -> dict[str, Any]:
    out.mkdir(parents=True, exist_ok=True)
    script = [str(Path(__file__).resolve()), "--child", "--checkpoint", str(ckpt), "--ids", str(ids),
              "--out", str(out / "model"), "--report", str(out / "rank0.json"), "--format", fmt]
    threads = "2" if setup == SETUPS[1] else "1"
    env = {**os.environ, "OMP_NUM_THREADS": threads, "OPENBLAS_NUM_THREADS": threads, "MKL_NUM_THREADS": threads}
    cmd = worker_command(script, 2 if setup == SETUPS[2] else 1, out / "logs")
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    job = time.perf_counter() - start
    if proc.returncode:
        logs = "".join(p.read_text()[-3000:] for p in sorted((out / "logs").glob("*")) if p.is_file()) \
            if (out / "logs").is_dir() else ""
        raise RuntimeError(f"{setup} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}\n{logs}")
    ranks = [json.loads(p.read_text()) for p in sorted(out.glob("rank*.json"))]
    first = ranks[0]
    return {**first, "job": job, "ranks": len(ranks), "peak_mb": max(r["peak_mb"] for r in ranks),
            "peak_quantizing_mb": max(r["peak_quantizing_mb"] for r in ranks),
            "peak_written_mb": max((r.get("peak_written_mb") or 0) for r in ranks) or None,
            "calibration": max(r["calibration"] for r in ranks), "math": max(r["math"] for r in ranks)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", default="0.5b,1.5b")
    parser.add_argument("--windows", type=int, default=64)
    parser.add_argument("--length", type=int, default=512)
    parser.add_argument("--format", default="onnxruntime-genai", choices=["onnxruntime-genai", "openvino-genai"])
    parser.add_argument("--setups", default="0,1,2",
                        help="which set-ups, by index: " + "; ".join(f"{i}: {s}" for i, s in enumerate(SETUPS)))
    parser.add_argument("--work", type=Path, default=Path("/tmp/llm-scale"))
    parser.add_argument("--out", type=Path, default=RESULTS / "llm_scale.md")
    parser.add_argument("--render", type=Path, help="write the page from a rows.jsonl of earlier runs, run nothing")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--checkpoint", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--ids", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--report", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        args.out = Path(args.out)
        child(args)
        return
    import numpy as np

    from qcore.outputs import write_bytes

    args.work.mkdir(parents=True, exist_ok=True)
    setups = [SETUPS[int(i)] for i in args.setups.split(",")]
    rows: list[dict[str, Any]] = []
    if args.render is not None:
        rows = [json.loads(line) for line in args.render.read_text().splitlines() if line.strip()]
        for r in rows:
            r["shape"] = tuple(r["shape"])
        args.windows, args.length = rows[0]["windows"], rows[0]["length"]
        args.sizes = ",".join(dict.fromkeys(r["size"] for r in rows))
        write_bytes(args.out, render(rows, args).encode())
        print(args.out.read_text())
        return
    for size in args.sizes.split(","):
        shape = SIZES[size]
        ckpt = checkpoint(args.work, size)
        ids = args.work / f"ids-{args.windows}x{args.length}.npy"
        np.save(ids, np.random.default_rng(0).integers(3, 320, (args.windows, args.length)))
        for setup in setups:
            print(f"{size}, {setup} ...", flush=True)
            out = args.work / f"run-{size}-{SETUPS.index(setup)}"
            subprocess.run(["rm", "-rf", str(out)], check=True)
            load = os.getloadavg()[0]
            row = {"size": size, "setup": setup, "shape": shape, **run(setup, ckpt, ids, out, args.format),
                   "load": [load, os.getloadavg()[0]]}
            rows.append(row)
            print(json.dumps({k: v for k, v in row.items() if k != "verified"}), flush=True)
            with open(args.work / "rows.jsonl", "a") as log:  # kept: --render joins rows of several runs
                log.write(json.dumps({**row, "windows": args.windows, "length": args.length}) + "\n")
    write_bytes(args.out, render(rows, args).encode())
    print(args.out.read_text())


def render(rows: list[dict[str, Any]], args: argparse.Namespace) -> str:
    """The results page: the table, the fit and prediction, each run's check."""
    import paddle

    from qcore.deploy.host import describe_cpu

    for size in {r["size"] for r in rows}:
        mine = [r for r in rows if r["size"] == size]
        mine[-1]["identical"] = len({r["digest"] for r in mine}) == 1 if len(mine) > 1 else None
    tokens = args.windows * args.length
    lines = ["# Weight-only LLM quantization at scale: layer by layer, sharded over ranks", "",
             f"`python benchmarks/llm_scale.py --sizes {args.sizes} --windows {args.windows} --length {args.length} "
             f"--format {args.format}` on {describe_cpu()}, Paddle {paddle.__version__}. Random-weight PaddleNLP "
             "checkpoints of Qwen2.5's shapes (bf16 safetensors, a shard a layer), quantized by `quantize_llm` "
             "(int4 GPTQ, clip search, groups of 128, sequential: each layer calibrated on the quantized layers' "
             f"outputs) on {args.windows} x {args.length} calibration tokens, written as a {args.format} folder and "
             "checked by its runtime. Calibration: the layers' forward passes (input ranges, exact Hessians, outputs);"
             " math: GPTQ and clip search; other: reading the table, writing, the runtime's check, start-up. RSS: the "
             "process's peak (VmHWM) when the last layer is done, when the output is written (before the runtime's "
             "check) and over the whole call (the check loads the written model in its runtime). Bound: 2 GB + two "
             "decoder layers in float32 + the calibration hidden states (two copies). 1-minute load average before / "
             "after each run: "
             + "; ".join(f"{r['size']} {r['setup']}: " + (" / ".join(f"{v:.2f}" for v in r["load"]) if r.get("load")
                                                           else "not recorded") for r in rows) + ".",
             "",
             "| size | params | set-up | wall (s) | calibration (s) | math (s) | other (s) | peak RSS quantizing (GB) |"
             " peak RSS written (GB) | peak RSS call (GB) | bound (GB) | output (MB) | same bytes as 1 process |",
             "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        hidden, _, layers, _, _, vocab = r["shape"]
        params = layer_parameters(r["shape"]) * layers + vocab * hidden
        bound = 2 + (2 * 4 * layer_parameters(r["shape"]) + 2 * 4 * tokens * hidden) / GB
        other = r["job"] - r["calibration"] - r["math"]
        same = "" if r.get("identical") is None else ("yes" if r["identical"] else "**no**")
        written = "not recorded" if r.get("peak_written_mb") is None else f"{r['peak_written_mb'] / 1024:.2f}"
        lines.append(f"| {r['size']} | {params / 1e9:.2f}B | {r['setup']} | {r['job']:.0f} | {r['calibration']:.0f} | "
                     f"{r['math']:.0f} | {other:.0f} | {r['peak_quantizing_mb'] / 1024:.2f} | {written} | "
                     f"{r['peak_mb'] / 1024:.2f} | {bound:.2f} | {r['bytes'] / 1e6:.0f} | {same} |")
    lines += ["", prediction(rows, tokens), ""]
    for r in rows:
        lines.append(f"- {r['size']}, {r['setup']}: verified {r['verified']}")
    return "\n".join(lines) + "\n"


def prediction(rows: list[dict[str, Any]], tokens: int) -> str:
    """Fit calibration and math seconds on the 1-process, 1-thread rows, and predict an 8B Llama."""
    single = [r for r in rows if r["setup"] == SETUPS[0]]
    if not single:
        return ""

    def work(shape: tuple[int, ...]) -> tuple[float, float]:
        pairs = linears(*shape[:5], shape[5])
        return tokens * sum(k * n for k, n in pairs), float(sum(k * k * (n + k) for k, n in pairs))

    a = sum(r["calibration"] for r in single) / sum(work(r["shape"])[0] for r in single)
    b = sum(r["math"] for r in single) / sum(work(r["shape"])[1] for r in single)
    calib, math = work(LLAMA_8B)
    hidden, inter, layers = LLAMA_8B[:3]
    layer_gb = 4 * layer_parameters(LLAMA_8B) / GB
    cores = 16
    # a layer's math over ranks: the FFN down projection's factor on one rank while the other linears are shared
    # out, then its columns over every rank (qptq.weight_only.plan's two rounds, its JobWork estimate scaled to
    # the one-process rows' seconds)
    from qptq.weight_only import WeightOnlyConfig
    from qptq.weight_only.plan import JobWork

    config = WeightOnlyConfig(bits=4, group_size=128, algo="gptq", clip_search=True)

    def layer_jobs(shape: tuple[int, ...]) -> list[JobWork]:
        q, k, v, o, gate, up, down = linears(*shape[:5], shape[5])[:7]
        return [JobWork.of(job, config) for job in ([q, k, v], [o], [gate, up], [down])]

    unit = sum(r["math"] for r in single) / sum(
        r["shape"][2] * sum(j.factor + j.columns for j in layer_jobs(r["shape"])) for r in single)
    *rest, down = layer_jobs(LLAMA_8B)
    rounds = max(down.factor, sum(j.factor + j.columns for j in rest) / (cores - 1)) + down.send + down.columns / cores
    shared_math = unit * layers * rounds
    return (f"Fit on the 1-process, 1-thread rows: calibration {a * 1e12:.2f} s per 10^12 token-parameters, math "
            f"{b * 1e12:.2f} s per 10^12 of sum K^2 (N + K). An 8B Llama ({hidden} hidden, {inter} FFN, {layers} "
            f"layers) on the same budget: {a * calib / 60:.0f} min of calibration and {b * math / 60:.0f} min of "
            f"math on one core of this CPU. On a {cores}-core machine as {cores} ranks of one thread: calibration "
            f"about {a * calib / cores / 60:.0f} min if it divides as the windows do, math about "
            f"{shared_math / 60:.0f} min (the FFN down projection's factor on one rank sets most of a layer's time; "
            f"its columns are shared out); peak about {2 + 2 * layer_gb + 2 * 4 * tokens * hidden / GB:.1f} GB a "
            "rank by the bound above. "
            "Measured scaling of 2 ranks is in the table; 16 was not tried.")


if __name__ == "__main__":
    main()
