"""Working across the processes of one ``paddle.distributed`` job.

Sharded calibration (:mod:`qptq`) and data-parallel QAT (:mod:`qqat`) share these pieces, all
on Paddle's own collectives (``all_gather_object``, ``all_reduce``), which run on the CPU with
the gloo backend and on GPUs with NCCL:

* :func:`world`: this process's rank and the world size, ``(0, 1)`` unless
  ``paddle.distributed`` is initialised (``init_parallel_env()``) with more than one process;
* :func:`all_gather`: every rank's picklable object, in rank order; a failed collective
  (usually a rank that died) becomes one :class:`DistributedError`;
* :func:`check_same`: refuse, on every rank, settings or models that differ between ranks,
  naming the first key that differs and the ranks;
* :func:`all_reduce_max`: the element-wise max of a tensor over the ranks, in place;
* :func:`all_reduce_array`: the element-wise sum or max of a numpy array over the ranks;
* :func:`on_rank0`: rank 0 runs a writer, the others wait for it and get its result (or its
  error), so no rank returns before the output is on disk and only one process writes it.

Every function is a no-op (or runs the body directly) in a single process, so the callers
need no second code path.
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from .errors import ConfigError, QuantError
from .paddle_env import eager_mode

log = logging.getLogger(__name__)
T = TypeVar("T")
_warned = False


class DistributedError(QuantError, RuntimeError):
    """A collective across the ranks failed (a rank stopped) or another rank reported an error."""


def world() -> tuple[int, int]:
    """``(rank, world_size)`` of this process; ``(0, 1)`` when ``paddle.distributed`` is not initialised.

    Under ``paddle.distributed.launch`` with several processes but no ``init_parallel_env()``,
    each process works alone; that is logged once as a warning.
    """
    global _warned
    import paddle.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    if not _warned and int(os.environ.get("PADDLE_TRAINERS_NUM", "1")) > 1:
        _warned = True
        log.warning("%s processes were launched but paddle.distributed is not initialised: each works alone; "
                    "call paddle.distributed.init_parallel_env() first to share calibration and scales",
                    os.environ["PADDLE_TRAINERS_NUM"])
    return 0, 1


def active(enabled: bool = True) -> bool:
    """True when ``enabled`` and this process is one of several initialised ranks."""
    return bool(enabled) and world()[1] > 1


def all_gather(obj: Any, what: str) -> list[Any]:
    """Every rank's ``obj`` (picklable), in rank order; ``[obj]`` in a single process.

    ``what`` names the step in the error raised when the collective fails, which is what the
    other ranks see when one rank dies.
    """
    rank, size = world()
    if size == 1:
        return [obj]
    import paddle.distributed as dist

    gathered: list[Any] = []
    try:
        with eager_mode():  # Paddle's object collectives run in dygraph only
            dist.all_gather_object(gathered, obj)
    except Exception as exc:  # gloo/NCCL report a lost peer as a bare runtime error
        raise DistributedError(
            f"rank {rank}: exchanging {what} with the other {size - 1} rank(s) failed "
            f"({_first_line(exc)}); a rank has probably stopped, see its log"
        ) from exc
    return gathered


def all_reduce_max(tensor: Any, what: str) -> Any:
    """Replace ``tensor`` (a dygraph tensor) by its element-wise max over the ranks; returns it."""
    return _all_reduce(tensor, "MAX", what)


def _all_reduce(tensor: Any, op: str, what: str) -> Any:
    rank, size = world()
    if size == 1:
        return tensor
    import paddle.distributed as dist

    try:
        dist.all_reduce(tensor, op=getattr(dist.ReduceOp, op))
    except Exception as exc:
        raise DistributedError(
            f"rank {rank}: reducing {what} over {size} ranks failed ({_first_line(exc)}); "
            "a rank has probably stopped, see its log"
        ) from exc
    return tensor


#: Elements a collective of :func:`all_reduce_array` moves at once (bounds the copies it makes).
REDUCE_CHUNK = 1 << 23


def all_reduce_array(array: Any, op: str, what: str) -> Any:
    """The element-wise ``op`` (``"sum"`` or ``"max"``) of ``array`` (numpy) over the ranks, reduced a chunk of
    :data:`REDUCE_CHUNK` elements at a time (``array`` itself when it is contiguous; on the CPU in place, shared with
    Paddle through DLPack: copying each chunk in and out took twice the collective's own time). Sums of float64 integers
    below ``2**53`` are exact, so their result does not depend on the order the ranks are added in."""
    if world()[1] == 1:
        return array
    import numpy as np
    import paddle

    out = np.ascontiguousarray(array)
    flat = out.reshape(-1)
    device = paddle.get_device()
    with eager_mode():
        for lo in range(0, flat.size, REDUCE_CHUNK):
            chunk = flat[lo: lo + REDUCE_CHUNK]
            part = paddle.utils.dlpack.from_dlpack(chunk.__dlpack__())  # the chunk's own memory: no copy
            if device == "cpu":  # reduced in place
                _all_reduce(part, op.upper(), what)
            else:  # a GPU's collective reads device memory: there and back
                chunk[:] = _all_reduce(part.to(device), op.upper(), what).numpy()
    return out


def _first_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    text = next((line for line in lines if "Error" in line), lines[0] if lines else type(exc).__name__)
    return text[:200]


def check_same(what: str, value: Mapping[str, Any], fix: str) -> None:
    """Raise :class:`~qcore.errors.ConfigError` on every rank unless every rank passed an equal ``value``.

    The message names the first key that differs, the two ranks and their values, e.g.
    ``rank 1 and rank 0 disagree on the quantization settings: algo='abs_max' on rank 1, 'kl' on
    rank 0; pass the same arguments on every rank``.
    """
    values = all_gather(dict(value), what)
    for rank, other in enumerate(values[1:], start=1):
        if other == values[0]:
            continue
        keys = [k for k in {**values[0], **other} if values[0].get(k, "<missing>") != other.get(k, "<missing>")]
        key = keys[0]
        theirs, ours = _short(other.get(key, "<missing>")), _short(values[0].get(key, "<missing>"))
        raise ConfigError(
            f"rank {rank} and rank 0 disagree on the {what}: {key}={theirs} on rank {rank}, {ours} on rank 0; {fix}"
        )


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def digest_files(paths: Iterable[str | os.PathLike[str]]) -> str:
    """SHA-256 over the bytes of ``paths`` (in the order given; a directory: its files, sorted)."""
    h = hashlib.sha256()
    for path in paths:
        p = Path(path)
        files = sorted(f for f in p.rglob("*") if f.is_file()) if p.is_dir() else [p]
        for f in files:
            h.update(f.name.encode() + b"\0")
            with open(f, "rb") as stream:
                for block in iter(lambda: stream.read(1 << 20), b""):
                    h.update(block)
    return h.hexdigest()


def on_rank0(write: Callable[[], T], what: str, enabled: bool = True) -> T:
    """Run ``write`` on rank 0 only; every rank returns its result once it has finished.

    Rank 0 starts once every rank has got here (so no rank is still using files ``write`` replaces
    or removes, and a rank that died before stops rank 0 from writing). The other ranks then wait
    and get rank 0's return value (it must be picklable);
    if ``write`` raised on rank 0, rank 0 re-raises it and the others raise
    :class:`DistributedError` naming it. In a single process (or ``enabled=False``) this is ``write()``.
    """
    rank, size = world()
    if size == 1 or not enabled:
        return write()
    all_gather(None, f"the start of writing {what}")
    result: Any = None
    error: BaseException | None = None
    if rank == 0:
        try:
            result = write()
        except Exception as exc:  # reported to the other ranks, then re-raised here
            error = exc
    report = (None if error is None else f"{type(error).__name__}: {_first_line(error)}", result)
    outcome = all_gather(report if rank == 0 else (None, None), f"the outcome of writing {what}")[0]
    if error is not None:
        raise error
    if outcome[0] is not None:
        raise DistributedError(f"rank {rank}: rank 0 failed to write {what} ({outcome[0]}); see rank 0's error")
    return outcome[1]
