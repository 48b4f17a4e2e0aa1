"""Gradio's upload route as a disk budget: ``POST /gradio_api/upload`` takes only what the page
needs, holds a bounded number of bytes per client and in all, and its files go promptly.

Gradio writes every file part of any upload to its cache and keeps it until its next sweep
(a minute or two), whatever it is. In front of that route, for each request (after the key):

- its bytes are charged as they arrive (a declared length reserves nothing), from the
  client's share (``per_client_bytes``) and from the whole (``total_bytes``), both counting
  what is on its way and what is on disk; an upload must keep to ``min_rate`` bytes a second
  after a short grace (then 408), so a trickle holds neither a share nor a connection. The
  client's own oldest files go first to make room, then other clients' files older than
  ``live_s`` (a file the page has not had time to search is never taken from its owner);
  what is still short is refused: 429 to a client that holds files itself, else 503;
- the whole form is read into memory within the body deadline, then checked: file parts
  named ``files`` only, each of at most the upload limit, each beginning as an image (JPEG,
  PNG, GIF, WebP, BMP, TIFF, PNM, AVIF/HEIF); anything else is 415 and nothing reaches the
  disk. Only then does Gradio's route see the form (from memory);
- the files Gradio names in its answer are charged to the client and deleted when older than
  ``keep_s``, or sooner when a newer upload needs their room (the page uses an upload within
  seconds of it; a search of an upload that went says so in one line).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import html
import json
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nearsight.app.serve.asgi import ASGIApp, Message, Receive, Scope, Send
from nearsight.core.errors import printable

UPLOAD_PATH = "/gradio_api/upload"
KEEP_S = 120.0  # Gradio's own sweep (delete_cache) removes files older than a minute
LIVE_S = 15.0  # an upload is searched within seconds of it: until then no one else evicts it
MIN_RATE = 16 * 1024  # bytes a second an upload must keep to, after RATE_GRACE_S
RATE_GRACE_S = 2.0
FORM_SLACK_BYTES = 16 * 1024  # the multipart envelope around the file
# how each image format nearsight reads begins (offset, bytes)
IMAGE_SIGNATURES: tuple[tuple[int, bytes], ...] = (
    (0, b"\xff\xd8\xff"),  # JPEG
    (0, b"\x89PNG\r\n\x1a\n"),
    (0, b"GIF87a"),
    (0, b"GIF89a"),
    (0, b"BM"),  # BMP
    (0, b"II*\x00"),  # TIFF, little-endian
    (0, b"MM\x00*"),  # TIFF, big-endian
    (4, b"ftyp"),  # AVIF, HEIF
)
_PNM = re.compile(rb"P[1-6]\s")
_BOUNDARY = re.compile(rb'boundary="?([^";,\s]+)"?', re.IGNORECASE)
_FILENAME = re.compile(rb'filename="([^"]*)"')
_DISPOSITION = re.compile(rb"^content-disposition:(.*)$", re.IGNORECASE | re.MULTILINE)


class UploadRefused(Exception):
    def __init__(self, status: int, message: str, retry_after: int | None = None):
        super().__init__(message)
        self.status, self.message, self.retry_after = status, message, retry_after


def is_image_start(data: bytes) -> bool:
    """Whether ``data`` begins as one of the image formats of :data:`IMAGE_SIGNATURES`."""
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return True
    if _PNM.match(data[:3]):
        return True
    return any(data[at : at + len(magic)] == magic for at, magic in IMAGE_SIGNATURES)


def check_form(body: bytes, content_type: str, max_file_bytes: int) -> int:
    """The number of files in a multipart form that holds only image files named ``files``,
    each of at most ``max_file_bytes``; :class:`UploadRefused` (415, 413 or 400) otherwise."""
    found = _BOUNDARY.search(content_type.encode("latin-1"))
    if not content_type.lower().startswith("multipart/form-data") or found is None:
        raise UploadRefused(400, "an upload is a multipart/form-data form")
    delimiter = b"--" + found.group(1)
    pieces = body.split(delimiter)
    if len(pieces) < 3 or not pieces[-1].startswith(b"--"):
        raise UploadRefused(400, "the upload form is incomplete")
    files = 0
    for piece in pieces[1:-1]:
        head, separator, content = piece.partition(b"\r\n\r\n")
        if not separator or not content.endswith(b"\r\n"):
            raise UploadRefused(400, "the upload form is malformed")
        content = content[:-2]
        disposition = _DISPOSITION.search(head)
        words = disposition.group(1) if disposition else b""
        if b'name="files"' not in words or b"filename=" not in words:
            raise UploadRefused(415, "an upload holds image files only")
        if len(content) > max_file_bytes:
            limit = max_file_bytes / 1024 / 1024
            raise UploadRefused(413, f"the upload is larger than the server's limit ({limit:g} MB)")
        if not is_image_start(content):
            name = _FILENAME.search(words)
            shown = printable(name.group(1).decode("utf-8", "replace"), 100) if name else "upload"
            raise UploadRefused(415, f"cannot read image {html.escape(shown)}: "
                                + ("the file is empty" if not content else "not an image (JPEG, "
                                   "PNG, GIF, WebP, BMP, TIFF, PNM, AVIF or HEIF)"))  # fmt: skip
        files += 1
    if not files:
        raise UploadRefused(400, "the upload form holds no file")
    return files


@dataclass
class _Stored:
    client: str
    size: int
    at: float


@dataclass
class UploadBudget:
    """The budget of one server's upload route (see the module docstring); its state is
    touched only on the server's event loop."""

    max_file_bytes: int
    per_client_bytes: int
    total_bytes: int
    body_timeout_s: float
    upload_dir: Path | None = None  # Gradio's; files Gradio names outside it are never deleted
    keep_s: float = KEEP_S
    live_s: float = LIVE_S
    min_rate: float = MIN_RATE
    reserved: collections.Counter[str] = field(default_factory=collections.Counter)
    stored: collections.OrderedDict[str, _Stored] = field(
        default_factory=collections.OrderedDict
    )  # path -> owner, oldest first

    @classmethod
    def for_limit(cls, max_file_bytes: int, body_timeout_s: float, **options: Any) -> UploadBudget:
        """Two uploads' worth per client, eight in all."""
        whole = max_file_bytes + FORM_SLACK_BYTES
        return cls(max_file_bytes, 2 * whole, 8 * whole, body_timeout_s, **options)

    def held(self, client: str | None = None) -> int:
        """Bytes reserved and on disk, of ``client`` or of everyone."""
        on_disk = sum(s.size for s in self.stored.values() if client in (None, s.client))
        return on_disk + (sum(self.reserved.values()) if client is None else self.reserved[client])

    def expire(self, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        for path, stored in list(self.stored.items()):
            if now - stored.at > self.keep_s:
                self._delete(path)

    def reserve(self, client: str, length: int) -> None:
        """Room for ``length`` more bytes from ``client``, or :class:`UploadRefused`."""
        self.expire()
        for path, stored in list(self.stored.items()):  # its own oldest first
            if self.held(client) + length <= self.per_client_bytes:
                break
            if stored.client == client:
                self._delete(path)
        if self.held(client) + length > self.per_client_bytes:
            raise UploadRefused(429, "your uploads in progress fill your share of the server's "
                                "upload space: retry when they are done", retry_after=1)  # fmt: skip
        now = time.monotonic()
        for path, stored in list(self.stored.items()):  # then others' oldest, once searched
            if self.held() + length <= self.total_bytes:
                break
            if now - stored.at >= self.live_s:
                self._delete(path)
        if self.held() + length > self.total_bytes:
            if self.held(client) > 0:  # it holds files of its own: it waits for them to go
                raise UploadRefused(429, "your uploads fill your share of the server's upload "
                                    "space while it is full: retry", retry_after=2)  # fmt: skip
            raise UploadRefused(503, "the server's upload space is full: retry", retry_after=2)
        self.reserved[client] += length

    def release(self, client: str, length: int) -> None:
        self.reserved[client] -= length
        if self.reserved[client] <= 0:
            del self.reserved[client]

    def keep(self, client: str, paths: list[str]) -> None:
        """Charge the files Gradio stored for ``client`` to it."""
        for path in paths:
            if not self._ours(path):
                continue
            owner = self.stored.get(path)
            if owner is not None and owner.client != client:
                continue  # the same bytes as another client's file (Gradio names by hash)
            with contextlib.suppress(OSError):
                self.stored[path] = _Stored(client, os.path.getsize(path), time.monotonic())
                self.stored.move_to_end(path)

    def clear(self) -> None:
        for path in list(self.stored):
            self._delete(path)

    def in_upload_folder(self, path: str) -> bool:
        """Whether ``path`` resolves inside the upload folder (links and ``..`` followed)."""
        return self._ours(path)

    def _ours(self, path: str) -> bool:
        if self.upload_dir is None:
            return False
        try:
            return Path(path).resolve().is_relative_to(self.upload_dir.resolve())
        except (OSError, ValueError):
            return False

    def _delete(self, path: str) -> None:
        self.stored.pop(path, None)
        folder = Path(path).parent
        with contextlib.suppress(OSError):
            os.unlink(path)
        if self.upload_dir is not None and folder.resolve() != self.upload_dir.resolve():
            with contextlib.suppress(OSError):
                folder.rmdir()  # Gradio's folder for the file's hash, once empty

    async def handle(self, app: ASGIApp, scope: Scope, receive: Receive, send: Send,
                     client: str) -> None:  # fmt: skip
        """Serve one request of the upload route within the budget."""
        headers = dict(scope.get("headers", ()))
        length = headers.get(b"content-length", b"").decode("latin-1")
        if not length.isdigit():
            raise UploadRefused(411, "an upload needs a Content-Length")
        length = int(length)
        if length > self.max_file_bytes + FORM_SLACK_BYTES:
            limit = self.max_file_bytes / 1024 / 1024
            raise UploadRefused(413, f"the upload is larger than the server's limit ({limit:g} MB)")
        received = {"bytes": 0}  # charged as they arrive
        try:
            body = await self._read(receive, length, client, received)
            check_form(body, headers.get(b"content-type", b"").decode("latin-1"),
                       self.max_file_bytes)  # fmt: skip
            answer = await _replay(app, scope, body, send)
        finally:
            self.release(client, received["bytes"])
        with contextlib.suppress(ValueError, TypeError):
            paths = json.loads(answer)
            if isinstance(paths, list):
                self.keep(client, [p for p in paths if isinstance(p, str)])

    async def _read(self, receive: Receive, length: int, client: str,
                    received: dict[str, int]) -> bytes:  # fmt: skip
        """The body, each chunk charged to ``client`` as it arrives (``received["bytes"]``:
        what is charged), within the body deadline and the minimum rate."""
        chunks: list[bytes] = []
        start = time.monotonic()
        deadline = start + self.body_timeout_s
        while True:
            # the moment the upload falls below the minimum rate, if nothing more comes
            slow = start + RATE_GRACE_S + received["bytes"] / self.min_rate
            try:
                async with asyncio.timeout(min(deadline, slow) - time.monotonic()):
                    message = await receive()
            except TimeoutError:
                if time.monotonic() < deadline:
                    raise UploadRefused(408, f"the upload arrived slower than "
                                        f"{self.min_rate / 1024:g} KB/s") from None  # fmt: skip
                raise UploadRefused(
                    408, f"the upload did not arrive within {self.body_timeout_s:g} s"
                ) from None
            if message["type"] != "http.request":
                raise UploadRefused(400, "the client left during the upload")
            chunk = message.get("body", b"")
            if received["bytes"] + len(chunk) > length:
                raise UploadRefused(400, "the upload is longer than its Content-Length")
            self.reserve(client, len(chunk))
            received["bytes"] += len(chunk)
            chunks.append(chunk)
            if not message.get("more_body"):
                return b"".join(chunks)


async def _replay(app: ASGIApp, scope: Scope, body: bytes, send: Send) -> bytes:
    """Run ``app`` on a body already read; returns the answer's body (a 2xx's only)."""
    given = {"sent": False}
    answer: dict[str, Any] = {"status": 0, "body": []}

    async def receive() -> Message:
        if not given["sent"]:
            given["sent"] = True
            return {"type": "http.request", "body": body, "more_body": False}
        await asyncio.Event().wait()  # no disconnect until the answer is sent
        return {"type": "http.disconnect"}  # pragma: no cover

    async def capture(message: Message) -> None:
        if message["type"] == "http.response.start":
            answer["status"] = message["status"]
        elif message["type"] == "http.response.body" and 200 <= answer["status"] < 300:
            answer["body"].append(message.get("body", b""))
        await send(message)

    await app(scope, receive, capture)
    return b"".join(answer["body"])
