"""What serving needs before and around the server itself: the API key resolved, the address
checked before minutes of loading galleries, the decode box's limits, and SIGTERM as Ctrl-C.
The server is assembled and run by nearsight/app/server_app.py."""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

from nearsight.core.errors import NearsightError


@contextlib.contextmanager
def stop_on_sigterm() -> Iterator[None]:
    """Within the block, SIGTERM interrupts the main thread as Ctrl-C does (KeyboardInterrupt),
    so that the server closes its galleries and exits 0. SIGTERM is what service managers,
    ``kill`` and the tests send; a job started with ``&`` ignores SIGINT, so Ctrl-C's signal
    alone cannot stop it. Elsewhere than the main thread (Python can only handle signals
    there) the block runs unchanged."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def resolve_api_key(
    given: str | None, key_file: str | os.PathLike[str] | None, host: str
) -> str | None:
    """The API key: ``given``, else the contents of ``key_file``, else the NEARSIGHT_API_KEY
    environment variable; None when there is none. Beyond localhost one is required, and long
    enough (nearsight.app.serve.auth.check_key)."""
    from nearsight.app.serve.auth import API_KEY_ENV, check_key

    key = given
    if key is None and key_file is not None:
        try:
            key = Path(key_file).read_text().strip()
        except (OSError, UnicodeDecodeError) as error:
            reason = getattr(error, "strerror", None) or "not text"
            raise NearsightError(f"cannot read --api-key-file {key_file}: {reason}") from None
        if not key:
            raise NearsightError(f"--api-key-file {key_file} is empty")
    if key is None:
        key = os.environ.get(API_KEY_ENV)
    key = (key or "").strip() or None
    check_key(key, host)
    return key


def check_address(host: str, port: int) -> None:
    """NearsightError unless ``host``:``port`` can be listened on. Gradio reports every failure
    to listen (an unknown host, an address that is not this machine's) as "no empty port"."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except (socket.gaierror, UnicodeError) as error:
        reason = getattr(error, "strerror", None) or str(error)
        raise NearsightError(f"cannot serve on {host}:{port}: unknown host ({reason})") from None
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
        try:
            probe.bind(address)
        except OSError as error:
            reason = (
                "the port is in use (choose another with --port)"
                if error.errno == errno.EADDRINUSE
                else error.strerror or str(error)
            )
            raise NearsightError(f"cannot serve on {host}:{port}: {reason}") from None


def check_decode_limits(memory_mb: int | None, timeout: float | None) -> None:
    """--decode-memory-mb and --decode-timeout, checked, for the decode box the server starts
    (nearsight.data.decode_box: every upload is decoded there)."""
    from nearsight.data import decode_box

    if memory_mb is not None and memory_mb < decode_box.MIN_MEMORY_MB:
        raise NearsightError(
            f"--decode-memory-mb must be at least {decode_box.MIN_MEMORY_MB}, got {memory_mb}"
        )
    if timeout is not None and not timeout > 0:
        raise NearsightError(f"--decode-timeout must be positive, got {timeout}")
    decode_box.configure(memory_mb=memory_mb, timeout_s=timeout)
