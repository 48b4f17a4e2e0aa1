"""The server nearsight owns: one FastAPI application, built here from one
:class:`~nearsight.app.serve.settings.Settings`, run under uvicorn's public ``Server``.

This module is the one above the faces it wires (app/page/, app/rest/ and app/serve/ import
nothing of each other upward):

- the REST API (nearsight/app/rest/) is mounted at ``/api``;
- the page (nearsight/app/page/) is mounted at ``/`` through Gradio's public
  ``gr.mount_gradio_app``, whose lifespan starts its queue (no route of Gradio's is called to
  start it, so none needs an exemption from the key);
- in front of every route, outermost, the guard (nearsight/app/serve/guard.py), then the
  holding of files in the page's events (nearsight/app/serve/queue_files.py);
- under every connection, uvicorn's h11 protocol as a subclass given to its ``Config``
  (nearsight/app/serve/slow_clients.py).

:func:`serve` is what ``nearsight serve`` and ``nearsight demo`` run; :func:`launch_app` starts
a page already built (tests, benchmarks) and returns its URL, :func:`stop_app` stops it.
"""

from __future__ import annotations

import re
import socket
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gradio as gr
import uvicorn
from fastapi import FastAPI
from gradio.routes import App as GradioApp
from gradio.utils import get_upload_folder
from starlette.routing import Mount

from nearsight.app.page.layout import PageBlocks, build_app
from nearsight.app.rest import API_PREFIX, FORM_SLACK_BYTES, close_rest_app, make_rest_app
from nearsight.app.serve.auth import ApiKeys, Sessions
from nearsight.app.serve.clients import TrustedProxies
from nearsight.app.serve.decode_shares import DecodeShares
from nearsight.app.serve.galleries import Galleries
from nearsight.app.serve.guard import Guard, GuardSettings
from nearsight.app.serve.hosts import AllowedHosts
from nearsight.app.serve.metrics import ServerMetrics
from nearsight.app.serve.queue_files import QueueJoinFiles
from nearsight.app.serve.run import (
    check_address,
    check_decode_limits,
    resolve_api_key,
    stop_on_sigterm,
)
from nearsight.app.serve.settings import Settings
from nearsight.app.serve.slow_clients import ConnectionPolicy, PolicedConfig
from nearsight.app.serve.uploads import UploadBudget
from nearsight.core.errors import NearsightError
from nearsight.data.decode_box import charge_with, charged_by, shared_box

# Sessions whose state Gradio keeps (least recently used dropped first). Every call of the API
# over plain HTTP is a new session holding a copy of every component's config (docs/decisions.md):
# Gradio's default of 10000 let a busy API client grow the server by far too much.
STATE_SESSIONS = 1000
SYSTEM_FONTS = ("system-ui", "Segoe UI", "Roboto", "Helvetica Neue", "Arial", "sans-serif")
MONO_FONTS = ("ui-monospace", "SFMono-Regular", "Menlo", "Consolas", "monospace")
START_TIMEOUT_S = 120.0


@dataclass
class ServedApp:
    """One running server: its app, its parts and its uvicorn server."""

    url: str
    settings: Settings
    app: FastAPI
    galleries: Galleries
    rest: FastAPI
    guard: GuardSettings
    connections: ConnectionPolicy
    server: uvicorn.Server
    thread: threading.Thread
    page: PageBlocks
    decode_shares: DecodeShares | None = None  # what the decode box charges each client


_RUNNING: dict[int, ServedApp] = {}  # id(page) -> its server, while it runs


def system_theme() -> gr.themes.Base:
    """Gradio's default look with fonts the browser already has (no font download at all)."""
    return gr.themes.Default(
        font=[gr.themes.Font(name) for name in SYSTEM_FONTS],
        font_mono=[gr.themes.Font(name) for name in MONO_FONTS],
    )


