"""``POST /api/search``: the k nearest gallery items of an image, an item or a vector.

Multipart form: the query is ``image`` (a file), ``id`` (a gallery item: itself first, at
distance 0) or ``vector`` (a JSON list of D numbers); ``k``, ``filter`` (``KEY=VALUE;KEY>=N``),
``gallery``, ``rerank``. The request is checked once here, then searched through the gallery's
Searcher. Uploads are decoded in a bounded pool and embedded by the gallery model's
:class:`~nearsight.app.batcher.EmbedBatcher` (concurrent requests share one model call); an
upload with a gallery item's bytes is searched as that item. Filtered and re-ranked searches
share one small pool, so a plain search and health never wait behind them.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from typing import Annotated, Any

import numpy as np
from fastapi import APIRouter, Depends, File, Form, UploadFile
from fastapi.concurrency import run_in_threadpool

from nearsight.app.batcher import BatcherFull
from nearsight.app.rest.deps import ApiError, RestState, echo, one_line, rest_state
from nearsight.core.errors import NearsightError
from nearsight.data.images import ImageLoadError, load_image_bytes
from nearsight.search.rerank.spec import request_rerank
from nearsight.search.route import check_vector
from nearsight.search.served import ServedGallery

DEFAULT_K = 8
MAX_K = 1000
MAX_VECTOR_CHARS = 64 * 1024 * 1024

router = APIRouter(tags=["search"])


@router.post("/search")
async def search(
    state: Annotated[RestState, Depends(rest_state)],
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
            description="none | aqe | dba | dba+aqe | kreciprocal | pairwise[:K=V,...] "
            "(default: the server's; pairwise runs the server's own re-ranker only)",
        ),
    ] = None,
) -> dict[str, Any]:
    """The k nearest gallery items of an image, an item or a vector."""
    query_fields = (("image", image), ("id", item_id), ("vector", vector))
    if sum(value is not None for _, value in query_fields) != 1:
        raise ApiError(422, "send exactly one of: image (a file), id, vector")
    view = state.view(gallery)
    try:
        spec = view.rerank if rerank is None else request_rerank(rerank, view.rerank)
    except ValueError as error:
        raise ApiError(422, str(error)) from None
    self_id = None  # a query that is a gallery item comes first, at distance 0
    if image is not None:
        query, self_id = await _embed_upload(image, view, state)
    elif item_id is not None:
        if item_id not in view.rows():
            raise ApiError(404, f"gallery {view.name} has no item with id {item_id}")
        query, self_id = view.item_vector(item_id), item_id
    else:
        try:
            query = check_vector(view.gallery, _parse_vector(vector))
        except NearsightError as error:  # the wrong length, zeros: a bad field
            raise ApiError(422, f"vector: {error}") from None

    def work():
        allowed = view.allowed_ids(filter, state.max_filter_conditions)
        return view.search_one(query, k, allowed=allowed, rerank=spec, self_id=self_id)

    heavy = bool(filter and filter.strip()) or spec.active
    found = await (state.heavy.run(work) if heavy else run_in_threadpool(work))
    return {
        "gallery": view.name,
        "k": k,
        "rerank": str(spec),
        "neighbours": [n.as_json() for n in found],
    }


async def _embed_upload(
    upload: UploadFile, view: ServedGallery, state: RestState
) -> tuple[Any, int | None]:
    """The upload's query vector, and the gallery item it is when its bytes are an item's."""
    max_bytes = state.max_upload_bytes
    data = await upload.read(max_bytes + 1)
    if len(data) > max_bytes:
        limit = max_bytes / 1024 / 1024
        raise ApiError(413, f"the upload is larger than the server's limit ({limit:g} MB)")
    name = echo(upload.filename or "<upload>")
    twin = view.identical_item(hashlib.sha256(data).hexdigest())
    if twin is not None:  # a gallery item's own file: searched as that item
        return view.item_vector(twin), twin

    def prepare():
        try:
            # the pixel limit is checked from the header; a JPEG is decoded as the gallery's were
            image = load_image_bytes(data, name, view.embedder.resize)
        except ImageLoadError as error:
            raise ApiError(415, one_line(str(error))) from None
        return view.embedder.preprocess(image)

    model_input = await state.decoding.run(prepare)
    try:
        future = state.batchers[id(view.embedder)].submit(model_input)
    except BatcherFull as error:
        raise ApiError(503, f"the server is busy ({error}): retry") from None
    return await asyncio.wrap_future(future), None


def _parse_vector(text: str | None) -> Any:
    """A JSON list of numbers; anything else (deep nesting, huge integers) is a 422."""
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
    if array.dtype != np.float64 or array.ndim not in (1, 2):
        raise ApiError(422, "vector must be a JSON list of numbers")
    return array
