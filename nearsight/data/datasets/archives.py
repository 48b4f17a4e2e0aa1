"""Archives of the benchmark datasets: listing, checks, checksums, resumable downloads.

Before anything is written, an archive is refused when a member would land outside the target
folder (an absolute name, a ``..`` part, a link pointing out of it) or when it is larger than
the free disk space. The members are then written by nearsight/data/datasets/extract.py,
which never creates or follows a link. Nothing is downloaded here unless :func:`download` is
called (``nearsight data prepare --download``), never by the tests.
"""

from __future__ import annotations

import hashlib
import os
import posixpath
import shutil
import stat
import sys
import tarfile
import urllib.error
import urllib.request
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from tqdm import tqdm

from nearsight.core.errors import NearsightError, printable

CHUNK = 1 << 20
# headroom beyond the archive's unpacked size: file system blocks, the reader's own files
DISK_MARGIN = 1.05
MAX_DEPTH = 64  # folders above a member (the benchmarks' deepest is 3)


class ArchiveError(NearsightError):
    """An archive that cannot or must not be used (unsafe member, corrupt, too large)."""


Kind = Literal["file", "dir", "symlink", "hardlink", "other"]  # other: a device, a fifo


@dataclass(frozen=True)
class Member:
    name: str
    size: int
    kind: Kind
    link: str | None = None  # a symbolic or hard link's target

    @property
    def is_dir(self) -> bool:
        return self.kind == "dir"

    @property
    def hard(self) -> bool:
        """A hard link: its target is named from the archive's root."""
        return self.kind == "hardlink"


def md5sum(path: Path, *, desc: str = "md5") -> str:
    """The MD5 of a file, read in chunks with a progress bar on a terminal."""
    digest = hashlib.md5(usedforsecurity=False)
    size = path.stat().st_size
    with (
        open(path, "rb") as handle,
        tqdm(
            total=size, unit="B", unit_scale=True, desc=desc, disable=not sys.stderr.isatty()
        ) as bar,
    ):
        while block := handle.read(CHUNK):
            digest.update(block)
            bar.update(len(block))
    return digest.hexdigest()


def list_members(archive: Path) -> list[Member]:
    """The members of a .tar(.gz) or .zip archive; a corrupt or unknown one is an error."""
    if not archive.is_file():
        raise ArchiveError(f"archive not found: {archive}")
    try:
        if zipfile.is_zipfile(archive):
            with zipfile.ZipFile(archive) as handle:
                return [Member(i.filename, i.file_size, zip_kind(i)) for i in handle.infolist()]
        with tarfile.open(archive) as handle:
            return [
                Member(m.name, m.size, tar_kind(m), m.linkname if m.issym() or m.islnk() else None)
                for m in handle.getmembers()
            ]
    except (tarfile.TarError, zipfile.BadZipFile, EOFError, OSError) as error:
        reason = " ".join(str(error).split()) or type(error).__name__
        raise ArchiveError(
            f"cannot read {archive} as a .tar.gz or .zip archive: {reason}"
        ) from None


def tar_kind(member: tarfile.TarInfo) -> Kind:
    if member.isreg():
        return "file"
    if member.isdir():
        return "dir"
    if member.issym():
        return "symlink"
    return "hardlink" if member.islnk() else "other"


def zip_kind(info: zipfile.ZipInfo) -> Kind:
    """A zip entry's kind; Unix zips mark a symbolic link in the high bits of its attributes."""
    if info.is_dir():
        return "dir"
    kind = stat.S_IFMT(info.external_attr >> 16)  # 0: no type recorded (DOS zips, writestr)
    if kind == stat.S_IFLNK:
        return "symlink"
    return "file" if kind in (0, stat.S_IFREG) else "other"


def unsafe_reason(member: Member) -> str | None:
    """Why ``member`` would land outside the extraction folder, or None when it is safe."""
    name = member.name.replace("\\", "/")
    if name.startswith("/") or (len(name) > 1 and name[1] == ":"):
        return "an absolute path"
    if ".." in name.split("/"):
        return "a '..' part"
    if member.link is not None:
        target = member.link.replace("\\", "/")
        if target.startswith("/"):
            return f"a link to the absolute path {printable(member.link)}"
        base = "" if member.hard else posixpath.dirname(name)
        resolved = posixpath.normpath(posixpath.join(base, target))
        if resolved == ".." or resolved.startswith("../"):
            return f"a link out of the folder ({printable(member.link)})"
    return None


def check_members(archive: Path, members: list[Member]) -> None:
    """Refuse the whole archive at its first unsafe member, or one more than
    :data:`MAX_DEPTH` folders deep (nothing is extracted)."""
    for member in members:
        reason = unsafe_reason(member)
        if reason is not None:
            raise ArchiveError(
                f"refusing {archive}: member {printable(member.name)!r} has {reason} "
                "(it would be written outside the output folder)"
            )
        depth = sum(part not in ("", ".") for part in member.name.replace("\\", "/").split("/"))
        if depth - (not member.is_dir) > MAX_DEPTH:
            raise ArchiveError(
                f"refusing {archive}: member {printable(member.name)!r} is "
                f"{depth - (not member.is_dir)} folders deep (at most {MAX_DEPTH})"
            )


def check_disk_space(folder: Path, needed: int) -> None:
    """Refuse when the file system of ``folder`` has less free space than ``needed`` bytes."""
    probe = folder
    while not probe.exists():
        probe = probe.parent
    free = shutil.disk_usage(probe).free
    if needed * DISK_MARGIN > free:
        raise ArchiveError(
            f"not enough disk space in {probe}: the archive unpacks to {_gb(needed)}, "
            f"{_gb(free)} free"
        )


def download(url: str, destination: Path, *, expected_md5: str) -> Path:
    """Fetch ``url`` to ``destination``, resuming ``destination.part`` with an HTTP Range
    request, with a progress bar; the MD5 must match before the file takes its final name."""
    partial = destination.with_name(destination.name + ".part")
    destination.parent.mkdir(parents=True, exist_ok=True)
    have = partial.stat().st_size if partial.exists() else 0
    request = urllib.request.Request(url, headers={"Range": f"bytes={have}-"} if have else {})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:  # noqa: S310 - fixed URLs
            if have and response.status != 206:
                have = 0  # the server ignored the range: start over
            length = response.headers.get("Content-Length")
            total = have + int(length) if length and length.isdigit() else None
            with (
                open(partial, "ab" if have else "wb") as handle,
                tqdm(
                    total=total, initial=have, unit="B", unit_scale=True, desc=destination.name
                ) as bar,
            ):
                while block := response.read(CHUNK):
                    handle.write(block)
                    bar.update(len(block))
    except urllib.error.HTTPError as error:
        if error.code == 416 and have:  # the range starts at the end: the file is complete
            pass
        else:
            raise NearsightError(
                f"cannot download {url}: HTTP {error.code} {error.reason}"
            ) from None
    except (urllib.error.URLError, TimeoutError, ConnectionError) as error:
        reason = getattr(error, "reason", None) or error
        raise NearsightError(
            f"cannot download {url}: {reason} (run again to resume from {partial})"
        ) from None
    actual = md5sum(partial, desc="verify")
    if actual != expected_md5:
        partial.unlink()
        raise NearsightError(
            f"downloaded {url} has MD5 {actual}, expected {expected_md5}: removed it, try again"
        )
    os.replace(partial, destination)
    return destination


def _gb(size: float) -> str:
    return f"{size / 1e9:.2f} GB"
