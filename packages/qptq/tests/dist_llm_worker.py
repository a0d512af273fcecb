"""One rank of the sharded LLM tests (test_llm_distributed.py); run under paddle.distributed.launch.

``python dist_llm_worker.py OUT SOURCE IDS``: quantize ``SOURCE`` with GPTQ on the windows of ``IDS`` (a ``.npy``)
shared out over the ranks, writing ``OUT/model.gguf`` and ``OUT/genai``; each rank writes a digest of the codes
it ended with to ``OUT/rank<r>.json``. Not collected by pytest.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import paddle.distributed as dist

from qcore.distributed import world
from qptq.llm.route import quantize_llm
from qptq.weight_only import WeightOnlyConfig

GGUF = WeightOnlyConfig(bits=4, group_size=32, symmetric=True, algo="gptq", clip_search=True, sequential=True,
                        embedding_bits=8, grid="gguf")
INT = WeightOnlyConfig(bits=4, group_size=32, algo="gptq", sequential=True, ratio=0.8)


def digest(report) -> str:
    h = hashlib.sha256()
    for layer in report.result.layers:
        q = report.result.codes[layer.weight]
        h.update(layer.name.encode() + q.codes.tobytes() + q.scales.tobytes())
    return h.hexdigest()


def main(out: Path, source: Path, ids: Path) -> None:
    dist.init_parallel_env()
    rank = dist.get_rank()
    gguf = quantize_llm(source, out / "model.gguf", GGUF, ids, format="gguf")
    genai = quantize_llm(source, out / "genai", INT, ids, format="onnxruntime-genai")
    (out / f"rank{rank}.json").write_text(json.dumps({"gguf": digest(gguf), "genai": digest(genai),
                                                      "world": list(world())}))


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]))