def build_server_app(page: PageBlocks, settings: Settings) -> tuple[FastAPI, dict[str, Any]]:
    """nearsight's application over a built page: the REST API at /api, the page at /, the
    guard in front of both. Returns the app and its parts (rest, guard, connections)."""
    galleries = page.nearsight.galleries  # the one owner the page and REST both read
    max_bytes = settings.max_upload_bytes
    proxies = TrustedProxies(settings.forwarded_allow_ips)
    galleries.max_filter_conditions = settings.max_filter_conditions
    keys = ApiKeys.of(settings.api_key, settings.keys_file)
    rest = make_rest_app(galleries, max_upload_bytes=max_bytes, keys=keys,
                         concurrency=settings.concurrency,
                         max_waiting=settings.max_queue,
                         allow_writes=settings.allow_writes)  # fmt: skip
    batchers = rest.state.rest.batchers.values()
    metrics = ServerMetrics(
        lambda: [(v.name, len(v), v.generation) for v in galleries],
        lambda: sum(batcher.waiting for batcher in batchers),
    )
    uploads = UploadBudget.for_limit(max_bytes, settings.body_timeout)
    uploads.upload_dir = Path(get_upload_folder())
    guard = GuardSettings(
        max_body_bytes=max_bytes + FORM_SLACK_BYTES,
        hosts=AllowedHosts.for_server(settings.host, settings.host_names),
        keys=keys,
        sessions=(
            Sessions(keys.secret, settings.session_s, secure=settings.secure_cookie)
            if keys
            else None
        ),  # fmt: skip
        body_timeout_s=settings.body_timeout,
        metrics=metrics,
        access_log=settings.access_log,
        trusted_proxies=proxies,
        sign_in_timeout_s=settings.sign_in_timeout,
        max_unauthenticated=settings.max_unauthenticated,
        uploads=uploads,
    )
    connections = ConnectionPolicy(
        header_timeout_s=settings.header_timeout,
        keep_alive_s=settings.keep_alive,
        max_per_client=settings.max_client_connections,
        write_timeout_s=settings.write_timeout,
        max_pipelined=settings.max_pipelined,
        max_waiting=settings.max_unauthenticated,
        is_proxy=proxies.trusts if proxies else lambda _: False,
    )
    api = Mount(API_PREFIX, app=rest)
    # a path with a decoded newline (an item key) is still the API's: its errors, its shape
    api.path_regex = re.compile(api.path_regex.pattern, re.DOTALL)
    app = FastAPI(routes=[api], docs_url=None, redoc_url=None, openapi_url=None)
    page.state_session_capacity = STATE_SESSIONS
    blocked = sorted({str(view.gallery.path) for view in galleries})
    gr.mount_gradio_app(
        app,
        page,
        path="/",
        server_name=settings.host,
        server_port=settings.port,
        footer_links=["api"],
        run_history=False,
        allowed_paths=[],
        blocked_paths=blocked,
        show_error=False,  # only gr.Error messages reach the page, never a traceback
        max_file_size=max_bytes,
        ssr_mode=False,
        enable_monitoring=False,
        pwa=False,
        mcp_server=False,
        theme=system_theme(),
    )
    # mounted, Gradio checks a payload's file paths only once it thinks itself launched (its
    # own reload sets this too): the page's inputs come from its upload folder alone
    page.has_launched = True
    app.add_middleware(QueueJoinFiles, budget=uploads)
    app.add_middleware(Guard, settings=guard)  # added last: outermost
    return app, {"rest": rest, "guard": guard, "connections": connections}


def launch_app(page: PageBlocks, settings: Settings) -> str:
    """Serve ``page`` (nearsight.app.page.layout.build_app) and its REST API with
    ``settings`` in a thread of this process; returns the local URL once it answers (call
    :func:`stop_app` to stop). ``settings.api_key`` is used as given (:func:`serve` resolves
    it from a file or the environment)."""
    galleries = page.nearsight.galleries
    box = shared_box(settings.concurrency)  # uploads are decoded there: warm before the first
    shares = None
    if box is not None:
        box.warm()
        shares = DecodeShares(box.timeout_s)  # each client pays for the decodes it makes fail
    app, parts = build_server_app(page, settings)
    listener = _listen(settings.host, settings.port)
    port = listener.getsockname()[1]
    config = PolicedConfig(
        app,
        policy=parts["connections"],
        host=settings.host,
        port=port,
        limit_concurrency=settings.max_connections,  # read by uvicorn for each new connection
        log_config=None,
        log_level="warning",
        access_log=False,  # the guard writes one line per request
        server_header=False,
        lifespan="on",  # Gradio's queue starts in the page's lifespan
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [listener]},
                              name="nearsight-server", daemon=True)  # fmt: skip
    thread.start()
    deadline = time.monotonic() + START_TIMEOUT_S
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            listener.close()
            raise NearsightError(
                f"cannot serve on {settings.host}:{port}: the server did not start"
            )
        time.sleep(0.02)
    url = f"http://{_url_host(settings.host)}:{port}/"
    if shares is not None:
        charge_with(shares)
    _RUNNING[id(page)] = ServedApp(url, settings, app, galleries, parts["rest"], parts["guard"],
                                   parts["connections"], server, thread, page,
                                   shares)  # fmt: skip
    galleries.watch(settings.watch_interval)
    return url


