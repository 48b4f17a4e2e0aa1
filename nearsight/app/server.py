"""Starting the page's server: Gradio's launch with the safety settings, the REST API mounted
at ``/api``, and the guard (nearsight/app/guard.py) in front of every route."""

from __future__ import annotations

import gradio as gr
from starlette.middleware import Middleware

from nearsight.app.guard import DEFAULT_BODY_TIMEOUT_S, Guard
from nearsight.app.metrics import ServerMetrics
from nearsight.app.page_handlers import Page
from nearsight.app.rest import API_PREFIX, FORM_SLACK_BYTES, make_rest_app
from nearsight.app.slow_clients import DEFAULT_HEADER_TIMEOUT_S, install_header_timeout

DEFAULT_MAX_UPLOAD_MB = 10.0
DEFAULT_MAX_CONNECTIONS = 256  # open connections beyond this get 503 (uvicorn's limit_concurrency)
KEEP_ALIVE_S = 5  # an idle keep-alive connection is closed after this
# Sessions whose state Gradio keeps (least recently used dropped first). Every call of the API
# over plain HTTP is a new session holding a copy of every component's config (docs/decisions.md):
# Gradio's default of 10000 let a busy API client grow the server by far too much.
STATE_SESSIONS = 1000
SYSTEM_FONTS = ("system-ui", "Segoe UI", "Roboto", "Helvetica Neue", "Arial", "sans-serif")
MONO_FONTS = ("ui-monospace", "SFMono-Regular", "Menlo", "Consolas", "monospace")


def system_theme() -> gr.themes.Base:
    """Gradio's default look with fonts the browser already has (no font download at all)."""
    return gr.themes.Default(
        font=[gr.themes.Font(name) for name in SYSTEM_FONTS],
        font_mono=[gr.themes.Font(name) for name in MONO_FONTS],
    )




def launch_app(
    demo: gr.Blocks,
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
    body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S,
    header_timeout_s: float = DEFAULT_HEADER_TIMEOUT_S,
) -> str:
    """Start the server with the safety settings and the REST API (nearsight/app/rest.py) mounted at
    ``/api``; returns the local URL. ``watch_interval``: seconds between looks for other
    processes' changes to the galleries (nearsight/app/live.py; 0: never). With ``prevent_thread_lock`` it returns at once (call
    ``demo.close()`` to stop, then ``close_rest_app(demo.nearsight_api)``)."""
    page: Page = demo.nearsight  # type: ignore[attr-defined]
    blocked = sorted({str(view.gallery.path) for view in page.views.values()})
    max_bytes = int(max_upload_mb * 1024 * 1024)
    page.max_filter_conditions = max_filter_conditions
    rest = make_rest_app(
        page.views,  # the live mapping: a reloaded gallery is seen by the next request
        max_upload_bytes=max_bytes,
        api_key=api_key,
        concurrency=page.concurrency,
        max_waiting=page.max_queue,
        max_filter_conditions=max_filter_conditions,
    )
    batchers = rest.state.batchers.values()
    metrics = ServerMetrics(
        lambda: [(v.name, len(v), v.generation) for v in list(page.views.values())],
        lambda: sum(batcher.waiting for batcher in batchers),
    )
    guard = Middleware(
        Guard,
        api_key=api_key,
        max_body_bytes=max_bytes + FORM_SLACK_BYTES,
        body_timeout_s=body_timeout_s,
        metrics=metrics,
        access_log=not quiet,
    )
    install_header_timeout(header_timeout_s)
    _, url, _ = demo.launch(
        app_kwargs={"middleware": [guard]},  # in front of every route, the page's included
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
    # Gradio builds its FastAPI app inside launch(); none of its routes is under /api
    # (its own live under /gradio_api), so the mount shadows nothing
    demo.app.mount(API_PREFIX, rest)
    # read by uvicorn for each new connection: the open-connection cap and idle keep-alive
    demo.server.config.limit_concurrency = max_connections
    demo.server.config.timeout_keep_alive = KEEP_ALIVE_S
    demo.nearsight_api = rest  # type: ignore[attr-defined]
    if watch_interval > 0:
        page.watch(watch_interval)
    if not prevent_thread_lock:
        demo.block_thread()
    return url
