"""Writing outputs without ever losing a user's file.

An output goes into a directory the user names. Nothing here renames, chmods or deletes that
directory or its parent: the files are written into a private staging directory inside it and
moved into place one by one with ``os.replace`` (so every file is either the old one or the
complete new one), the file that makes the output loadable (a model's program) last. Writers of
one directory take turns (``flock`` on the directory). New files get the umask's modes.

Before the first move, the staging directory gets a marker (:data:`COMPLETE`, the files in the
order they move). What a kill in the middle of :func:`staged_output` can leave, and what the next
touch of the directory (:func:`repair`: the next writer, or a reader such as ``load_model``) does:

* killed while writing (no marker): the old output untouched and a partial staging directory,
  which is deleted;
* killed during the moves (marker): some new files in place, the old program removed, the rest in
  the staging directory; the moves are finished (rolled forward), giving the new output.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

from .errors import OutputError

#: Prefix of the staging directories :func:`staged_output` makes inside an output directory.
STAGING_PREFIX = ".qcore-staging-"
#: Marker of a staging directory whose files are complete: JSON ``{"files": [...], "last": [...]}``,
#: the files in the order they move into the output, and those whose old copy goes before the first move.
COMPLETE = ".qcore-complete"


def check_file_name(name: str, what: str) -> str:
    """``name`` if it names a file directly inside the output directory, else :class:`OutputError`."""
    if not name or name in (".", "..") or Path(name).name != name or os.sep in name or "/" in name:
        raise OutputError(f"{what}={name!r} must be a plain file name inside the output directory (no '/' or '..')")
    return name


def check_output_dir(out_dir: str | os.PathLike[str], inputs: Iterable[str | os.PathLike[str]] = ()) -> Path:
    """Refuse, before any work, an output directory that cannot be written safely.

    Refused: an existing file; a directory equal to or containing one of ``inputs`` (files or
    directories the run reads); a path under a file; a location whose nearest existing directory is
    not writable. Missing directories are fine: the write creates them.
    """
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise OutputError(f"output {out} is an existing file, not a directory; choose a directory for the output")
    resolved = out.resolve()
    for source in inputs:
        src = Path(source).resolve()
        if src == resolved or resolved in src.parents:
            raise OutputError(f"output {out} holds the input {source}; write the output to another directory")
    existing = next(p for p in (resolved, *resolved.parents) if p.exists())
    if not existing.is_dir():
        raise OutputError(f"output {out} lies under {existing}, an existing file; choose a path in a directory")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise OutputError(f"cannot write under {existing} (permission denied); choose a writable output directory")
    return out


def check_output_file(path: str | os.PathLike[str], what: str) -> Path:
    """Refuse, before any work, a one-file output (``what``: the option naming it) that cannot be written: an
    existing directory, or a directory :func:`check_output_dir` refuses. Missing directories are created by
    :func:`write_bytes`, as for every output."""
    path = Path(path)
    if path.is_dir():
        raise OutputError(f"{what} {path} is a directory; give the path of a file to write")
    check_output_dir(path.parent)
    return path


@contextlib.contextmanager
def locked(out_dir: Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``out_dir`` (created if missing): concurrent writers wait their turn."""
    out_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(out_dir, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def finish_interrupted(out_dir: Path) -> None:
    """Finish what killed writers left in ``out_dir`` (call it holding :func:`locked`).

    A staging directory with the :data:`COMPLETE` marker is rolled forward (its remaining files moved
    into place, the program last); one without it (killed while writing) is deleted.
    """
    for entry in out_dir.glob(STAGING_PREFIX + "*"):
        if not entry.is_dir() or entry.is_symlink():
            continue
        if (entry / COMPLETE).is_file():
            order = json.loads((entry / COMPLETE).read_text())
            try:
                _move_in(entry, out_dir, order["files"], order["last"])
            except OSError as exc:
                raise OutputError(
                    f"{out_dir} holds a save interrupted while its files were moved in, and finishing it failed "
                    f"({exc}); move the files of {entry} into {out_dir} by hand, those listed last in "
                    f"{entry / COMPLETE} at the end"
                ) from exc
        shutil.rmtree(entry, ignore_errors=True)


def repair(directory: str | os.PathLike[str]) -> None:
    """Before reading a model in ``directory``: finish a save a kill interrupted there (:func:`finish_interrupted`).

    Costs one directory listing when there is nothing to repair. A staging directory whose writer
    is still at work (it holds the lock) is left alone: this never waits for a writer.
    """
    directory = Path(directory)
    if not any(directory.glob(STAGING_PREFIX + "*")):
        return
    fd = os.open(directory, os.O_RDONLY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return
        finish_interrupted(directory)
    finally:
        os.close(fd)  # releases the lock


@contextlib.contextmanager
def staged_output(out_dir: str | os.PathLike[str], last: Sequence[str] = ()) -> Iterator[Path]:
    """Yield a staging directory; on a clean exit move every file written there into ``out_dir``.

    Files named in ``last`` (e.g. the model's program file) are moved after all others; any old
    copy of them is removed before the first move, so no reader ever pairs an old program with
    new parameters. On an exception before the moves nothing in ``out_dir`` changes; one during
    them leaves the marked staging directory, and the next touch finishes the moves (:func:`repair`).
    """
    out = Path(out_dir)
    with locked(out):
        finish_interrupted(out)
        staging = Path(tempfile.mkdtemp(prefix=STAGING_PREFIX, dir=out))
        try:
            yield staging
            _commit(staging, out, last)
        except BaseException:
            if not (staging / COMPLETE).exists():
                shutil.rmtree(staging, ignore_errors=True)
            raise
        shutil.rmtree(staging, ignore_errors=True)


def _staged_files(staging: Path) -> list[str]:
    return sorted(str(p.relative_to(staging)) for p in staging.rglob("*") if p.is_file() and p.name != COMPLETE)


def _commit(staging: Path, out: Path, last: Sequence[str]) -> None:
    files = _staged_files(staging)
    final = [name for name in last if name in files]
    order = [name for name in files if name not in final] + final
    for name in order:
        _fsync(staging / name)
    write_bytes(staging / COMPLETE, json.dumps({"files": order, "last": final}).encode())
    _fsync_dir(staging)
    _move_in(staging, out, order, final)


def _move_in(staging: Path, out: Path, order: Sequence[str], last: Sequence[str]) -> None:
    """Move the files of ``order`` still in ``staging`` into ``out`` in that order, old copies of ``last`` first.

    Only files found in ``staging`` move (a marker naming '../x' moves nothing).
    """
    present = set(_staged_files(staging))
    remaining = [name for name in order if name in present]
    for name in last:
        if name in remaining:
            with contextlib.suppress(FileNotFoundError):
                (out / name).unlink()
    for name in remaining:
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        os.replace(staging / name, out / name)
    _fsync_dir(out)


def write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    """Write one file atomically (:func:`atomic_file`)."""
    with atomic_file(path) as tmp, open(tmp, "wb") as f:
        f.write(data)


@contextlib.contextmanager
def atomic_file(path: str | os.PathLike[str]) -> Iterator[Path]:
    """A temporary path in ``path``'s directory (created if missing) for a writer to fill; synced and renamed
    over ``path`` when the block ends, removed if it raises."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        yield Path(tmp)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):  # some filesystems refuse fsync on directories
        _fsync(path)