def served(page: PageBlocks) -> ServedApp:
    """The :class:`ServedApp` of a page started by :func:`launch_app`."""
    return _RUNNING[id(page)]


def stop_app(page: PageBlocks) -> None:
    """Stop the server of ``page``, its REST API's batchers and the page's background work."""
    running = _RUNNING.pop(id(page), None)
    if running is None:
        page.nearsight.galleries.close()
        return
    # Gradio's heartbeat streams end on its stop event only: uvicorn waits for every open
    # connection before the lifespan that would set it, so a connected client held the stop
    # for the whole join below. The event is the server loop's: set there.
    loops = [listening.get_loop() for listening in getattr(running.server, "servers", [])]
    for route in running.app.routes:
        if isinstance(route, Mount) and isinstance(route.app, GradioApp):
            try:
                loops[0].call_soon_threadsafe(route.app.stop_event.set)
            except (IndexError, RuntimeError):  # no loop, or closed: nothing waits on it
                route.app.stop_event.set()
    running.server.should_exit = True
    running.thread.join(30)
    if running.decode_shares is not None and charged_by() is running.decode_shares:
        charge_with(None)
    page.close(verbose=False)
    if running.guard.uploads is not None:
        running.guard.uploads.clear()
    close_rest_app(running.rest)
    running.galleries.close()


def serve(settings: Settings) -> None:
    """Serve the page and the REST API over ``settings.galleries`` at its host and port until
    Ctrl-C or SIGTERM (:func:`~nearsight.app.serve.run.stop_on_sigterm`). The API key:
    ``settings.api_key``, else its ``api_key_file``'s, else NEARSIGHT_API_KEY; needed beyond
    loopback (:func:`~nearsight.app.serve.run.resolve_api_key`)."""
    settings.check()
    if not settings.galleries:
        raise NearsightError("serve needs at least one --gallery")
    TrustedProxies(settings.forwarded_allow_ips)  # a one-line error for a name that is not one
    check_decode_limits(settings.decode_memory_mb, settings.decode_timeout)
    check_address(settings.host, settings.port)  # before minutes of loading galleries
    # with a keys file, a lone key is optional; every key is checked for its length
    needs_one = settings.host if settings.keys_file is None else "127.0.0.1"
    key = resolve_api_key(settings.api_key, settings.api_key_file, needs_one)
    settings = settings.replace(api_key=key)
    ApiKeys.of(key, settings.keys_file, settings.host)  # one-line errors before the galleries
    page = build_app(settings.galleries, settings.model, device=settings.device,
                     concurrency=settings.concurrency, max_queue=settings.max_queue,
                     analysis_max_items=settings.analysis_max_items,
                     show_paths=settings.show_paths, rerank=settings.rerank,
                     card_fields=settings.card_field_names or None)  # fmt: skip
    try:
        url = launch_app(page, settings)
    except (OSError, NearsightError):
        page.nearsight.galleries.close()
        raise
    running = served(page)
    try:
        with stop_on_sigterm():
            count = len(running.galleries)
            print(f"nearsight: serving {count} gallery(ies) at {url}", flush=True)
            print(f"nearsight: REST API at {url.rstrip('/')}/api (docs: /api/docs)", flush=True)
            while running.thread.is_alive():  # until Ctrl-C or SIGTERM
                running.thread.join(0.5)
    except KeyboardInterrupt:
        pass
    finally:
        stop_app(page)
    print("nearsight: stopped", file=sys.stderr)


def _listen(host: str, port: int) -> socket.socket:
    """A listening socket on ``host``:``port`` (as uvicorn binds: SO_REUSEADDR), or a one-line
    NearsightError."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except (socket.gaierror, UnicodeError) as error:
        reason = getattr(error, "strerror", None) or str(error)
        raise NearsightError(f"cannot serve on {host}:{port}: unknown host ({reason})") from None
    listener = socket.socket(family, kind, proto)
    try:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(address)
        listener.listen(2048)
    except OSError as error:
        listener.close()
        reason = ("the port is in use (choose another with --port)"
                  if "in use" in str(error) else error.strerror or str(error))  # fmt: skip
        raise NearsightError(f"cannot serve on {host}:{port}: {reason}") from None
    listener.set_inheritable(True)
    return listener


def _url_host(host: str) -> str:
    if host in ("0.0.0.0", "", "::"):
        return "localhost"
    return f"[{host}]" if ":" in host else host
