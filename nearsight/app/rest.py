"""The REST API of `nearsight serve`: JSON routes on the same server as the page, under
``/api`` (a FastAPI sub-application, so it has its own OpenAPI schema at
``/api/openapi.json`` and docs at ``/api/docs``).

- ``POST /api/search``: multipart form; the query is ``image`` (a file), ``id`` (a gallery
  item's stored vector: the item itself comes first) or ``vector`` (a JSON list of D numbers); ``k`` (default
  8), ``filter`` (``KEY=VALUE``, ``KEY>=N``..., several separated by ``;``), ``gallery`` (a
  name from ``/api/health``; default the first). Answers ``{"gallery", "k", "neighbours"}``,
  each neighbour ``{"id", "path", "label", "class_name", "distance", "meta"}``.
- ``GET /api/items/{id}?gallery=NAME``: the item's catalog row and ``meta``.
- ``GET /api/health``: ``{"status": "ok", "galleries": [{"name", "items", "dim", ...}]}``.

Safety, as the page: an upload larger than the limit is refused (413) before it is parsed; a
file that is not an image gets 415; every error is ``{"error": "one line"}`` with a 4xx status,
never a traceback; no route opens or serves a file named by a request. With an API key (set
by ``serve --api-key`` or ``NEARSIGHT_API_KEY``; required when serving beyond localhost) the
search and item routes need it in the ``X-API-Key`` header (or ``Authorization: Bearer``);
``/api/health`` and the docs stay open.

Uploads are decoded and resized in worker threads, then embedded by the gallery model's
:class:`~nearsight.app.batcher.EmbedBatcher`: concurrent requests share one model call.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Annotated, Any

import numpy as np
from fastapi import Depends, FastAPI, File, Form, Path, Request, Security, UploadFile
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.security import APIKeyHeader, HTTPBearer
from starlette.exceptions import HTTPException

from nearsight.app.auth import API_KEY_HEADER, key_matches, presented_key
from nearsight.app.batcher import DEFAULT_MAX_WAITING, BatcherFull, EmbedBatcher
from nearsight.core.errors import Busy, NearsightError
from nearsight.data.images import ImageLoadError, load_image_bytes
from nearsight.index.gallery.keys import ids_of_keys
from nearsight.search.rerank.spec import parse_rerank
from nearsight.search.route import check_vector, item_row
from nearsight.search.served import ServedGallery

API_PREFIX = "/api"
DEFAULT_K = 8
MAX_K = 1000
FORM_SLACK_BYTES = 64 * 1024  # the multipart envelope and the small fields around the file
MAX_ECHO_CHARS = 200  # an error message quoting a request's input is cut to this
RETRY_AFTER_S = 1
# filtered or re-ranked searches at once: one core stays free for plain searches and health
HEAVY_CONCURRENCY = 1


class ApiError(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


def make_rest_app(
    views: Mapping[str, ServedGallery] | Sequence[ServedGallery],
    *,
    max_upload_bytes: int,
    api_key: str | None = None,
    max_batch: int = 16,
    concurrency: int = 2,
    max_waiting: int = DEFAULT_MAX_WAITING,
    max_filter_conditions: int | None = None,
) -> FastAPI:
    """The ``/api`` application over the open galleries (mount it at :data:`API_PREFIX`).

    ``views``: a name -> view mapping that may change while serving (live galleries,
    nearsight/app/live.py: each request looks its gallery up once), or a list. At most
    ``concurrency`` uploads are decoded at once and at most ``max_waiting`` wait for a decode
    or the model; past that a request gets 503 with ``Retry-After``."""
    by_name = views if isinstance(views, Mapping) else {view.name: view for view in views}
    names = list(by_name)
    batchers: dict[int, EmbedBatcher] = {}
    for view in by_name.values():
        if id(view.embedder) not in batchers:
            batchers[id(view.embedder)] = EmbedBatcher(
                view.embedder.embed, max_batch=max_batch, max_waiting=max_waiting
            )
    decoding = WorkGate(concurrency, max_waiting, "uploads")
    heavy_work = WorkGate(HEAVY_CONCURRENCY, max_waiting, "filtered or re-ranked searches")

    app = FastAPI(
        title="nearsight",
        summary="Query-by-image search over nearsight galleries",
        docs_url="/docs",
        redoc_url=None,
        openapi_url="/openapi.json",
    )
    app.state.batchers = batchers

    require_key = _key_dependency(api_key)

    def view_of(name: str | None) -> ServedGallery:
        if not name:
            return by_name[names[0]]
        if name not in by_name:
            raise ApiError(
                404, f"no gallery named {_echo(name)!r} (this server has: {', '.join(names)})"
            )
        return by_name[name]

    @app.exception_handler(ApiError)
    async def _api_error(_: Request, error: ApiError) -> JSONResponse:
        headers = {"Retry-After": str(RETRY_AFTER_S)} if error.status in (429, 503) else None
        return JSONResponse({"error": error.message}, status_code=error.status, headers=headers)

    @app.exception_handler(NearsightError)
    async def _bad_input(_: Request, error: NearsightError) -> JSONResponse:
        if isinstance(error, Busy):  # the server's state, not the request: never a 4xx
            headers = {"Retry-After": str(RETRY_AFTER_S)}
            return JSONResponse({"error": _one_line(str(error))}, status_code=503, headers=headers)
        return JSONResponse({"error": _one_line(str(error))}, status_code=400)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, error: RequestValidationError) -> JSONResponse:
        first = error.errors()[0] if error.errors() else {}
        where = ".".join(str(part) for part in first.get("loc", ())[1:]) or "request"
        message = f"{where}: {first.get('msg', 'invalid request')}"
        return JSONResponse({"error": _one_line(message)}, status_code=422)

    @app.exception_handler(HTTPException)
    async def _http(_: Request, error: HTTPException) -> JSONResponse:
        return JSONResponse({"error": _one_line(str(error.detail))}, status_code=error.status_code)

    @app.middleware("http")
    async def _limit_upload(request: Request, call_next):
        length = request.headers.get("content-length")
        too_big = length is not None and length.isdigit()
        if too_big and int(length) > max_upload_bytes + FORM_SLACK_BYTES:
            limit = max_upload_bytes / 1024 / 1024
            return JSONResponse(
                {"error": f"the upload is larger than the server's limit ({limit:g} MB)"},
                status_code=413,
            )
        return await call_next(request)

    @app.get("/health")
    def health() -> dict[str, Any]:
        """Whether the server is up, and its galleries."""
        return {
            "status": "ok",
            "galleries": [
                {
                    "name": view.name,
                    "items": len(view),
                    "generation": view.generation,
                    "dim": view.gallery.dim,
                    "index_type": view.gallery.index_type,
                    "meta_keys": view.gallery.meta_keys(),
                }
                for view in list(by_name.values())
            ],
        }

    @app.get("/items/{item_id}", dependencies=[Depends(require_key)])
    def item(item_id: int, gallery: str | None = None) -> dict[str, Any]:
        """A gallery item's catalog row and metadata."""
        view = view_of(gallery)
        try:
            row = view.public_row(item_id)
        except NearsightError as error:
            raise ApiError(404, str(error)) from None
        return item_row(row)

    @app.get("/items/by-key/{key}", dependencies=[Depends(require_key)])
    def item_by_key(
        key: Annotated[str, Path(max_length=200)], gallery: str | None = None
    ) -> dict[str, Any]:
        """The item with this key (the gallery's key column, e.g. a SKU)."""
        view = view_of(gallery)
        try:
            found = ids_of_keys(view.gallery, [key])
        except NearsightError as error:  # the gallery has no key column
            raise ApiError(404, str(error)) from None
        if key not in found or found[key] not in view.rows():
            raise ApiError(404, f"gallery {view.name} has no item with that key")
        return item_row(view.public_row(found[key]))

    @app.post("/search", dependencies=[Depends(require_key)])
    async def search(
        image: Annotated[UploadFile | None, File(description="query image file")] = None,
        item_id: Annotated[
            int | None, Form(alias="id", description="query by this gallery item's vector")
        ] = None,
        vector: Annotated[str | None, Form(description="query vector, a JSON list")] = None,
        k: Annotated[int, Form(ge=1, le=MAX_K)] = DEFAULT_K,
        filter: Annotated[str | None, Form(description="KEY=VALUE;KEY>=N;...")] = None,
        gallery: Annotated[str | None, Form()] = None,
        rerank: Annotated[
            str | None,
            Form(
                max_length=200,
                description="none | aqe | dba | dba+aqe | kreciprocal[:K=V,...] (default: "
                "the server's)",
            ),
        ] = None,
    ) -> dict[str, Any]:
        """The k nearest gallery items of an image, an item or a vector."""
        query_fields = (("image", image), ("id", item_id), ("vector", vector))
        given = [name for name, value in query_fields if value is not None]
        if len(given) != 1:
            raise ApiError(422, "send exactly one of: image (a file), id, vector")
        view = view_of(gallery)
        try:
            spec = None if rerank is None else parse_rerank(rerank)
        except ValueError as error:
            raise ApiError(422, str(error)) from None
        self_id = None  # a query that is a gallery item comes first, at distance 0
        if image is not None:
            batcher = batchers[id(view.embedder)]
            query, self_id = await _embed_upload(image, view, batcher, max_upload_bytes, decoding)
        elif item_id is not None:
            if item_id not in view.rows():
                raise ApiError(404, f"gallery {view.name} has no item with id {item_id}")
            query, self_id = view.item_vector(item_id), item_id
        else:
            try:
                query = check_vector(view.gallery, _parse_vector(vector))
            except NearsightError as error:  # the wrong length, zeros: a bad field
                raise ApiError(422, f"vector: {error}") from None
        used = view.rerank if spec is None else spec

        def work():
            allowed = view.allowed_ids(filter, max_filter_conditions)
            return view.search_one(query, k, allowed=allowed, rerank=used, self_id=self_id)

        # filters and re-ranking share one small pool; a plain search never waits behind them
        heavy = bool(filter and filter.strip()) or used.active
        found = await (heavy_work.run(work) if heavy else run_in_threadpool(work))
        return {
            "gallery": view.name,
            "k": k,
            "rerank": str(used),
            "neighbours": [n.as_json() for n in found],
        }

    return app


