"""Write files and folders so that a reader never sees them half-written.

Everything is written beside its final path under a temporary name and renamed into place:
a crash (even SIGKILL) leaves either the previous version or nothing, never a partial one.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path


def _umask() -> int:
    # os.umask can only be read by setting it, which races with other threads creating files;
    # Linux reports it in /proc
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _publishable(path: str | os.PathLike[str], mode: int = 0o666) -> None:
    """mkstemp/mkdtemp create owner-only files; give the result the permissions a plain
    open() would have (mode & ~umask), so a model or gallery can be served by another user."""
    os.chmod(path, mode & ~_umask())


@contextlib.contextmanager
def atomic_file(path: str | os.PathLike[str], mode: str = "wb") -> Iterator:
    """Open a temporary file beside ``path``; on success fsync it and rename it onto ``path``."""
    final = Path(path)
    final.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{final.name}.", suffix=".tmp", dir=final.parent)
    try:
        with os.fdopen(fd, mode) as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        _publishable(tmp_name)
        os.replace(tmp_name, final)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp_name)
        raise


def atomic_write_path(path: str | os.PathLike[str]) -> contextlib.AbstractContextManager[Path]:
    """For libraries that want a file name (torch.save, onnx.save, faiss.write_index): yields a
    temporary path beside ``path`` and renames it onto ``path`` when the block succeeds."""
    return _atomic_path(Path(path))


@contextlib.contextmanager
def _atomic_path(final: Path) -> Iterator[Path]:
    final.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{final.name}.", suffix=".tmp", dir=final.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        yield tmp
        if tmp.exists():
            _publishable(tmp)
        os.replace(tmp, final)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise


@contextlib.contextmanager
def atomic_dir(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield an empty temporary folder beside ``path``; when the block succeeds it replaces
    ``path`` (the previous folder, if any, is kept until the new one is in place)."""
    final = Path(path)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", suffix=".tmp", dir=final.parent))
    try:
        yield tmp
        _publishable(tmp, 0o777)
        replace_dir(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _previous_path(final: Path) -> Path:
    return final.with_name(f".{final.name}.previous")


def replace_dir(new: Path, final: Path) -> None:
    """Move folder ``new`` onto ``final``. A folder cannot be renamed over a non-empty one, so
    the old folder is first renamed aside; :func:`recover_dir` undoes a crash between the two
    renames."""
    previous = _previous_path(final)
    if previous.exists():
        shutil.rmtree(previous)
    if final.exists():
        os.rename(final, previous)
    os.rename(new, final)
    shutil.rmtree(previous, ignore_errors=True)


def recover_dir(path: str | os.PathLike[str]) -> None:
    """If a crash happened between the two renames of :func:`replace_dir`, put the previous
    folder back. Call before opening a folder written with :func:`atomic_dir`."""
    final = Path(path)
    previous = _previous_path(final)
    if previous.exists():
        if final.exists():
            shutil.rmtree(previous, ignore_errors=True)
        else:
            os.rename(previous, final)
