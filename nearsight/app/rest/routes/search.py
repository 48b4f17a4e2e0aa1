"""``POST /api/search``: the k nearest gallery items of an image, an item or a vector.

Two bodies: a JSON object (``application/json``) for a query by ``id``, ``key`` or ``vector``
(a list of D numbers), or a multipart form for those and an ``image`` file (``vector`` then a
JSON list in a text field). Either way ``k``, ``filter`` (``KEY=VALUE;KEY>=N``), ``gallery``
and ``rerank`` go beside the query. A query by a gallery item (``id`` or ``key``) gets the item
itself first, at distance 0. The answer's ``notes`` name, for a filter value no item holds,
the closest values its column does hold.

The fields become one SearchRequest (nearsight.search.request), checked once in a worker thread
and run by the gallery's Searcher (``Searcher.run``), whose notes are the answer's. Uploads are
decoded in the decode box (nearsight.data.decode_box) and embedded by the gallery model's
:class:`~nearsight.app.serve.batcher.EmbedBatcher` (concurrent requests share one model call;
a lone upload of a plain search is embedded and searched by the thread that decoded it, with
no further trip between threads); an upload with a gallery item's bytes is searched as that
item. Filtered and re-ranked searches share one small pool, so a plain search and health
never wait behind them. An upload re-ranked by a re-ranker of trunk-stage features is
embedded in that pool instead, by the gallery's stage model
(nearsight.search.rerank.stage_query), which gives its embedding and its stage features in one
run.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Callable
from concurrent.futures import Future
from typing import Annotated, Any, Protocol, cast

import numpy as np
from fastapi import APIRouter, Depends, Request, Response
from fastapi.concurrency import run_in_threadpool
from pydantic import ValidationError
from starlette.datastructures import UploadFile

from nearsight.app.rest.deps import ApiError, RestState, echo, one_line, rest_state
from nearsight.app.rest.models import ERRORS, SearchAnswer, SearchJson
from nearsight.app.rest.routes.images import image_url
from nearsight.app.serve.batcher import BatcherFull, EmbedBatcher
from nearsight.core.errors import NearsightError
from nearsight.data.decode_box import fit_bytes
from nearsight.data.images import ImageLoadError
from nearsight.search.request import (
    CheckedRequest,
    EmbeddedQuery,
    ImageQuery,
    ItemQuery,
    Limits,
    Query,
    SearchRequest,
    VectorQuery,
)
from nearsight.search.rerank.spec import request_rerank
from nearsight.search.results import SearchResults
from nearsight.search.route import check_vector
from nearsight.search.served import ServedGallery

MAX_K = 1000
# a JSON body, and a form's vector text: a 65,536-number vector is about 1.3 MB as JSON
MAX_JSON_BYTES = 2 * 1024 * 1024
MAX_VECTOR_CHARS = MAX_JSON_BYTES
QUERY_FIELDS = ("image", "id", "key", "vector")

router = APIRouter(tags=["search"])


def _form_schema() -> dict[str, Any]:
    """The multipart form's schema: the JSON body's fields, ``vector`` as JSON text, and the
    image file."""
    schema = SearchJson.model_json_schema()
    properties = dict(schema["properties"])
    properties["vector"] = {"type": "string", "description": "query vector, a JSON list"}
    properties["filter"] = {"type": "string", "description": "KEY=VALUE;KEY>=N;..."}
    properties["image"] = {"type": "string", "format": "binary", "description": "query image"}
    return {"type": "object", "properties": properties}


_BODY = {
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {"schema": SearchJson.model_json_schema()},
            "multipart/form-data": {"schema": _form_schema()},
        },
    }
}


@router.post(
    "/search",
    response_model=SearchAnswer,
    responses=ERRORS,  # type: ignore[arg-type]
    openapi_extra=_BODY,
)
async def search(request: Request, state: Annotated[RestState, Depends(rest_state)]) -> Response:
    """The k nearest gallery items of an image, an item (by ``id`` or ``key``) or a vector."""
    fields, image = await _read_body(request)
    present = [name for name in QUERY_FIELDS if (image if name == "image" else fields.get(name))
               is not None]  # fmt: skip
    if len(present) != 1:
        sent = f" (sent: {', '.join(present)})" if present else ""
        raise ApiError(422, f"send exactly one of: image (a file), id, key, vector{sent}")
    view = state.view(fields.get("gallery"))
    rerank = fields.get("rerank")
    try:  # a request may run only the server's own pairwise file (request_rerank)
        spec = view.rerank if rerank is None else request_rerank(rerank, view.rerank)
    except ValueError as error:
        raise ApiError(422, str(error)) from None
    query: Query
    if image is not None:
        query = ImageQuery(image)  # embedded below, by the server's batched model calls
    elif fields.get("id") is not None or fields.get("key") is not None:
        query = ItemQuery(_item_of(view, fields.get("id"), fields.get("key")))
    else:
        try:
            query = VectorQuery(check_vector(view.gallery, fields["vector"]))
        except NearsightError as error:  # the wrong length, zeros: a bad field
            raise ApiError(422, f"vector: {error}") from None
    asked = SearchRequest(query, fields["k"], fields.get("filter"), spec, fields["offset"],
                          fields["group_by"], fields["group_size"], gallery=view.name)  # fmt: skip
    limits = Limits(max_filter_conditions=state.max_filter_conditions)
    heavy = bool(asked.filters) or spec.active or asked.group_by is not None

    def answer(found: SearchResults) -> Response:
        """The answer, checked against its schema and written as JSON by the worker thread
        that searched: a k=1000 answer's rows cost the event loop nothing."""

        def shown(hit: Any) -> dict[str, Any]:
            return hit.as_json() | {"image_url": image_url(request, view.name, hit.id)}

        groups = None
        if found.groups is not None:
            groups = [{"value": g.value, "count": g.count,
                       "neighbours": [shown(hit) for hit in g.neighbours]} for g in found.groups]  # fmt: skip
        body = SearchAnswer.model_validate({
            "gallery": view.name,
            "k": asked.k,
            "rerank": spec.shown,
            "notes": found.notes,
            "offset": asked.offset,
            "group_by": asked.group_by,
            "groups": groups,
            "neighbours": [shown(n) for n in found],
        })  # fmt: skip
        return Response(body.model_dump_json(), media_type="application/json")

    def work(checked: CheckedRequest | None, embedded: EmbeddedQuery | None) -> Response:
        """The request checked (in a worker thread: filters are parsed here), run, and its
        answer written."""
        if checked is None:
            checked = view.check(asked, limits)
        return answer(view.run(checked if embedded is None else checked.with_query(embedded)))

    if image is not None:
        then = None if heavy else work
        checked, embedded, done = await _embed_upload(image, view, state, asked, limits, then)
    else:
        checked, embedded, done = None, None, None
    if done is None:
        gate = state.heavy if heavy else state.plain  # every search waits its turn, fairly
        done = await gate.run(lambda: work(checked, embedded))
    return cast(Response, done)


