"""Sharded LLM calibration under ``paddle.distributed.launch``: 2 CPU processes (gloo, loopback) quantize a tiny
decoder with GPTQ, each on its share of the windows, and must write the bytes one process writes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from threadpoolctl import threadpool_limits

pytest.importorskip("gguf")
pytest.importorskip("onnx")

from qdemo.testing import save_tiny_llama_gguf  # noqa: E402
from qptq.weight_only.plan import JobWork, column_bounds, column_split  # noqa: E402

WORKER = Path(__file__).with_name("dist_llm_worker.py")
sys.path.insert(0, str(WORKER.parent))
import dist_llm_worker  # noqa: E402

TIMEOUT = 300  # seconds for one 2-process launch


def files(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir()) if p.is_file()}


def test_two_ranks_write_the_bytes_of_one_process(tmp_path):
    # FFN 4096 -> 512: the down projection is most of a layer's GPTQ work, so the ranks share out its 512 output
    # columns (256 each) after one factors its Hessian; the other linears go whole to a rank
    source = save_tiny_llama_gguf(tmp_path / "tiny.gguf", layers=3, hidden=512, inter=4096, head_dim=128)
    for config in (dist_llm_worker.GGUF, dist_llm_worker.INT):
        works = [JobWork.of(job, config) for job in  # a layer's jobs: q k v, o, gate up, down ([K, N] each)
                 ([(512, 512), (512, 256), (512, 256)], [(512, 512)], [(512, 4096), (512, 4096)], [(4096, 512)])]
        assert column_split(works, [True] * 4, 2) == [False, False, False, True]
    assert column_bounds(512, 2) == [0, 256, 512] and column_bounds(500, 2) is None
    ids = tmp_path / "ids.npy"
    np.save(ids, np.random.default_rng(0).integers(3, 320, (5, 48)))  # 5 windows: ranks get 3 and 2
    single = tmp_path / "single"
    single.mkdir()
    # one BLAS thread, as each rank has: OpenBLAS's AVX2 (Haswell) float32 products round differently with 1 and 2
    # threads (its AVX-512 ones do not), so on an AVX2 CPU the bytes match for equal BLAS threads per process
    with threadpool_limits(1, user_api="blas"):
        gguf = dist_llm_worker.quantize_llm(source, single / "model.gguf", dist_llm_worker.GGUF, ids, format="gguf")
        genai = dist_llm_worker.quantize_llm(source, single / "genai", dist_llm_worker.INT, ids,
                                             format="onnxruntime-genai")
    assert any(layer.bits == 8 for layer in genai.result.layers)  # ratio 0.8 promoted some: shared out too

    out = tmp_path / "out"
    out.mkdir()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "paddle.distributed.launch", "--nproc_per_node", "2", "--max_restart", "0",
           "--log_dir", str(tmp_path / "logs"), str(WORKER), str(out), str(source), str(ids)]
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=TIMEOUT)
    logs = "".join(p.read_text() for p in sorted((tmp_path / "logs").glob("*")) if p.is_file())
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:] + logs[-4000:]

    assert (out / "model.gguf").read_bytes() == (single / "model.gguf").read_bytes()
    assert files(out / "genai") == files(single / "genai")
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]
    want = {"gguf": dist_llm_worker.digest(gguf), "genai": dist_llm_worker.digest(genai)}
    assert ranks == [{**want, "world": [0, 2]}, {**want, "world": [1, 2]}]  # two ranks, each its share
