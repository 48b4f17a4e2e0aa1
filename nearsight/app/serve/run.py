"""Serving galleries until interrupted (Ctrl-C or SIGTERM): the typed job ``nearsight serve``
and ``nearsight demo`` run. The settings are checked here, before minutes of loading galleries
(one-line errors that name ``serve``'s flags); the page is nearsight/app/page/layout.py, the
server nearsight/app/serve/server.py."""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import socket
import sys
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path

from nearsight.core.errors import NearsightError

# nearsight serve's defaults (its flags show them; server.py's launch_app has the same)
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 7860
DEFAULT_MAX_UPLOAD_MB = 10.0
DEFAULT_CONCURRENCY = 2  # searches embedded at once
DEFAULT_MAX_QUEUE = 64  # events waiting in the page's queue
DEFAULT_ANALYSIS_MAX_ITEMS = 100_000  # the largest gallery analysed at start (O(N^2))
DEFAULT_MAX_CONNECTIONS = 256
DEFAULT_MAX_CLIENT_CONNECTIONS = 32
DEFAULT_HEADER_TIMEOUT_S = 10.0
DEFAULT_BODY_TIMEOUT_S = 30.0
DEFAULT_SIGN_IN_TIMEOUT_S = 5.0
DEFAULT_MAX_UNAUTHENTICATED = 64  # connections waiting without the key (a quarter of 256)
DEFAULT_WATCH_INTERVAL_S = 1.0
# the decode box's limits (nearsight/data/decode_box.py has the same; no Pillow import for --help)
DEFAULT_DECODE_MEMORY_MB = 768
DEFAULT_DECODE_TIMEOUT_S = 30.0


def serve(
    galleries: Sequence[str | os.PathLike[str]],
    *,
    model: str | os.PathLike[str] | None = None,
    host: str = DEFAULT_HOST,
    port: int = DEFAULT_PORT,
    device: str = "auto",
    api_key: str | None = None,
    api_key_file: str | os.PathLike[str] | None = None,
    max_upload_mb: float = DEFAULT_MAX_UPLOAD_MB,
    concurrency: int = DEFAULT_CONCURRENCY,
    max_queue: int = DEFAULT_MAX_QUEUE,
    analysis_max_items: int = DEFAULT_ANALYSIS_MAX_ITEMS,
    max_connections: int = DEFAULT_MAX_CONNECTIONS,
    max_client_connections: int = DEFAULT_MAX_CLIENT_CONNECTIONS,
    header_timeout: float = DEFAULT_HEADER_TIMEOUT_S,
    body_timeout: float = DEFAULT_BODY_TIMEOUT_S,
    max_filter_conditions: int | None = None,
    watch_interval: float = DEFAULT_WATCH_INTERVAL_S,
    allowed_hosts: Sequence[str] = (),
    access_log: bool = True,
    secure_cookie: bool = False,
    show_paths: bool = False,
    rerank: str | None = None,
    card_fields: Sequence[str] = (),
    forwarded_allow_ips: str = "",
    sign_in_timeout: float = DEFAULT_SIGN_IN_TIMEOUT_S,
    max_unauthenticated: int = DEFAULT_MAX_UNAUTHENTICATED,
    decode_memory_mb: int | None = None,
    decode_timeout: float | None = None,
    allow_writes: bool = False,
) -> None:
    """Serve the page and the REST API over ``galleries`` at ``host``:``port`` until Ctrl-C or
    SIGTERM (:func:`stop_on_sigterm`).
    ``api_key`` (else ``api_key_file``'s, else NEARSIGHT_API_KEY): the key every route but
    /api/health requires, needed beyond loopback (:func:`resolve_api_key`); the other settings
    are ``nearsight serve``'s flags of the same names."""
    _check_settings(port=port, max_upload_mb=max_upload_mb, concurrency=concurrency,
                    max_queue=max_queue, max_filter_conditions=max_filter_conditions,
                    max_connections=max_connections,
                    max_client_connections=max_client_connections,
                    header_timeout=header_timeout, body_timeout=body_timeout,
                    watch_interval=watch_interval,
                    analysis_max_items=analysis_max_items, sign_in_timeout=sign_in_timeout,
                    max_unauthenticated=max_unauthenticated)  # fmt: skip
    from nearsight.app.serve.clients import TrustedProxies

    TrustedProxies(forwarded_allow_ips)  # a one-line error for a name that is not an address
    _check_decode_limits(decode_memory_mb, decode_timeout)
    check_address(host, port)  # before minutes of loading galleries
    key = resolve_api_key(api_key, api_key_file, host)

    from nearsight.app.page.layout import build_app
    from nearsight.app.serve.server import launch_app, stop_app

    demo = build_app([Path(g) for g in galleries], None if model is None else Path(model),
                     device=device, concurrency=concurrency, max_queue=max_queue,
                     analysis_max_items=analysis_max_items, show_paths=show_paths,
                     rerank=rerank, card_fields=list(card_fields) or None)  # fmt: skip
    try:
        url = launch_app(demo, host=host, port=port, max_upload_mb=max_upload_mb,
                         prevent_thread_lock=True, quiet=True, api_key=key,
                         max_filter_conditions=max_filter_conditions,
                         watch_interval=watch_interval, max_connections=max_connections,
                         max_client_connections=max_client_connections,
                         body_timeout_s=body_timeout, header_timeout_s=header_timeout,
                         allowed_hosts=[name.strip() for name in allowed_hosts],
                         access_log=access_log, secure_cookie=secure_cookie,
                         forwarded_allow_ips=forwarded_allow_ips,
                         sign_in_timeout_s=sign_in_timeout,
                         max_unauthenticated=max_unauthenticated,
                         allow_writes=allow_writes)  # fmt: skip
    except OSError as error:  # the port is taken, or the address is not ours
        demo.galleries.close()
        reason = (
            "the port is in use (choose another with --port)"
            if "empty port" in str(error)
            else str(error)
        )
        raise NearsightError(f"cannot serve on {host}:{port}: {reason}") from None
    try:
        with stop_on_sigterm():
            print(f"nearsight: serving {len(demo.galleries)} gallery(ies) at {url}",
                  flush=True)  # fmt: skip
            print(f"nearsight: REST API at {url.rstrip('/')}/api (docs: /api/docs)", flush=True)
            demo.block_thread()  # until Ctrl-C or SIGTERM
    finally:
        stop_app(demo)
    print("nearsight: stopped", file=sys.stderr)


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