def _item_of(view: ServedGallery, item_id: int | None, key: str | None) -> int:
    """The gallery item a query names by id or by key (404 when there is none)."""
    if key is not None:
        if view.key_column is None:
            raise ApiError(404, f"gallery {view.name} has no key column")
        try:
            return view.id_of_key(key)
        except NearsightError:
            raise ApiError(404, f"gallery {view.name} has no item with that key") from None
    assert item_id is not None
    if item_id not in view.rows():
        raise ApiError(404, f"gallery {view.name} has no item with id {item_id}")
    return int(item_id)


async def _read_body(request: Request) -> tuple[dict[str, Any], UploadFile | None]:
    """The request's fields, checked by :class:`SearchJson` (``k`` defaulted), and its image
    upload if any: from a JSON body or a multipart (or urlencoded) form."""
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    image = None
    if kind == "application/json":
        body = await _json_body(request)
        # parsed and checked in a worker thread: a big object holds no other request
        return await run_in_threadpool(_json_fields, body), None
    elif kind in ("multipart/form-data", "application/x-www-form-urlencoded"):
        try:
            form = await request.form(max_files=1, max_fields=16)
        except Exception as error:  # a malformed multipart envelope
            raise ApiError(422, f"body: cannot read the form ({one_line(str(error))})") from None
        raw = {}
        for name, value in form.multi_items():
            if isinstance(value, UploadFile):
                if name != "image":
                    raise ApiError(422, f"{echo(name)}: only the image field takes a file")
                image = value
            elif name == "image":
                raise ApiError(422, "image: send a file")
            elif value != "" or name in ("key",):
                raw[name] = value
        if "vector" in raw:
            raw["vector"] = await run_in_threadpool(_parse_vector, raw["vector"])
    elif not kind and not await request.body():
        raw = {}  # nothing sent: the message below says what to send
    else:
        raise ApiError(415, "send the query as application/json or as a multipart/form-data form")
    return _checked(raw), image


async def _json_body(request: Request) -> bytes:
    """A JSON body of at most :data:`MAX_JSON_BYTES`, or 413 (from its Content-Length at
    once, else as soon as it passes the limit while it streams)."""
    length = request.headers.get("content-length", "")
    if length.isdigit() and int(length) > MAX_JSON_BYTES:
        raise ApiError(413, f"body: a JSON body is at most {MAX_JSON_BYTES} bytes")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_JSON_BYTES:
            raise ApiError(413, f"body: a JSON body is at most {MAX_JSON_BYTES} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def _json_fields(body: bytes) -> dict[str, Any]:
    try:
        raw: Any = json.loads(body or b"null")
    except (ValueError, RecursionError):
        raise ApiError(422, "body: not valid JSON") from None
    if not isinstance(raw, dict):
        raise ApiError(422, "body: a JSON object of id, key or vector, k, filter, ...")
    return _checked(raw)


def _checked(raw: dict[str, Any]) -> dict[str, Any]:
    """The request's fields checked by :class:`SearchJson` (``k`` defaulted)."""
    try:
        fields = SearchJson.model_validate(raw).model_dump()
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(part) for part in first.get("loc", ())) or "body"
        raise ApiError(422, one_line(f"{where}: {first.get('msg', 'invalid')}")) from None
    if isinstance(fields.get("filter"), list):
        fields["filter"] = [str(part) for part in fields["filter"]]
    return fields


