"""The REST API of `nearsight serve`: JSON routes on the same server as the page, under
``/api`` (a FastAPI sub-application, so it has its own OpenAPI schema at
``/api/openapi.json`` and docs at ``/api/docs``). One router per resource (``routes/``):

- ``POST /api/search``: the k nearest items of an image, an item or a vector (routes/search.py);
  answers ``{"gallery", "k", "rerank", "neighbours"}``, each neighbour a
  :class:`~nearsight.search.neighbour.Neighbour` as JSON;
- ``GET /api/items/{id}``, ``GET /api/items/by-key?key=K`` (or ``/api/items/by-key/K``,
  percent-encoded): an item's catalog row and ``meta`` (routes/items.py);
- ``GET /api/health``: ``{"status": "ok", "galleries": [{"name", "items", "dim", ...}]}``.

Safety, as the page: an upload larger than the limit is refused (413) before it is parsed; a
file that is not an image gets 415; every error is ``{"error": "one line"}`` with a 4xx status
(503 with ``Retry-After`` when the server is busy), never a traceback; no route opens or serves
a file named by a request. With an API key (``serve --api-key-file`` or ``NEARSIGHT_API_KEY``;
required when serving beyond localhost) the search and item routes need it in the
``X-API-Key`` header (or ``Authorization: Bearer``); ``/api/health`` and the docs stay open.
The state every route reads lives on ``app.state.rest`` (deps.py).
"""

from __future__ import annotations

from collections.abc import Sequence

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from nearsight.app.rest.deps import (
    RETRY_AFTER_S,
    ApiError,
    RestState,
    one_line,
    require_key,
)
from nearsight.app.rest.docs import add_docs
from nearsight.app.rest.routes import facets, health, images, items, search, writes
from nearsight.app.rest.upload_limit import UploadLimit
from nearsight.app.serve.auth import ApiKeys
from nearsight.app.serve.batcher import DEFAULT_MAX_WAITING, EmbedBatcher
from nearsight.app.serve.galleries import Galleries
from nearsight.app.serve.gates import GateFull, WorkGate
from nearsight.core.errors import Busy, NearsightError
from nearsight.data.decode_charges import DecodeRefused
from nearsight.search.served import ServedGallery

__all__ = ["API_PREFIX", "FORM_SLACK_BYTES", "ApiError", "WorkGate", "close_rest_app",
           "make_rest_app"]  # fmt: skip

API_PREFIX = "/api"
FORM_SLACK_BYTES = 64 * 1024  # the multipart envelope and the small fields around the file
# filtered or re-ranked searches at once: one core stays free for plain searches and health
HEAVY_CONCURRENCY = 1
PLAIN_CONCURRENCY = 2  # plain searches at once (each a FAISS search, ms): shared fairly too


def make_rest_app(
    galleries: Galleries | Sequence[ServedGallery],
    *,
    max_upload_bytes: int,
    api_key: str | None = None,
    keys: ApiKeys | None = None,
    max_batch: int = 16,
    concurrency: int = 2,
    max_waiting: int = DEFAULT_MAX_WAITING,
    max_filter_conditions: int | None = None,
    allow_writes: bool = False,
) -> FastAPI:
    """The ``/api`` application over the open galleries (mount it at :data:`API_PREFIX`).

    ``galleries``: their owner (nearsight/app/serve/galleries.py), whose mapping a live reload
    may change while serving, or a list of open galleries. At most ``concurrency`` uploads are decoded at once,
    :data:`HEAVY_CONCURRENCY` filtered or re-ranked searches run at once, and at most
    ``max_waiting`` wait for either or for the model; past that a request gets 503 with
    ``Retry-After``."""
    if not isinstance(galleries, Galleries):
        galleries = Galleries(list(galleries), max_filter_conditions=max_filter_conditions)
    elif max_filter_conditions is not None:
        galleries.max_filter_conditions = max_filter_conditions
    batchers: dict[int, EmbedBatcher] = {}
    for view in galleries:
        if id(view.embedder) not in batchers:
            batchers[id(view.embedder)] = EmbedBatcher(
                view.embedder.embed, max_batch=max_batch, max_waiting=max_waiting
            )
    app = FastAPI(
        title="nearsight",
        summary="Query-by-image search over nearsight galleries",
        docs_url=None,  # served below from the packaged Swagger UI, not a CDN
        redoc_url=None,
        openapi_url="/openapi.json",
    )
    add_docs(app)
    app.state.rest = RestState(
        galleries=galleries,
        batchers=batchers,
        decoding=WorkGate(concurrency, max_waiting, "uploads"),
        heavy=WorkGate(HEAVY_CONCURRENCY, max_waiting, "filtered or re-ranked searches"),
        plain=WorkGate(max(PLAIN_CONCURRENCY, concurrency), max_waiting, "searches"),
        keys=keys if keys is not None else ApiKeys.of(api_key),
        max_upload_bytes=max_upload_bytes,
    )
    app.state.allow_writes = allow_writes  # serve --allow-writes: routes/writes.py
    keyed = [Depends(require_key)] if app.state.rest.keys else []
    app.include_router(health.router)
    app.include_router(health.galleries_router, dependencies=keyed)
    app.include_router(items.router, dependencies=keyed)
    app.include_router(images.router, dependencies=keyed)
    app.include_router(writes.router, dependencies=keyed)
    app.include_router(search.router, dependencies=keyed)
    app.include_router(facets.router, dependencies=keyed)
    _add_error_handlers(app)

    app.add_middleware(
        UploadLimit,
        limit_bytes=max_upload_bytes + FORM_SLACK_BYTES,
        max_upload_bytes=max_upload_bytes,
    )
    return app


def _add_error_handlers(app: FastAPI) -> None:
    """Every error as ``{"error": "one line"}``: 4xx for the request, 503 for a busy server."""

    def busy(message: str) -> JSONResponse:
        headers = {"Retry-After": str(RETRY_AFTER_S)}
        return JSONResponse({"error": one_line(message)}, status_code=503, headers=headers)

    @app.exception_handler(ApiError)
    async def _api_error(_: Request, error: ApiError) -> JSONResponse:
        headers = {"Retry-After": str(RETRY_AFTER_S)} if error.status in (429, 503) else None
        return JSONResponse({"error": error.message}, status_code=error.status, headers=headers)

    @app.exception_handler(GateFull)
    async def _full(_: Request, error: GateFull) -> JSONResponse:
        return busy(str(error))

    @app.exception_handler(DecodeRefused)
    async def _charged(_: Request, error: DecodeRefused) -> JSONResponse:
        headers = {"Retry-After": str(error.retry_after_s)}
        return JSONResponse({"error": one_line(str(error))}, status_code=429, headers=headers)

    @app.exception_handler(NearsightError)
    async def _bad_input(_: Request, error: NearsightError) -> JSONResponse:
        if isinstance(error, Busy):  # the server's state, not the request: never a 4xx
            return busy(str(error))
        return JSONResponse({"error": one_line(str(error))}, status_code=400)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, error: RequestValidationError) -> JSONResponse:
        first = error.errors()[0] if error.errors() else {}
        where = ".".join(str(part) for part in first.get("loc", ())[1:]) or "request"
        message = f"{where}: {first.get('msg', 'invalid request')}"
        return JSONResponse({"error": one_line(message)}, status_code=422)

    @app.exception_handler(HTTPException)
    async def _http(_: Request, error: HTTPException) -> JSONResponse:
        return JSONResponse({"error": one_line(str(error.detail))}, status_code=error.status_code)


def close_rest_app(app: FastAPI) -> None:
    for batcher in app.state.rest.batchers.values():
        batcher.close()
