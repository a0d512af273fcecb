"""One rank of qcore's 2-process tests (test_distributed_qcore.py), run under paddle.distributed.launch.

Each rank records what every :mod:`qcore.distributed` helper gave it in ``OUT/rank<r>.json``.
Not collected by pytest.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import paddle
import paddle.distributed as dist

from qcore import distributed
from qcore.distributed import DistributedError, all_gather, all_reduce_max, check_same, on_rank0, world
from qcore.errors import ConfigError, OutputError
from qcore.outputs import write_bytes


def main() -> None:
    out = Path(sys.argv[1])
    dist.init_parallel_env()
    rank, size = world()
    seen: dict = {"world": [rank, size], "gathered": all_gather({"rank": rank, "sq": rank * rank}, "a test value")}
    seen["max"] = all_reduce_max(paddle.to_tensor([1.0 + rank, 5.0 - rank]), "a test tensor").numpy().tolist()
    distributed.REDUCE_CHUNK = 4  # 6 elements: a chunk of 4 and one of 2
    mine = np.arange(12, dtype=np.float64).reshape(3, 4) * (rank + 1)
    view = mine[:, 1:3]  # not contiguous: reduced in a copy, the input left as it was
    seen["sum"] = distributed.all_reduce_array(view, "sum", "a test array").tolist()
    seen["input_kept"] = bool(np.array_equal(mine, np.arange(12).reshape(3, 4) * (rank + 1)))
    whole = np.array([1.0 + rank, 5.0 - rank, 7.0, -rank, 2.0])
    seen["max_array"] = distributed.all_reduce_array(whole, "max", "a test array").tolist()
    seen["in_place"] = whole.tolist()  # contiguous: reduced in its own memory
    check_same("settings", {"bits": 8, "algo": "kl"}, "pass the same arguments")  # agrees: no error
    try:
        check_same("settings", {"bits": 8, "algo": "kl" if rank == 0 else "hist"}, "pass the same arguments")
    except ConfigError as exc:
        seen["mismatch"] = str(exc)

    def write() -> str:
        assert rank == 0, "only rank 0 writes"
        write_bytes(out / "written.txt", b"rank 0 wrote this")
        return "written.txt"

    seen["written"] = on_rank0(write, "a test file")
    seen["exists_on_return"] = (out / "written.txt").read_bytes().decode()

    def fail() -> None:
        raise OutputError("cannot write under /nowhere (permission denied); choose a writable output directory")

    try:
        on_rank0(fail, "a file that cannot be written")
    except (OutputError, DistributedError) as exc:
        seen["failed"] = f"{type(exc).__name__}: {exc}"
    (out / f"rank{rank}.json").write_text(json.dumps(seen))


if __name__ == "__main__":
    main()
