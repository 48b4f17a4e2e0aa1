"""One process of the decode box (:mod:`nearsight.data.decode_box`): decodes untrusted image
bytes under an address-space limit and answers with only the pixels the model needs.

Started as ``python -m nearsight.data.decode_worker MEMORY_MB CPU_S`` by the box, never by
hand. It imports the decoders first, then limits its own address space (RLIMIT_AS) to what it
holds after the imports plus MEMORY_MB, forbids writing files and core dumps, and says it is
ready; each request may use CPU_S more seconds of CPU (RLIMIT_CPU, a backstop to the box's
wall-time limit).
Then, one request at a time on stdin (a JSON header and the file's bytes, or a path), it
decodes through :func:`nearsight.data.images.load_image_sized` (EXIF orientation is read
here, inside the limit), cuts and resizes to the model's short side
(:func:`nearsight.models.preprocess.fit_short_side`) and writes back the RGB pixels. A
decoder that asks past the limit gets a MemoryError: the worker reports it and exits, and the
box starts a fresh one. The wall-time limit is the box's: it kills a worker that is late.

Wire format (both ways, little-endian): request = u32 header length, JSON header, u64 payload
length, payload; answer = one byte (``P`` pixels, ``E`` error, ``M`` out of memory), then for
``P`` u32 width, u32 height, u32 loaded width, u32 loaded height and width*height*3 bytes, for
``E``/``M`` u32 length and a UTF-8 message.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import struct
import sys

from nearsight.data.pipe_io import MAX_CHUNK, advance

REQUEST_HEAD = struct.Struct("<I")
PAYLOAD_HEAD = struct.Struct("<Q")
PIXELS_HEAD = struct.Struct("<IIII")
TEXT_HEAD = struct.Struct("<I")
READY = b"R"
MAX_HEADER_BYTES = 64 * 1024
# libjpeg writes 10 scans for a progressive colour JPEG, optimisers a few dozen at most
MAX_JPEG_SCANS = 100


def _read_exactly(fd: int, count: int) -> bytes:
    chunks, left = [], count
    while left:
        chunk = os.read(fd, min(left, MAX_CHUNK))
        if not chunk:
            raise EOFError
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _write_all(fd: int, *parts: bytes) -> None:
    """``parts`` back to back, in one ``writev`` where the pipe has room (one wake-up for
    the box)."""
    views = [memoryview(part) for part in parts if part]
    while views:
        advance(views, os.writev(fd, views))


def address_space_bytes() -> int:
    """This process's mapped address space now (VmSize), in bytes."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    raise OSError("no VmSize in /proc/self/status")


def _limit(memory_bytes: int) -> None:
    """Cap the address space at what is mapped now plus ``memory_bytes``; no files, no cores."""
    ceiling = address_space_bytes() + memory_bytes
    resource.setrlimit(resource.RLIMIT_AS, (ceiling, ceiling))
    resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def _text(kind: bytes, message: str) -> bytes:
    encoded = " ".join(message.split()).encode("utf-8", "replace")[:4096]
    return kind + TEXT_HEAD.pack(len(encoded)) + encoded


def _cpu_budget(seconds: float) -> None:
    """A kernel backstop to the box's wall-time limit: ``seconds`` more of CPU, then SIGXCPU
    (a worker whose box is gone cannot decode forever)."""
    used = resource.getrusage(resource.RUSAGE_SELF)
    soft = int(used.ru_utime + used.ru_stime + seconds) + 1
    _, hard = resource.getrlimit(resource.RLIMIT_CPU)
    resource.setrlimit(resource.RLIMIT_CPU, (soft, hard))


def _regular_file(path: str, name: str) -> bytes:
    """The bytes of ``path`` if it is a regular file, opened without blocking (a FIFO, a
    device or /dev/stdin would hold the worker until the box's deadline)."""
    import stat

    from nearsight.data.images import ImageLoadError

    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
    except FileNotFoundError:
        raise ImageLoadError.for_file(name, "no such file") from None
    except OSError as error:
        raise ImageLoadError.for_file(name, (error.strerror or str(error)).lower()) from None
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise ImageLoadError.for_file(name, "it is a folder, not an image file")
        if not stat.S_ISREG(mode):
            raise ImageLoadError.for_file(name, "not a regular file")
        with os.fdopen(fd, "rb", closefd=False) as handle:
            return handle.read()
    except OSError as error:
        raise ImageLoadError.for_file(name, error.strerror or str(error)) from None
    finally:
        os.close(fd)


def check_scans(data: bytes, name: str) -> None:
    """Refuse a JPEG of more scans than an encoder writes (a progressive JPEG repeating its
    scans makes each a full pass over the image: thousands of passes of a small file)."""
    from nearsight.data.images import ImageLoadError

    if data[:2] == b"\xff\xd8":
        scans = data.count(b"\xff\xda")  # a start of scan (0xFF in coded data is stuffed)
        if scans > MAX_JPEG_SCANS:
            raise ImageLoadError.for_file(name, f"a JPEG of {scans} scans; an encoder writes at "
                                          f"most {MAX_JPEG_SCANS}")  # fmt: skip


def _serve(read_fd: int, write_fd: int, cpu_seconds: float) -> None:
    from nearsight.data.images import ImageLoadError, load_image_sized
    from nearsight.models.preprocess import fit_short_side

    while True:
        try:
            (size,) = REQUEST_HEAD.unpack(_read_exactly(read_fd, REQUEST_HEAD.size))
        except EOFError:  # the box closed our stdin: done
            return
        if size > MAX_HEADER_BYTES:
            return
        header = json.loads(_read_exactly(read_fd, size))
        (length,) = PAYLOAD_HEAD.unpack(_read_exactly(read_fd, PAYLOAD_HEAD.size))
        _cpu_budget(cpu_seconds)
        try:
            data = _read_exactly(read_fd, length)
            name = str(header["name"])
            short, interpolation = int(header["short"]), str(header["interpolation"])
            source = data if header.get("path") is None else _regular_file(header["path"], name)
            check_scans(source, name)
            image, loaded = load_image_sized(source, name, short)
            del data, source
            fitted = fit_short_side(image, short, interpolation)
            del image
            pixels = fitted.tobytes()
            answer = b"P" + PIXELS_HEAD.pack(*fitted.size, *loaded)
            del fitted
            _write_all(write_fd, answer, pixels)
            del pixels
        except ImageLoadError as error:
            if error.reason == "not enough memory to decode it":
                _write_all(write_fd, _text(b"M", error.reason or str(error)))
                return  # a fresh worker for the next request: this one's heap is suspect
            _write_all(write_fd, _text(b"E", error.reason or str(error)))
        except MemoryError:
            _write_all(write_fd, _text(b"M", "out of memory"))
            return


def main(argv: list[str]) -> int:
    memory_bytes, cpu_seconds = int(argv[0]) * 2**20, float(argv[1])
    # the protocol owns the real stdout: anything a library prints goes to stderr instead
    read_fd, write_fd = os.dup(0), os.dup(1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    import numpy  # noqa: F401  (every decoder's import, before the limit is measured)
    from PIL import Image, TiffImagePlugin, WebPImagePlugin  # noqa: F401

    import nearsight.data.images  # noqa: F401
    import nearsight.models.preprocess  # noqa: F401

    Image.init()
    _limit(memory_bytes)
    _write_all(write_fd, READY)
    with contextlib.suppress(BrokenPipeError, EOFError):
        _serve(read_fd, write_fd, cpu_seconds)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
