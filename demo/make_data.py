"""Regenerate the bundled Fashion-MNIST demo subset.

Reads the original idx files (Debian package ``dataset-fashion-mnist``,
installed under /usr/share/datasets/fashion-mnist) and writes a stratified,
seeded subset to ``packages/qdemo/src/qdemo/assets/fashion_mnist_subset.npz``.

The committed npz is the source of truth; this script exists only so the subset
can be rebuilt and audited.  Usage::

    python demo/make_data.py [--src DIR] [--out FILE] [--seed 0]
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import struct
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
DEFAULT_SRC = Path("/usr/share/datasets/fashion-mnist")
DEFAULT_OUT = REPO / "packages/qdemo/src/qdemo/assets/fashion_mnist_subset.npz"

N_CLASSES = 10
# per-class counts: 600 train + 100 calib (both from the 60k train file, disjoint)
# and 200 test (from the 10k t10k file)
TRAIN_PER_CLASS = 600
CALIB_PER_CLASS = 100
TEST_PER_CLASS = 200


def read_idx(path: Path) -> np.ndarray:
    """Read a (gzipped) idx file into a numpy array (uint8 payload)."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as f:
        data = f.read()
    zero, dtype_code, ndim = struct.unpack(">HBB", data[:4])
    if zero != 0 or dtype_code != 0x08:
        raise ValueError(f"{path}: not an unsigned-byte idx file (magic {data[:4].hex()})")
    dims = struct.unpack(">" + "I" * ndim, data[4 : 4 + 4 * ndim])
    arr = np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim)
    if arr.size != int(np.prod(dims)):
        raise ValueError(f"{path}: expected {np.prod(dims)} values, found {arr.size}")
    return arr.reshape(dims)


def stratified_pick(labels: np.ndarray, counts: list[int], rng: np.random.Generator) -> list[np.ndarray]:
    """For each class draw sum(counts) distinct indices and split them into len(counts) groups.

    Returns one shuffled index array per group; the groups are disjoint.
    """
    groups: list[list[np.ndarray]] = [[] for _ in counts]
    for c in range(N_CLASSES):
        idx = np.flatnonzero(labels == c)
        chosen = rng.choice(idx, size=sum(counts), replace=False)
        start = 0
        for g, n in enumerate(counts):
            groups[g].append(chosen[start : start + n])
            start += n
    out = []
    for parts in groups:
        sel = np.concatenate(parts)
        rng.shuffle(sel)
        out.append(sel)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--src", type=Path, default=DEFAULT_SRC)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    tr_x = read_idx(args.src / "train-images-idx3-ubyte.gz")
    tr_y = read_idx(args.src / "train-labels-idx1-ubyte.gz")
    te_x = read_idx(args.src / "t10k-images-idx3-ubyte.gz")
    te_y = read_idx(args.src / "t10k-labels-idx1-ubyte.gz")

    rng = np.random.default_rng(args.seed)
    train_idx, calib_idx = stratified_pick(tr_y, [TRAIN_PER_CLASS, CALIB_PER_CLASS], rng)
    (test_idx,) = stratified_pick(te_y, [TEST_PER_CLASS], rng)
    assert not set(train_idx.tolist()) & set(calib_idx.tolist())

    arrays = {
        "train_images": tr_x[train_idx],
        "train_labels": tr_y[train_idx].astype(np.int64),
        "calib_images": tr_x[calib_idx],
        "calib_labels": tr_y[calib_idx].astype(np.int64),
        "test_images": te_x[test_idx],
        "test_labels": te_y[test_idx].astype(np.int64),
        # indices into the original files, so the subset can be audited
        "train_source_index": train_idx.astype(np.int64),
        "calib_source_index": calib_idx.astype(np.int64),
        "test_source_index": test_idx.astype(np.int64),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(args.out, **arrays)
    digest = hashlib.sha256(args.out.read_bytes()).hexdigest()
    for k, v in arrays.items():
        print(f"{k:20s} {str(v.shape):16s} {v.dtype}")
    print(f"wrote {args.out} ({args.out.stat().st_size / 1e6:.2f} MB, sha256 {digest})")


if __name__ == "__main__":
    main()
