"""qcore.distributed: in one process every helper is a pass-through; with 2 gloo processes on
loopback (``paddle.distributed.launch``) they gather, reduce, check and write once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import paddle
import pytest

from qcore.distributed import active, all_gather, all_reduce_max, check_same, digest_files, on_rank0, world

WORKER = Path(__file__).with_name("dist_core_worker.py")


def test_single_process_is_a_pass_through(tmp_path):
    assert world() == (0, 1) and not active()
    assert all_gather({"a": 1}, "x") == [{"a": 1}]
    t = paddle.to_tensor([1.0, -2.0])
    assert all_reduce_max(t, "x").numpy().tolist() == [1.0, -2.0]
    check_same("settings", {"a": 1}, "fix")  # nothing to compare with
    assert on_rank0(lambda: 42, "x") == 42


def test_digest_names_the_bytes(tmp_path):
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "b").write_bytes(b"2")
    (tmp_path / "d" / "a").write_bytes(b"1")
    first = digest_files([tmp_path / "d"])
    assert first == digest_files([tmp_path / "d"]) and len(first) == 64
    (tmp_path / "d" / "a").write_bytes(b"3")
    assert digest_files([tmp_path / "d"]) != first


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("dist_core")
    out = tmp / "out"
    out.mkdir()
    cmd = [sys.executable, "-m", "paddle.distributed.launch", "--nproc_per_node", "2", "--max_restart", "0",
           "--log_dir", str(tmp / "logs"), str(WORKER), str(out)]
    proc = subprocess.run(cmd, cwd=tmp, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]


def test_two_ranks_gather_and_reduce(ranks):
    for rank, seen in enumerate(ranks):
        assert seen["world"] == [rank, 2]
        assert seen["gathered"] == [{"rank": 0, "sq": 0}, {"rank": 1, "sq": 1}]
        assert seen["max"] == [2.0, 5.0]
        # rank r held [[1, 2], [5, 6], [9, 10]] * (r + 1): the sum is three times rank 0's
        assert seen["sum"] == [[3.0, 6.0], [15.0, 18.0], [27.0, 30.0]] and seen["input_kept"]
        assert seen["max_array"] == seen["in_place"] == [2.0, 5.0, 7.0, 0.0, 2.0]


def test_a_mismatch_is_named_on_every_rank(ranks):
    for seen in ranks:
        assert seen["mismatch"] == ("rank 1 and rank 0 disagree on the settings: algo='hist' on rank 1, 'kl' on "
                                    "rank 0; pass the same arguments")


def test_rank0_writes_and_the_others_wait_for_it(ranks):
    for seen in ranks:
        assert seen["written"] == "written.txt"  # rank 0's return value, on every rank
        assert seen["exists_on_return"] == "rank 0 wrote this"


def test_a_failed_write_on_rank0_fails_every_rank(ranks):
    assert ranks[0]["failed"].startswith("OutputError: cannot write under /nowhere")
    assert ranks[1]["failed"] == ("DistributedError: rank 1: rank 0 failed to write a file that cannot be written "
                                  "(OutputError: cannot write under /nowhere (permission denied); choose a writable "
                                  "output directory); see rank 0's error")