def _check_decode_limits(memory_mb: int | None, timeout: float | None) -> None:
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


def _check_settings(
    *,
    port: int,
    max_upload_mb: float,
    concurrency: int,
    max_queue: int,
    max_filter_conditions: int | None,
    max_connections: int,
    max_client_connections: int,
    header_timeout: float,
    body_timeout: float,
    watch_interval: float,
    analysis_max_items: int,
    sign_in_timeout: float = DEFAULT_SIGN_IN_TIMEOUT_S,
    max_unauthenticated: int = DEFAULT_MAX_UNAUTHENTICATED,
) -> None:
    """One-line errors naming ``nearsight serve``'s flags."""
    if not 0 <= port <= 65535:
        raise NearsightError(f"--port must be from 0 to 65535, got {port}")
    if not max_upload_mb > 0:
        raise NearsightError(f"--max-upload-mb must be positive, got {max_upload_mb}")
    if concurrency < 1:
        raise NearsightError(f"--concurrency must be at least 1, got {concurrency}")
    if max_queue < 1:
        raise NearsightError(f"--max-queue must be at least 1, got {max_queue}")
    if max_filter_conditions is not None and max_filter_conditions < 1:
        raise NearsightError(
            f"--max-filter-conditions must be at least 1, got {max_filter_conditions}"
        )
    if max_connections < 1:
        raise NearsightError(f"--max-connections must be at least 1, got {max_connections}")
    if max_client_connections < 1:
        raise NearsightError(
            f"--max-client-connections must be at least 1, got {max_client_connections}"
        )
    if not header_timeout > 0:
        raise NearsightError(f"--header-timeout must be positive, got {header_timeout}")
    if not body_timeout > 0:
        raise NearsightError(f"--body-timeout must be positive, got {body_timeout}")
    if not sign_in_timeout > 0:
        raise NearsightError(f"--sign-in-timeout must be positive, got {sign_in_timeout}")
    if max_unauthenticated < 1:
        raise NearsightError(f"--max-unauthenticated must be at least 1, got {max_unauthenticated}")
    if watch_interval < 0:
        raise NearsightError(f"--watch-interval must be 0 or more, got {watch_interval}")
    if analysis_max_items < 0:
        raise NearsightError(f"--analysis-max-items must be 0 or more, got {analysis_max_items}")
