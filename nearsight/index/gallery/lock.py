"""Locking a gallery folder and cleaning up after writers that were killed.

Writers are serialised by an ``fcntl.flock`` on ``.GALLERY.lock`` beside the folder (never
deleted, so every writer locks the same file); readers take it shared while they load, so they
never see the instant between the two renames of a replace (nearsight.core.atomic.replace_dir). A writer
killed mid-write leaves a hidden temporary folder (a killed ``compact`` of a large gallery: as
large as the gallery), or the old folder parked at ``.GALLERY.previous``. :func:`recover`, run
whenever the gallery is opened, puts the old folder back and removes the temporary folders at
once when no one holds the lock (else the writer holding it sweeps them).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import shutil
import sqlite3
from collections.abc import Iterator
from pathlib import Path

from nearsight.core.atomic import recover_dir
from nearsight.index.catalog.store import CATALOG_FILE, GalleryError


def lock_path(gallery_dir: str | os.PathLike[str]) -> Path:
    folder = Path(gallery_dir).expanduser().absolute()
    return folder.with_name(f".{folder.name}.lock")


@contextlib.contextmanager
def gallery_lock(gallery_dir: str | os.PathLike[str], *, exclusive: bool) -> Iterator[None]:
    """Hold ``.GALLERY.lock`` (beside the gallery) exclusively (writers) or shared (readers).

    A reader that cannot create the lock file (a read-only location) reads without it: nobody
    can be writing there either."""
    path = lock_path(gallery_dir)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as error:
        if not exclusive and error.errno in (errno.EACCES, errno.EROFS, errno.EPERM):
            yield
            return
        raise GalleryError(f"cannot lock gallery {path.parent}: {error.strerror}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock


def temporaries(final: Path) -> list[Path]:
    """The temporary folders of writers of the gallery ``final`` (live or killed)."""
    # exactly the names tempfile.mkdtemp gives (an 8-character random part), so that the
    # temporaries of a gallery called "g.x" are not taken for those of "g"
    pattern = re.compile(rf"\.{re.escape(final.name)}\.[a-z0-9_]{{8}}\.tmp")
    try:
        entries = list(final.parent.iterdir())
    except OSError:
        return []
    return [
        entry
        for entry in entries
        if pattern.fullmatch(entry.name) and entry.is_dir() and not entry.is_symlink()
    ]


def sweep_temporaries(final: Path) -> None:
    """Remove temporary folders left by writers that were killed (call under the write lock)."""
    for leftover in temporaries(final):
        shutil.rmtree(leftover, ignore_errors=True)


def sweep_if_unlocked(final: Path) -> None:
    """:func:`sweep_temporaries` now if nobody holds the gallery's lock (a writer making its
    temporary folder holds it exclusively): a non-blocking try, never a wait."""
    if not temporaries(final):
        return
    try:
        fd = os.open(lock_path(final), os.O_RDWR)
    except OSError:
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:  # held: by a live writer, or a reader that will sweep in its turn
        os.close(fd)
        return
    try:
        sweep_temporaries(final)
    finally:
        os.close(fd)


def recover(folder: Path) -> None:
    """Undo a writer killed between the two renames of a replace, or in the middle of a
    catalog transaction (SQLite rolls its hot journal back when the catalog is next opened
    for writing; a read-only open cannot), under the write lock; remove the temporary
    folders of killed writers when nobody holds the lock."""
    sweep_if_unlocked(folder)
    if previous_path(folder).exists() and not folder.exists():
        with gallery_lock(folder, exclusive=True):
            recover_dir(folder)
    journal = folder / f"{CATALOG_FILE}-journal"
    if journal.exists():
        with gallery_lock(folder, exclusive=True):
            if journal.exists():  # still there with the lock held: its writer died
                connection = sqlite3.connect(folder / CATALOG_FILE)
                try:
                    connection.execute("SELECT count(*) FROM sqlite_master").fetchall()
                except sqlite3.DatabaseError:
                    pass  # a damaged catalog is reported by the open that follows
                finally:
                    connection.close()


def previous_path(folder: Path) -> Path:
    """Where nearsight.core.atomic.replace_dir parks the old folder between its two renames."""
    return folder.with_name(f".{folder.name}.previous")
