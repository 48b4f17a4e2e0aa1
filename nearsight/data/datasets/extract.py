"""Writing an archive's members into a folder without ever creating or following a link.

tarfile's ``data`` filter checks a member's destination with ``os.path.realpath``, which a
chain of symbolic links longer than PATH_MAX defeats on Python releases before the fix of
CVE-2025-4517 (3.11.13, 3.12.11, 3.13.4): a member then lands anywhere the user can write. So
nothing here asks where a path leads. Instead:

- no link is ever created: symbolic and hard links, devices and fifos are skipped and counted
  (the official CUB, CARS196 and SOP archives hold none);
- a member's name is split into components, each checked (no ``..``, no NUL, no empty or
  over-long part);
- every folder is made with ``mkdir`` relative to the descriptor of its parent and then opened
  with ``O_NOFOLLOW | O_DIRECTORY``, starting from the folder the caller created;
- every file is created with ``O_CREAT | O_EXCL | O_NOFOLLOW`` relative to its folder's
  descriptor, and exactly its listed size is copied into it.

A path therefore never passes through anything but folders made here, on any Python.
"""

from __future__ import annotations

import contextlib
import errno
import os
import tarfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from nearsight.core.errors import printable
from nearsight.core.progress import progress
from nearsight.data.datasets.archives import ArchiveError, tar_kind, zip_kind

FILE_MODE, FOLDER_MODE = 0o644, 0o755  # before the umask; an archive's own modes are ignored
NAME_MAX = 255
CHUNK = 1 << 20
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_FOLDER_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | _CLOEXEC
_FILE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | _CLOEXEC
_OPEN_FOLDERS = 64  # folder descriptors kept open between members (archives list by folder)


@dataclass
class Extracted:
    files: int = 0
    skipped: list[str] = field(default_factory=list)  # names of links and special members

    def skipped_note(self) -> str | None:
        """One line about the members not written, or None when every member was."""
        if not self.skipped:
            return None
        return (
            f"skipped {len(self.skipped)} link or special member(s) of the archive (first: "
            f"{printable(self.skipped[0])}): nearsight writes regular files and folders only"
        )


def member_parts(name: str) -> tuple[str, ...]:
    """The components of a member's name below the target folder (empty for the folder
    itself); ArchiveError for a name that is absolute or has an unsafe component."""
    text = name.replace("\\", "/")
    if text.startswith("/") or (len(text) > 1 and text[1] == ":"):
        raise ArchiveError(f"member {printable(name)!r} has an absolute path")
    parts = tuple(part for part in text.split("/") if part not in ("", "."))
    for part in parts:
        if part == ".." or "\0" in part or len(os.fsencode(part)) > NAME_MAX:
            raise ArchiveError(f"member {printable(name)!r} has an unsafe part {printable(part)!r}")
    return parts


class FolderWriter:
    """Creates folders and files below ``root`` (a folder the caller made) through descriptors
    only; see the module docstring."""

    def __init__(self, root: Path):
        self._root = os.open(root, _FOLDER_FLAGS)
        self._open: dict[tuple[str, ...], int] = {}

    def close(self) -> None:
        for fd in self._open.values():
            os.close(fd)
        self._open.clear()
        os.close(self._root)

    def __enter__(self) -> FolderWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def folder(self, parts: tuple[str, ...]) -> int:
        """The descriptor of ``root/parts``, made as needed; valid until the next call. A loop
        from the deepest folder already open, however deep ``parts`` goes."""
        if not parts:
            return self._root
        if parts in self._open:
            return self._open[parts]
        depth = len(parts) - 1
        while depth and parts[:depth] not in self._open:
            depth -= 1
        fd = self._open[parts[:depth]] if depth else self._root
        owned = False  # fd was opened by this loop (not kept open between calls)
        for end in range(depth + 1, len(parts) + 1):
            name = parts[end - 1]
            with contextlib.suppress(FileExistsError):
                os.mkdir(name, FOLDER_MODE, dir_fd=fd)
            try:
                child = os.open(name, _FOLDER_FLAGS, dir_fd=fd)
            except OSError as error:  # a file of that name, or (not made here) a link
                raise ArchiveError(
                    f"member folder {printable('/'.join(parts[:end]))!r} cannot be made: "
                    f"{error.strerror}"
                ) from None
            finally:
                if owned:
                    os.close(fd)
            fd, owned = child, True
        if len(self._open) >= _OPEN_FOLDERS:  # forget the others (archives list by folder)
            for old in self._open.values():
                os.close(old)
            self._open.clear()
        self._open[parts] = fd
        return fd

    def write(self, parts: tuple[str, ...], source: BinaryIO, size: int) -> None:
        """Create the file ``root/parts`` with the first ``size`` bytes of ``source``; a name
        written before is replaced (a later copy of a member wins, as with tar)."""
        if not parts:
            raise ArchiveError("a file member has an empty name")
        parent = self.folder(parts[:-1])
        try:
            fd = os.open(parts[-1], _FILE_FLAGS, FILE_MODE, dir_fd=parent)
        except FileExistsError:
            try:
                os.unlink(parts[-1], dir_fd=parent)  # a file (a folder refuses: EISDIR/EPERM)
                fd = os.open(parts[-1], _FILE_FLAGS, FILE_MODE, dir_fd=parent)
            except OSError as error:
                raise ArchiveError(
                    f"member {printable('/'.join(parts))!r} cannot be written: {error.strerror}"
                ) from None
        except OSError as error:
            if error.errno in (errno.ELOOP, errno.ENAMETOOLONG, errno.EISDIR):
                raise ArchiveError(
                    f"member {printable('/'.join(parts))!r} cannot be written: {error.strerror}"
                ) from None
            raise
        with os.fdopen(fd, "wb") as target:
            left = size
            while left > 0:
                block = source.read(min(CHUNK, left))
                if not block:
                    raise ArchiveError(
                        f"member {printable('/'.join(parts))!r} is shorter than its listed size"
                    )
                target.write(block)
                left -= len(block)


def extract(archive: Path, target: Path, total: int | None = None) -> Extracted:
    """Write the regular files and folders of ``archive`` (a .tar(.gz) or .zip whose members
    were checked by nearsight.data.datasets.archives.check_members) into ``target``, a folder
    the caller created and nobody else writes to; links and special members are skipped."""
    done = Extracted()
    desc = f"extract {archive.name}"
    try:
        with FolderWriter(target) as writer:
            if zipfile.is_zipfile(archive):
                with zipfile.ZipFile(archive) as handle:
                    for info in progress(handle.infolist(), total=total, desc=desc, unit="files"):
                        _one(writer, done, info.filename, zip_kind(info), info.file_size,
                             lambda info=info: handle.open(info))  # fmt: skip
                return done
            with tarfile.open(archive) as handle:
                for member in progress(handle, total=total, desc=desc, unit="files"):
                    _one(writer, done, member.name, tar_kind(member), member.size,
                         lambda member=member: handle.extractfile(member))  # fmt: skip
    except (tarfile.TarError, zipfile.BadZipFile, EOFError) as error:
        reason = " ".join(str(error).split()) or type(error).__name__
        raise ArchiveError(f"{archive} is damaged: {reason}") from None
    return done


def _one(writer: FolderWriter, done: Extracted, name: str, kind: str, size: int, opener) -> None:
    parts = member_parts(name)
    if kind == "dir":
        writer.folder(parts)
    elif kind == "file":
        with opener() as source:
            writer.write(parts, source, size)
        done.files += 1
    else:
        done.skipped.append(name)
