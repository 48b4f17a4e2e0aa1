"""Starting the page's server: Gradio's launch with the safety settings, the REST API mounted
at ``/api``, the guard (nearsight/app/serve/guard.py) in front of every route and the connection
policy (nearsight/app/serve/slow_clients.py) under every connection.

What a running server holds is a :class:`ServedApp` on the FastAPI app's state
(``demo.app.state.nearsight``, :func:`served`); :func:`stop_app` stops it all."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import gradio as gr
from fastapi import FastAPI
from starlette.middleware import Middleware
from starlette.routing import Mount

from nearsight.app.rest import API_PREFIX, FORM_SLACK_BYTES, close_rest_app, make_rest_app
from nearsight.app.serve.api_first import ApiFirst
from nearsight.app.serve.auth import SESSION_S, Sessions
from nearsight.app.serve.clients import TrustedProxies
from nearsight.app.serve.fair_queue import share_fairly
from nearsight.app.serve.galleries import Galleries
from nearsight.app.serve.guard import (
    DEFAULT_BODY_TIMEOUT_S,
    DEFAULT_MAX_UNAUTHENTICATED,
    DEFAULT_SIGN_IN_TIMEOUT_S,
    Guard,
    GuardSettings,
)
from nearsight.app.serve.hosts import AllowedHosts
from nearsight.app.serve.metrics import ServerMetrics
from nearsight.app.serve.queue_files import hold_queue_files
from nearsight.app.serve.slow_clients import (
    DEFAULT_HEADER_TIMEOUT_S,
    DEFAULT_MAX_PER_CLIENT,
    KEEP_ALIVE_S,
    ConnectionPolicy,
    install,
)
from nearsight.app.serve.uploads import UploadBudget
from nearsight.data.decode_box import shared_box

if TYPE_CHECKING:  # the page module imports this one's settings
    from nearsight.app.page.layout import PageBlocks

DEFAULT_MAX_UPLOAD_MB = 10.0
DEFAULT_MAX_CONNECTIONS = 256  # open connections beyond this get 503 (uvicorn's limit_concurrency)
# Sessions whose state Gradio keeps (least recently used dropped first). Every call of the API
# over plain HTTP is a new session holding a copy of every component's config (docs/decisions.md):
# Gradio's default of 10000 let a busy API client grow the server by far too much.
STATE_SESSIONS = 1000
SYSTEM_FONTS = ("system-ui", "Segoe UI", "Roboto", "Helvetica Neue", "Arial", "sans-serif")
MONO_FONTS = ("ui-monospace", "SFMono-Regular", "Menlo", "Consolas", "monospace")


@dataclass
class ServedApp:
    """What :func:`launch_app` started besides Gradio's own server."""

    url: str
    galleries: Galleries
    rest: FastAPI
    guard: GuardSettings
    connections: ConnectionPolicy


def system_theme() -> gr.themes.Base:
    """Gradio's default look with fonts the browser already has (no font download at all)."""
    return gr.themes.Default(
        font=[gr.themes.Font(name) for name in SYSTEM_FONTS],
        font_mono=[gr.themes.Font(name) for name in MONO_FONTS],
    )


def served(demo: gr.Blocks) -> ServedApp:
    """The :class:`ServedApp` of a Blocks started by :func:`launch_app`."""
    return demo.app.state.nearsight


def stop_app(demo: gr.Blocks) -> None:
    """Stop the server of ``demo``, its REST API's batchers and the page's background work."""
    demo.close(verbose=False)
    app = served(demo)
    if app.guard.uploads is not None:
        app.guard.uploads.clear()
    close_rest_app(app.rest)
    app.galleries.close()


