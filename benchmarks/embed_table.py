"""qembed's table API: quantize throughput per core, peak RSS of chunked quantization, lookups per core.

Each run writes a fresh random fp32 ``.npy`` table (``--rows`` x ``--dim``, default 1 GiB) to a temp
dir, then in child processes pinned to one thread, per scheme: in-memory ``quantize_table`` and
chunked ``quantize_npy`` (best of ``--repeats``, GB/s of fp32 input) and the peak-RSS growth of one
``quantize_npy`` run; then the latency and GB/s (fp32 rows out) of a memory-mapped lookup of 4096 random ids. Writes
``benchmarks/results/embed_table.md`` (``--out`` for another name). Run with ``python3 -m nox -s bench_embed``;
the committed results are ``--dir /dev/shm`` (the CPU's throughput) and ``--out embed_table_disk.md`` (files on
disk, so the fsync of the outputs counts).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import numpy as np

from qcore.deploy.host import describe_cpu

RESULTS = Path(__file__).parent / "results"
ONE_THREAD = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
CASES = [  # (label, quantize_type, bits, per_row)
    ("int8 abs_max, one scale", "abs_max", 8, False),
    ("int8 abs_max, per-row", "abs_max", 8, True),
    ("int4 abs_max, per-row, packed", "abs_max", 4, True),
    ("int8 log, per-row", "log", 8, True),
]


def child(code: str) -> dict:
    """Run ``code`` in a fresh single-threaded interpreter; it prints one JSON object."""
    out = subprocess.check_output([sys.executable, "-c", textwrap.dedent(code)], env=ONE_THREAD)
    return json.loads(out.decode().strip().splitlines()[-1])


def throughput(path: Path, tmp: Path, kind: str, bits: int, per_row: bool, repeats: int, chunk_rows: int) -> dict:
    return child(f"""
        import json, time, numpy as np
        from qembed import quantize_npy, quantize_table
        table = np.load({str(path)!r})
        best_mem = best_npy = float("inf")
        for _ in range({repeats}):
            t = time.perf_counter()
            quantize_table(table, {kind!r}, {bits}, {per_row})
            best_mem = min(best_mem, time.perf_counter() - t)
            t = time.perf_counter()
            quantize_npy({str(path)!r}, {str(tmp / 'q.npy')!r}, {kind!r}, {bits}, {per_row}, chunk_rows={chunk_rows})
            best_npy = min(best_npy, time.perf_counter() - t)
        print(json.dumps({{"mem": table.nbytes / best_mem / 1e9, "npy": table.nbytes / best_npy / 1e9}}))
    """)


def rss_and_lookup(path: Path, tmp: Path, kind: str, bits: int, per_row: bool, rows: int, chunk_rows: int) -> dict:
    return child(f"""
        import json, time, numpy as np
        from qembed import quantize_npy
        def hwm():  # peak RSS in KiB of this process image (ru_maxrss would carry the parent's over exec)
            return int(next(line.split()[1] for line in open("/proc/self/status") if line.startswith("VmHWM")))
        before = hwm()
        q = quantize_npy({str(path)!r}, {str(tmp / 'q.npy')!r}, {kind!r}, {bits}, {per_row}, chunk_rows={chunk_rows})
        grown = hwm() - before
        ids = np.random.default_rng(0).integers(0, {rows}, 4096)
        q.rows(ids)
        best = float("inf")
        for _ in range(5):
            t = time.perf_counter()
            for _ in range(20):
                q.rows(ids)
            best = min(best, (time.perf_counter() - t) / 20)
        print(json.dumps({{"rss_mib": grown / 1024, "lookup_ms": best * 1000,
                          "lookup_gbs": ids.size * q.dim * 4 / best / 1e9}}))
    """)


def fs_kind(path: Path) -> str:
    """'tmpfs (/dev/shm)' or 'the page cache of a disk (ext4, /)': the file system holding ``path``."""
    try:
        mounts = [line.split() for line in Path("/proc/mounts").read_text().splitlines()]
    except OSError:
        return str(path)
    _, point, kind, *_ = max((m for m in mounts if str(path).startswith(m[1])), key=lambda m: len(m[1]))
    return f"tmpfs ({point})" if kind == 'tmpfs' else f"the page cache of a disk ({kind}, {point})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1 << 22, help="table rows (default 4M: 1 GiB at dim 64)")
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--chunk-rows", type=int, default=65536)
    parser.add_argument("--dir", default=None, help="where the table and outputs go (default: the temp dir; "
                        "/dev/shm keeps the fsync of the outputs off the disk)")
    parser.add_argument("--out", default="embed_table.md", help="results file name in benchmarks/results")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp_name:
        tmp = Path(tmp_name)
        path = tmp / "table.npy"
        table = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=(args.rows, args.dim))
        for start in range(0, args.rows, 1 << 16):
            block = np.random.default_rng(start).normal(0, 0.05, (min(1 << 16, args.rows - start), args.dim))
            table[start : start + len(block)] = block
        table.flush()
        del table
        table_mib = args.rows * args.dim * 4 / 2**20
        chunk_mib = args.chunk_rows * args.dim * 4 / 2**20
        rows_out = []
        for label, kind, bits, per_row in CASES:
            r = throughput(path, tmp, kind, bits, per_row, args.repeats, args.chunk_rows)
            rss = rss_and_lookup(path, tmp, kind, bits, per_row, args.rows, args.chunk_rows)
            rows_out.append(f"| {label} | {r['mem']:.2f} | {r['npy']:.2f} | {rss['rss_mib']:.0f} | "
                            f"{rss['lookup_ms']:.2f} | {rss['lookup_gbs']:.2f} |")
            print(rows_out[-1], flush=True)
    lines = [
        "# qembed table API: throughput, memory, lookups",
        "",
        f"Random fp32 table {args.rows:,} x {args.dim} ({table_mib:.0f} MiB), one thread "
        f"(OMP/BLAS threads = 1), best of {args.repeats}. GB/s = fp32 bytes in / wall time. `.npy` runs read "
        f"and write files in {fs_kind(tmp)} (`quantize_npy` fsyncs its outputs before moving them into place), "
        f"chunk_rows={args.chunk_rows:,} ({chunk_mib:.0f} MiB; it reads at most 1 MiB at a time). Peak RSS "
        "growth: VmHWM of a fresh process after `import qembed`, around one `quantize_npy` run (scales and the "
        "returned memory-mapped table included). Lookup: `rows` of 4096 uniform random ids from the returned "
        "memory-mapped table (pages in the page cache), best of 5 x 20; GB/s = fp32 bytes of the rows returned / "
        "time. Issue 42's targets, per core: `quantize_npy` >= 2 GB/s for int8 per-row and int4, lookups >= 1 GB/s. "
        f"Machine: {describe_cpu()}, numpy {np.__version__}. Produced by `benchmarks/embed_table.py`.",
        "",
        "| scheme | in memory `quantize_table` (GB/s) | chunked `quantize_npy` (GB/s) | "
        "peak RSS growth, chunked (MiB) | lookup of 4096 ids (ms) | lookup (GB/s of fp32 rows) |",
        "|---|---:|---:|---:|---:|---:|",
        *rows_out,
    ]
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / args.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