class _Preprocessing(Protocol):
    """A served embedder: it turns a decoded image into the model's input."""

    def preprocess(self, image: Any) -> np.ndarray: ...


async def _embed_upload(
    upload: UploadFile,
    view: ServedGallery,
    state: RestState,
    asked: SearchRequest,
    limits: Limits,
    then: Callable[[CheckedRequest, EmbeddedQuery], Any] | None = None,
) -> tuple[CheckedRequest, EmbeddedQuery, Any]:
    """The request checked (in the decoding thread, before the decode: bad input costs no
    decoding), the upload embedded as an EmbeddedQuery (its vector; the gallery item it is
    when its bytes are an item's; its stage features [1, F] when the request's re-ranker takes
    them: then the vector and the features come from one run of the gallery's stage model, in
    the pool of re-ranked searches, not the embedding batcher), and ``then(checked,
    embedded)``'s answer when the decoding thread found the model idle, embedded the upload
    itself and so ran ``then`` too (None otherwise: the caller runs it)."""
    max_bytes = state.max_upload_bytes
    data = await upload.read(max_bytes + 1)
    if len(data) > max_bytes:
        limit = max_bytes / 1024 / 1024
        raise ApiError(413, f"the upload is larger than the server's limit ({limit:g} MB)")
    name = echo(upload.filename or "<upload>")
    batcher = state.batchers[id(view.embedder)]
    submitted: list[Future] = []
    checks: list[CheckedRequest] = []

    def prepare() -> tuple[EmbeddedQuery | np.ndarray, Any]:
        """(the embedded query, then's answer) or, not yet embedded, (model input, None)."""
        checked = view.check(asked, limits)
        checks.append(checked)
        twins: list[int | None] = []

        def find_twin() -> None:  # while the box decodes: the hash is off the critical path
            twins.append(view.identical_item(hashlib.sha256(data).hexdigest()))

        embedder = view.embedder
        failed: ImageLoadError | None = None
        try:
            # in the decode box: this process only ever holds the fitted pixels
            fitted = fit_bytes(
                data, name, embedder.resize, embedder.spec.interpolation, meanwhile=find_twin
            )
        except ImageLoadError as error:
            failed = error
        if not twins:
            find_twin()
        if twins[0] is not None:  # a gallery item's own file: searched as that item
            embedded = EmbeddedQuery(view.item_vector(twins[0]), twins[0])
            return embedded, None if then is None else then(checked, embedded)
        if failed is not None:
            raise ApiError(415, one_line(str(failed))) from None
        model_input = cast(_Preprocessing, embedder).preprocess(fitted.image)
        if checked.reranker.takes_query_features:
            return model_input, None
        vector = batcher.embed_now(model_input)  # a lone request: no trip to the batcher
        if vector is not None:
            embedded = EmbeddedQuery(vector)
            return embedded, None if then is None else then(checked, embedded)
        submitted.append(_submit(batcher, model_input))  # straight from this thread
        return model_input, None

    try:
        query, done = await state.decoding.run(prepare)
    except BaseException:  # cancelled (a deadline, a client gone) after the thread submitted
        for future in submitted:
            future.cancel()  # the batcher skips it
        raise
    checked = checks[0]
    if isinstance(query, EmbeddedQuery):
        return checked, query, done
    if submitted:
        return checked, EmbeddedQuery(await asyncio.wrap_future(submitted[0])), None
    model_input = query

    def with_stage() -> tuple[np.ndarray, np.ndarray]:
        stage = view.stage_model(checked.reranker)  # a one-line error (400) without one
        assert stage is not None  # the re-ranker takes stage features
        return stage.embed_with_stage(model_input[None])

    vectors, features = await state.heavy.run(with_stage)
    return checked, EmbeddedQuery(vectors[0], None, features), None


def _submit(batcher: EmbedBatcher, model_input: np.ndarray) -> Future:
    try:
        return batcher.submit(model_input)
    except BatcherFull as error:
        raise ApiError(503, f"the server is busy ({error}): retry") from None


def _parse_vector(text: str | None) -> Any:
    """A form's vector field: a JSON list of numbers; anything else (deep nesting, huge
    integers) is a 422."""
    if text is not None and len(text) > MAX_VECTOR_CHARS:
        raise ApiError(413, "vector is too long")
    try:
        value = json.loads(text or "")
    except (ValueError, RecursionError):
        raise ApiError(422, "vector must be a JSON list of numbers") from None
    try:
        array = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError, OverflowError):
        raise ApiError(422, "vector must be a JSON list of numbers") from None
    if array.ndim == 2 and len(array) == 1:  # [[...]]: one vector
        array = array[0]
    if array.dtype != np.float64 or array.ndim != 1:
        raise ApiError(422, "vector must be a JSON list of numbers (one vector)")
    return array.tolist()