class WorkGate:
    """At most ``concurrency`` pieces of one kind of work at once (a decoded 64 MP image is
    ~200 MB; a re-ranking or a filter keeps a core busy), and at most ``max_waiting`` requests
    waiting for one; past that, 503 with Retry-After. Waiting holds no thread."""

    def __init__(self, concurrency: int, max_waiting: int, what: str = "requests"):
        self.concurrency = max(1, concurrency)
        self.max_waiting = max_waiting
        self.what = what
        self._semaphore: asyncio.Semaphore | None = None  # made in the server's event loop
        self.waiting = 0

    async def run(self, work):
        if self._semaphore is None:
            self._semaphore = asyncio.Semaphore(self.concurrency)
        if self.waiting >= self.max_waiting:
            raise ApiError(503, f"the server is busy ({self.waiting} {self.what} waiting): retry")
        self.waiting += 1
        try:
            async with self._semaphore:
                return await run_in_threadpool(work)
        finally:
            self.waiting -= 1


async def _embed_upload(
    upload: UploadFile, view: ServedGallery, batcher: EmbedBatcher, max_bytes: int,
    decoding: WorkGate,
) -> tuple[Any, int | None]:  # fmt: skip
    data = await upload.read(max_bytes + 1)
    if len(data) > max_bytes:
        limit = max_bytes / 1024 / 1024
        raise ApiError(413, f"the upload is larger than the server's limit ({limit:g} MB)")
    name = _echo(upload.filename or "<upload>")
    twin = view.identical_item(hashlib.sha256(data).hexdigest())
    if twin is not None:  # a gallery item's own file: searched as that item
        return view.item_vector(twin), twin

    def prepare():
        try:
            # the pixel limit is checked from the header; a JPEG is decoded as the gallery's were
            image = load_image_bytes(data, name, view.embedder.resize)
        except ImageLoadError as error:
            raise ApiError(415, _one_line(str(error))) from None
        return view.embedder.preprocess(image)

    model_input = await decoding.run(prepare)
    try:
        future = batcher.submit(model_input)
    except BatcherFull as error:
        raise ApiError(503, f"the server is busy ({error}): retry") from None
    return await asyncio.wrap_future(future), None


