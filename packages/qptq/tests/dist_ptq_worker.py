"""One rank of the sharded-calibration tests (test_distributed_qptq.py); run under paddle.distributed.launch.

``python dist_ptq_worker.py OUT SCENARIO``: each rank calibrates its own shard of the demo
calibration data and writes what it saw to ``OUT/rank<r>.json``. Not collected by pytest.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
import paddle.distributed as dist

from qcore.errors import QuantError
from qdemo import demo_model_dir, load_demo_data
from qptq import quant_post_static

SHARD = 40  # samples per rank; the union is calib[: 2 * SHARD]
RANGE_RATIO = 3.7  # the "ranges_*" runs: rank r's images times RANGE_RATIO**r


def samples(images):
    return lambda: ((img,) for img in images)


def thresholds(report):
    return {name: info["threshold"] for layer in report["layers"] for name, info in layer.get("inputs", {}).items()}


def run(out: Path, rank: int, name: str, images, family="pir", **kwargs) -> dict:
    try:
        report = quant_post_static(None, demo_model_dir(family), out / name, sample_generator=samples(images),
                                   save_model_filename=None, save_params_filename=None, **{"batch_size": 10, **kwargs})
    except QuantError as exc:
        return {"error": f"{type(exc).__name__}: {exc}", "written": sorted(os.listdir(out / name))
                if (out / name).exists() else []}
    return {"thresholds": thresholds(report), "all_algos": {n: i["all_algos"] for layer in report["layers"]
                                                            for n, i in layer.get("inputs", {}).items()},
            "samples": report["samples"], "batches": report["batches"]}


def main() -> None:
    out, scenario = Path(sys.argv[1]), sys.argv[2]
    dist.init_parallel_env()
    rank = dist.get_rank()
    calib, _ = load_demo_data("calib")
    mine = calib[rank * SHARD:(rank + 1) * SHARD]
    seen = {}
    if scenario == "main":
        seen["mismatch"] = run(out, rank, "mismatch", mine, algo="KL" if rank == 0 else "abs_max")
        seen["other_model"] = run(out, rank, "other_model", mine, family="pir" if rank == 0 else "legacy")
        for algo in ("KL", "abs_max", "hist", "auto"):
            seen[algo] = run(out, rank, algo, mine, algo=algo)
        seen["legacy_KL"] = run(out, rank, "legacy_KL", mine, family="legacy", algo="KL")
        spread = mine * np.float32(RANGE_RATIO**rank)  # the ranks' activation ranges 3.7x apart
        for algo in ("KL", "hist"):
            seen[f"ranges_{algo}"] = run(out, rank, f"ranges_{algo}", spread, algo=algo)
        seen["empty"] = run(out, rank, "empty", mine if rank == 0 else mine[:0], algo="KL")
        bad = mine.copy()
        if rank == 1:
            bad[15, 0, 3, 3] = float("nan")  # rank 1's second batch holds a NaN
        seen["bad"] = run(out, rank, "bad", bad, algo="KL")
    elif scenario == "uneven":  # shards that split a batch: rank 0 ends on a short one
        shard = calib[:28] if rank == 0 else calib[28:64]
        seen["uneven"] = run(out, rank, "uneven", shard, family="legacy", algo="abs_max", batch_size=8)
    elif scenario == "dies":
        def dying():
            for i, img in enumerate(mine):
                if rank == 1 and i == 15:
                    os._exit(17)  # rank 1 dies in the middle of its shard
                yield (img,)
        report = quant_post_static(None, demo_model_dir("pir"), out / "dies", sample_generator=dying,
                                   batch_size=10, algo="KL", save_model_filename=None, save_params_filename=None)
        seen["dies"] = thresholds(report)
    (out / f"rank{rank}.json").write_text(json.dumps(seen, indent=1, sort_keys=True))


if __name__ == "__main__":
    main()
