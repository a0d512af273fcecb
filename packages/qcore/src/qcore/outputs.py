"""Writing outputs without ever losing a user's file.

An output goes into a directory the user names. Nothing here renames, chmods or deletes that
directory or its parent: the files are written into a private staging directory inside it and
moved into place one by one with ``os.replace`` (so every file is either the old one or the
complete new one), the file that makes the output loadable (a model's program) last. Writers of
one directory take turns (``flock`` on the directory). A killed run leaves only its staging
directory, which the next writer of that directory removes. New files get the umask's modes.

What a kill in the middle of :func:`staged_output` can leave: before the commit, the old output
untouched; during it, the old output with its program file removed (never a program next to
parameters of another model); after it, the new output.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

from .errors import OutputError

#: Prefix of the staging directories :func:`staged_output` makes inside an output directory.
STAGING_PREFIX = ".qcore-staging-"


def check_file_name(name: str, what: str) -> str:
    """``name`` if it names a file directly inside the output directory, else :class:`OutputError`."""
    if not name or name in (".", "..") or Path(name).name != name or os.sep in name or "/" in name:
        raise OutputError(f"{what}={name!r} must be a plain file name inside the output directory (no '/' or '..')")
    return name


def check_output_dir(out_dir: str | os.PathLike[str], inputs: Iterable[str | os.PathLike[str]] = ()) -> Path:
    """Refuse, before any work, an output directory that cannot be written safely.

    Refused: an existing file; a directory equal to or containing one of ``inputs`` (files or
    directories the run reads); a location whose nearest existing directory is not writable.
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
    if not os.access(existing, os.W_OK | os.X_OK):
        raise OutputError(f"cannot write under {existing} (permission denied); choose a writable output directory")
    return out


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


def remove_litter(out_dir: Path) -> None:
    """Remove staging directories that killed runs left in ``out_dir`` (call it holding :func:`locked`)."""
    for entry in out_dir.glob(STAGING_PREFIX + "*"):
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)


@contextlib.contextmanager
def staged_output(out_dir: str | os.PathLike[str], last: Sequence[str] = ()) -> Iterator[Path]:
    """Yield a staging directory; on a clean exit move every file written there into ``out_dir``.

    Files named in ``last`` (e.g. the model's program file) are moved after all others; any old
    copy of them is removed before the first move, so no reader ever pairs an old program with
    new parameters. On an exception nothing in ``out_dir`` changes.
    """
    out = Path(out_dir)
    with locked(out):
        remove_litter(out)
        staging = Path(tempfile.mkdtemp(prefix=STAGING_PREFIX, dir=out))
        try:
            yield staging
            _commit(staging, out, last)
        finally:
            shutil.rmtree(staging, ignore_errors=True)


def _commit(staging: Path, out: Path, last: Sequence[str]) -> None:
    files = sorted(p.relative_to(staging) for p in staging.rglob("*") if p.is_file())
    first = [f for f in files if str(f) not in last]
    final = [Path(name) for name in last if (staging / name).is_file()]
    for name in files:
        _fsync(staging / name)
    for name in final:
        with contextlib.suppress(FileNotFoundError):
            (out / name).unlink()
    for name in first + final:
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        os.replace(staging / name, out / name)
    _fsync_dir(out)


def write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    """Write one file atomically: a temporary file in the same directory, renamed over ``path``."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
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