def _parse_vector(text: str | None) -> Any:
    """A JSON list of numbers; anything else (deep nesting, huge integers) is a 422."""
    if text is not None and len(text) > 64 * 1024 * 1024:
        raise ApiError(413, "vector is too long")
    try:
        value = json.loads(text or "")
    except (ValueError, RecursionError):
        raise ApiError(422, "vector must be a JSON list of numbers") from None
    try:
        array = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError, OverflowError):
        raise ApiError(422, "vector must be a JSON list of numbers") from None
    if array.dtype != np.float64 or array.ndim not in (1, 2):
        raise ApiError(422, "vector must be a JSON list of numbers")
    return array


def _echo(text: str) -> str:
    """Request input quoted in a message: at most :data:`MAX_ECHO_CHARS` characters."""
    return text if len(text) <= MAX_ECHO_CHARS else text[:MAX_ECHO_CHARS] + "..."


def _one_line(text: str) -> str:
    return _echo(" ".join(text.split()))


# only for the OpenAPI schema: require_key reads the key as the guard does
_KEY_HEADER = APIKeyHeader(name=API_KEY_HEADER, auto_error=False, scheme_name="APIKey")
_BEARER = HTTPBearer(auto_error=False, scheme_name="Bearer")


def _key_dependency(api_key: str | None):
    """The routes' dependency: the key checked as the guard checks it (nearsight/app/auth.py),
    and declared in the OpenAPI schema (X-API-Key, or a bearer token) when there is one."""
    if not api_key:
        return lambda: None

    def require_key(
        request: Request,
        _header: Annotated[str | None, Security(_KEY_HEADER)] = None,
        _bearer: Annotated[Any, Security(_BEARER)] = None,
    ) -> None:
        if not key_matches(presented_key(request.scope["headers"]), api_key):
            raise ApiError(
                401, f"missing or wrong API key (send it in the {API_KEY_HEADER} header)"
            )

    return require_key


def close_rest_app(app: FastAPI) -> None:
    for batcher in app.state.batchers.values():
        batcher.close()