def launch_app(
    demo: PageBlocks,
    *,
    host: str = "127.0.0.1",
    port: int = 7860,
    max_upload_mb: float = DEFAULT_MAX_UPLOAD_MB,
    prevent_thread_lock: bool = False,
    quiet: bool = False,
    api_key: str | None = None,
    max_filter_conditions: int | None = None,
    watch_interval: float = 0.0,
    max_connections: int = DEFAULT_MAX_CONNECTIONS,
    max_client_connections: int = DEFAULT_MAX_PER_CLIENT,
    body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S,
    header_timeout_s: float = DEFAULT_HEADER_TIMEOUT_S,
    keep_alive_s: float = KEEP_ALIVE_S,
    allowed_hosts: Sequence[str] = (),
    access_log: bool = False,
    secure_cookie: bool = False,
    session_s: float = SESSION_S,
    forwarded_allow_ips: str = "",
    sign_in_timeout_s: float = DEFAULT_SIGN_IN_TIMEOUT_S,
    max_unauthenticated: int = DEFAULT_MAX_UNAUTHENTICATED,
    allow_writes: bool = False,
) -> str:
    """Start the server with the safety settings and the REST API (nearsight/app/rest/) mounted at
    ``/api``; returns the local URL. ``watch_interval``: seconds between looks for other
    processes' changes to the galleries (nearsight/app/serve/live.py; 0: never). ``allowed_hosts``:
    names the server answers to besides the defaults for ``host`` (nearsight/app/serve/hosts.py).
    ``access_log``: one line per request on stderr. ``forwarded_allow_ips``: the proxies whose
    X-Forwarded-For names the client (nearsight/app/serve/clients.py; none by default). With
    ``prevent_thread_lock`` it returns at once (call :func:`stop_app` to stop)."""
    galleries = demo.galleries  # the one owner the page and REST both read
    shared_box(demo.concurrency)  # uploads are decoded there: warm before the first one
    blocked = sorted({str(view.gallery.path) for view in galleries})
    max_bytes = int(max_upload_mb * 1024 * 1024)
    proxies = TrustedProxies(forwarded_allow_ips)
    if max_filter_conditions is not None:
        galleries.max_filter_conditions = max_filter_conditions
    rest = make_rest_app(
        galleries,
        max_upload_bytes=max_bytes,
        api_key=api_key,
        concurrency=demo.concurrency,
        max_waiting=demo.max_queue,
        allow_writes=allow_writes,
    )
    batchers = rest.state.rest.batchers.values()
    metrics = ServerMetrics(
        lambda: [(v.name, len(v), v.generation) for v in galleries],
        lambda: sum(batcher.waiting for batcher in batchers),
    )
    settings = GuardSettings(
        max_body_bytes=max_bytes + FORM_SLACK_BYTES,
        hosts=AllowedHosts.for_server(host, allowed_hosts),
        api_key=api_key,
        sessions=Sessions(api_key, session_s, secure=secure_cookie) if api_key else None,
        body_timeout_s=body_timeout_s,
        metrics=metrics,
        access_log=access_log,
        trusted_proxies=proxies,
        sign_in_timeout_s=sign_in_timeout_s,
        max_unauthenticated=max_unauthenticated,
        uploads=UploadBudget.for_limit(max_bytes, body_timeout_s),
    )
    connections = ConnectionPolicy(header_timeout_s, keep_alive_s, max_client_connections,
                                   is_proxy=proxies.trusts if proxies else lambda _: False,
                                   max_waiting=max_unauthenticated)  # fmt: skip
    install(connections)  # before the server starts: its first connections are covered too
    # the API is a route of the app from its first request (mounted after the launch, /api
    # answered 404 until then); Gradio's own routes live under /gradio_api: none is shadowed
    api = Mount(API_PREFIX, app=rest)
    # a path with a decoded newline (an item key) is still the API's: its errors, its shape
    api.path_regex = re.compile(api.path_regex.pattern, re.DOTALL)
    _, url, _ = demo.launch(
        app_kwargs={
            "middleware": [Middleware(Guard, settings=settings)],
            "routes": [api],
        },
        server_name=host,
        server_port=port,
        prevent_thread_lock=True,  # the API is mounted on the running app, then we block
        quiet=quiet,
        share=False,
        inbrowser=False,
        show_error=False,  # only gr.Error messages reach the page, never a traceback
        max_file_size=max_bytes,
        allowed_paths=[],
        blocked_paths=blocked,
        enable_monitoring=False,
        ssr_mode=False,
        pwa=False,
        mcp_server=False,
        run_history=False,
        state_session_capacity=STATE_SESSIONS,
        footer_links=["api"],
        theme=system_theme(),
    )
    app = demo.app
    assert settings.uploads is not None
    settings.uploads.upload_dir = Path(app.uploaded_file_dir)
    if demo._queue is not None:  # the page's queue, shared fairly between clients
        share_fairly(demo._queue, max(1, demo.max_queue // 4))
        hold_queue_files(demo._queue, settings.uploads)  # runs first: its files held as uploads
    _guard_outermost(app, api)
    config = demo.server.config
    connections.attach(config)
    config.limit_concurrency = max_connections  # read by uvicorn for each new connection
    config.timeout_keep_alive = keep_alive_s
    app.state.nearsight = ServedApp(url, galleries, rest, settings, connections)
    galleries.watch(watch_interval)
    if not prevent_thread_lock:
        demo.block_thread()
    return url


def _guard_outermost(app: FastAPI, api: Mount) -> None:
    """Put the guard in front of the middleware Gradio adds in launch() (its CORS handling
    answers preflight requests itself, and it reflected any Origin with credentials for a
    non-local Host) and rebuild the stack; the one built before keeps serving until the swap,
    and it has the guard too. Right behind the guard, ``/api`` goes to the REST app
    (api_first.py), past Gradio's middleware."""
    first = [m for m in app.user_middleware if m.cls is Guard]
    app.user_middleware = first + [m for m in app.user_middleware if m.cls is not Guard]
    stack = layer = app.build_middleware_stack()
    while layer is not None and not isinstance(layer, Guard):  # Starlette's error (and body)
        layer = getattr(layer, "app", None)  # layers come first
    if layer is not None:
        layer.app = ApiFirst(layer.app, api)
    app.middleware_stack = stack
