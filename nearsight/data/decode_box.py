"""The decode box: untrusted image bytes are decoded in worker processes that run under an
address-space limit and a wall-time limit, and only the pixels the model needs come back.

Image decoders are where a small file turns into a large allocation: a 1x1 TIFF whose tags
all point at one 9 MB region is copied once per tag while Pillow reads its header, before any
pixel budget can be checked. An estimate made before decoding cannot close that class; a limit
on what the decoding process really maps can. So (as Pillow's security notes advise for
untrusted input, and as image services bound their decoders per process):

- a small pool of warm workers (:mod:`nearsight.data.decode_worker`, each a fresh interpreter:
  nothing is forked from a threaded server) decodes one image at a time; each caps its own
  address space (RLIMIT_AS) at what it maps after its imports plus ``memory_mb``;
- the box waits at most ``timeout_s`` for an answer; a worker that is late, runs out of
  memory or dies is killed and replaced, and that one image gets an :class:`ImageLoadError`
  (one line: the REST API answers 415, the CLI exits 2, a build skips and names the file);
- a worker answers with the upright RGB image cut and resized to the model's short side
  (:func:`nearsight.models.preprocess.fit_short_side`): at most ``short x 16 short`` pixels,
  checked before they are read, so the caller's memory never depends on what a file holds.

A server charges its clients for what their images cost (:func:`charge_with`,
nearsight/data/decode_charges.py): a client whose images hit the limits waits before its next
decode, and runs on a share that leaves a worker to the others.

:func:`shared_box` is the process's box, grown to the callers' concurrency; with
``NEARSIGHT_TRUSTED_IMAGES=1`` (or :func:`set_trusted`) it is None and callers decode in
process, for folders the operator vouches for.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from PIL import Image

from nearsight.core.errors import NearsightError
from nearsight.data import decode_worker as wire
from nearsight.data.decode_charges import DecodeCharging, DecodeTicket
from nearsight.data.decode_pool import START_TIMEOUT_S, WorkerPool, killed_outside
from nearsight.data.decode_process import Worker
from nearsight.data.images import ImageLoadError, load_image_sized
from nearsight.data.pipe_io import Late, receive_by, send_by
from nearsight.models.preprocess import MAX_ASPECT_RATIO, fit_short_side

# a worker's address space above its imports: the decode budget (images.MAX_DECODE_BYTES, 512 MB,
# which an image's header is checked against first) and room for the resize and the answer
DEFAULT_MEMORY_MB = 768
MIN_MEMORY_MB = 64
DEFAULT_TIMEOUT_S = 30.0  # a 64-megapixel 16-bit PNG takes a few seconds on a loaded core
TRUSTED_ENV = "NEARSIGHT_TRUSTED_IMAGES"


@dataclass(frozen=True)
class Fitted:
    """A decoded image as the model needs it, and the size it had upright before fitting."""

    image: Image.Image  # RGB, short side ``short``, long side at most 16 short sides
    loaded_size: tuple[int, int]  # (width, height) upright at full size, for the catalog


class DecodeBox:
    """``workers`` warm decoding processes, each limited to ``memory_mb`` MB of address space
    above its imports and ``timeout_s`` seconds an image (see the module docstring).
    ``charging`` (a server's: nearsight/data/decode_charges.py) admits each decode and is
    told what it cost; None serves every caller alike."""

    def __init__(
        self,
        workers: int = 2,
        *,
        memory_mb: int = DEFAULT_MEMORY_MB,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        charging: DecodeCharging | None = None,
    ):
        if workers < 1:
            raise NearsightError(f"a decode box needs at least 1 worker, got {workers}")
        self.memory_mb, self.timeout_s = int(memory_mb), float(timeout_s)
        self.charging = charging
        self._pool = WorkerPool(self.memory_mb, self.timeout_s)
        self.grow(workers)

    @property
    def workers(self) -> int:
        return len(self._pool)

    @property
    def replaced(self) -> int:
        """Workers killed (late, out of memory, crashed) and started again."""
        return self._pool.replaced

    @property
    def pids(self) -> list[int]:
        """The process ids of its workers (operators and tests signal them)."""
        return self._pool.pids

    def grow(self, workers: int) -> None:
        """Start workers until there are ``workers`` (they warm up in the background)."""
        self._pool.grow(workers)

    def warm(self, timeout_s: float = START_TIMEOUT_S) -> None:
        """Wait until the idle workers have started (a server calls this before it listens:
        the wait for a worker counts within each image's deadline)."""
        self._pool.warm(timeout_s)

    def close(self) -> None:
        self._pool.close()

    def __enter__(self) -> DecodeBox:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- decoding ---------------------------------------------------------------------------

    def decode_bytes(
        self,
        data: bytes,
        name: str,
        short: int,
        interpolation: str = "bilinear",
        meanwhile: Callable[[], None] | None = None,
    ) -> Fitted:
        """An uploaded file's bytes, decoded in a worker and fitted to ``short`` (the model's
        resize); ``name`` is what an error calls it. ``meanwhile()`` runs in this thread while
        the worker decodes."""
        if not data:
            raise ImageLoadError.for_file(name, "the file is empty")
        return self._run({"name": name}, data, name, short, interpolation, meanwhile)

    def decode_file(
        self, path: str | os.PathLike[str], short: int, interpolation: str = "bilinear"
    ) -> Fitted:
        """An image file, read and decoded by a worker (errors name ``path``)."""
        name = os.fspath(path)
        header = {"name": name, "path": os.path.abspath(name)}
        return self._run(header, b"", name, short, interpolation)

    def _run(self, header: dict, data: bytes, name: str, short: int, interpolation: str,
             meanwhile: Callable[[], None] | None = None) -> Fitted:  # fmt: skip
        if self._pool.closed:
            raise NearsightError("the decode box is closed")
        charging = self.charging
        ticket = charging.admit(self.workers) if charging is not None else None
        cost = _Cost()
        try:
            return self._decode(header, data, name, short, interpolation, meanwhile, ticket, cost)
        finally:
            if charging is not None and ticket is not None:
                charging.settle(ticket, cost.seconds, cost.failed)

    def _decode(self, header: dict, data: bytes, name: str, short: int, interpolation: str,
                meanwhile: Callable[[], None] | None, ticket: DecodeTicket | None,
                cost: _Cost) -> Fitted:  # fmt: skip
        header = {**header, "short": int(short), "interpolation": interpolation}
        # the deadline counts the wait for a worker too: a busy or restarting box is late
        deadline = time.monotonic() + self.timeout_s
        message = json.dumps(header).encode()
        head = wire.REQUEST_HEAD.pack(len(message)) + message + wire.PAYLOAD_HEAD.pack(len(data))
        priority = ticket is None or not ticket.restricted
        worker: Worker | None = None
        try:
            for attempt in (1, 2):
                worker = self._pool.take(deadline, name, priority)
                cost.start()
                try:
                    send_by(worker.to_worker, (head, data), deadline)  # one message, one wake-up
                    if meanwhile is not None:
                        meanwhile()
                        meanwhile = None
                    fitted = self._answer(worker, name, short, deadline)
                    break
                except (BrokenPipeError, EOFError):
                    # killed from outside while idle (it never read the request, or died by
                    # SIGKILL, which no decoder sends itself): not this file's doing; once
                    # more with a fresh worker, within the same deadline
                    if attempt == 2 or not killed_outside(worker):
                        raise
                    dead, worker = worker, None
                    self._pool.replace(dead)
        except Late:
            self._retire(worker, cost)
            raise ImageLoadError.for_file(
                name, f"decoding it took longer than the limit of {self.timeout_s:g} s"
            ) from None
        except (EOFError, OSError):
            self._retire(worker, cost)
            raise ImageLoadError.for_file(
                name,
                f"the decoder stopped on it (over the limit of {self.memory_mb} MB of "
                "memory, or a corrupt file)",
            ) from None
        except _OutOfMemory:
            self._retire(worker, cost)
            raise ImageLoadError.for_file(
                name, f"decoding it needs more than the limit of {self.memory_mb} MB of memory"
            ) from None
        except _Refused as refusal:  # the worker is fine: only the file was bad
            cost.fail()
            self._pool.give_back(worker)  # type: ignore[arg-type]
            raise ImageLoadError.for_file(name, str(refusal)) from None
        except BaseException:
            if worker is not None:
                self._pool.replace(worker)
            raise
        cost.stop()
        self._pool.give_back(worker)  # type: ignore[arg-type]
        return fitted

    def _retire(self, worker: Worker | None, cost: _Cost) -> None:
        """The image failed on ``worker`` (late, out of memory, crashed): the client is charged
        the time it held it, and it is replaced."""
        if worker is not None:
            cost.fail()
            self._pool.replace(worker)

    def _answer(self, worker: Worker, name: str, short: int, deadline: float) -> Fitted:
        kind = receive_by(worker.from_worker, 1, deadline)
        if kind in (b"E", b"M"):
            (length,) = wire.TEXT_HEAD.unpack(
                receive_by(worker.from_worker, wire.TEXT_HEAD.size, deadline)
            )
            if length > 4096:
                raise EOFError
            text = receive_by(worker.from_worker, length, deadline).decode("utf-8", "replace")
            raise _OutOfMemory if kind == b"M" else _Refused(text)
        if kind != b"P":
            raise EOFError
        width, height, loaded_w, loaded_h = wire.PIXELS_HEAD.unpack(
            receive_by(worker.from_worker, wire.PIXELS_HEAD.size, deadline)
        )
        if min(width, height) != short or max(width, height) > MAX_ASPECT_RATIO * short:
            raise EOFError  # not what a fitted image is: never read an unbounded answer
        pixels = receive_by(worker.from_worker, width * height * 3, deadline)
        return Fitted(Image.frombytes("RGB", (width, height), pixels), (loaded_w, loaded_h))


class _Cost:
    """How long one image held a worker, and whether it failed (what its client is charged)."""

    def __init__(self) -> None:
        self.started: float | None = None
        self.seconds = 0.0
        self.failed = False

    def start(self) -> None:
        self.started = time.monotonic()

    def stop(self) -> None:
        if self.started is not None:
            self.seconds = time.monotonic() - self.started

    def fail(self) -> None:
        self.stop()
        self.failed = True


class _OutOfMemory(Exception):
    pass


class _Refused(Exception):
    """The worker's own one-line refusal (unreadable file, over the pixel budget)."""


# -- the process's box ----------------------------------------------------------------------

_SHARED: DecodeBox | None = None
_SHARED_LOCK = threading.Lock()
_TRUSTED: bool | None = None  # None: from the environment
_SETTINGS = {"memory_mb": DEFAULT_MEMORY_MB, "timeout_s": DEFAULT_TIMEOUT_S}
_CHARGING: DecodeCharging | None = None


def set_trusted(trusted: bool | None) -> None:
    """Decode in this process (True: the operator vouches for every image), in the box
    (False), or as ``NEARSIGHT_TRUSTED_IMAGES`` says (None, the default: the box)."""
    global _TRUSTED
    _TRUSTED = trusted


@contextlib.contextmanager
def trusting(trust: bool) -> Iterator[None]:
    """Inside, images are decoded in this process when ``trust`` (a command's
    ``--trusted-images``); the setting before is restored after, so a command run in a
    longer-lived process (the Python API, the tests) leaves the box on for what follows."""
    global _TRUSTED
    before = _TRUSTED
    if trust:
        _TRUSTED = True
    try:
        yield
    finally:
        _TRUSTED = before


def trusted() -> bool:
    if _TRUSTED is not None:
        return _TRUSTED
    return os.environ.get(TRUSTED_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def configure(*, memory_mb: int | None = None, timeout_s: float | None = None) -> None:
    """The limits of the box :func:`shared_box` starts (a running one is restarted)."""
    global _SHARED
    with _SHARED_LOCK:
        if memory_mb is not None:
            if memory_mb < MIN_MEMORY_MB:
                raise NearsightError(f"the decode memory limit must be at least "
                                     f"{MIN_MEMORY_MB} MB, got {memory_mb}")  # fmt: skip
            _SETTINGS["memory_mb"] = int(memory_mb)
        if timeout_s is not None:
            if not timeout_s > 0:
                raise NearsightError(f"the decode time limit must be positive, got {timeout_s}")
            _SETTINGS["timeout_s"] = float(timeout_s)
        if _SHARED is not None:
            _SHARED.close()
            _SHARED = None


def charge_with(charging: DecodeCharging | None) -> None:
    """Who admits and charges the shared box's decodes from now on (a server, while it serves:
    nearsight/app/serve/decode_shares.py), or nobody (None: every caller served alike)."""
    global _CHARGING
    with _SHARED_LOCK:
        _CHARGING = charging
        if _SHARED is not None:
            _SHARED.charging = charging


def charged_by() -> DecodeCharging | None:
    """Who charges the shared box's decodes now (:func:`charge_with`)."""
    return _CHARGING


def shared_box(workers: int = 1) -> DecodeBox | None:
    """This process's decode box with at least ``workers`` workers (started on first use,
    closed at exit), or None where images are trusted (:func:`set_trusted`)."""
    global _SHARED
    if trusted():
        return None
    with _SHARED_LOCK:
        if _SHARED is None:
            _SHARED = DecodeBox(workers, **_SETTINGS, charging=_CHARGING)  # type: ignore[arg-type]
            atexit.register(_SHARED.close)
            return _SHARED
        box = _SHARED
    box.grow(workers)
    return box


def close_shared_box() -> None:
    """Stop this process's box and its workers now (a later :func:`shared_box` starts a new
    one); at exit this happens by itself."""
    global _SHARED
    with _SHARED_LOCK:
        box, _SHARED = _SHARED, None
    if box is not None:
        box.close()


def fit_bytes(
    data: bytes,
    name: str,
    short: int,
    interpolation: str = "bilinear",
    meanwhile: Callable[[], None] | None = None,
) -> Fitted:
    """An untrusted file's bytes decoded and fitted to ``short``: in the shared box, or in
    this process where images are trusted. The same pixels either way. ``meanwhile()`` runs
    in this thread while the box decodes (first, where there is no box)."""
    box = shared_box()
    if box is not None:
        return box.decode_bytes(data, name, short, interpolation, meanwhile)
    if meanwhile is not None:
        meanwhile()
    image, size = load_image_sized(data, name, short)
    return Fitted(fit_short_side(image, short, interpolation), size)


def fit_file(
    path: str | os.PathLike[str], short: int, interpolation: str = "bilinear", workers: int = 1
) -> Fitted:
    """An image file decoded and fitted to ``short`` (as :func:`fit_bytes`)."""
    box = shared_box(workers)
    if box is not None:
        return box.decode_file(path, short, interpolation)
    image, size = load_image_sized(path, os.fspath(path), short)
    return Fitted(fit_short_side(image, short, interpolation), size)
