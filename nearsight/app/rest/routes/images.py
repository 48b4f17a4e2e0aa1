"""``GET /api/items/{id}/image``: a gallery item's image (``?size=N``: a JPEG thumbnail whose
longer side is at most N pixels), behind the API key like every route.

The file is the one the item's catalog row names; no request names a file, and no answer or
error shows a server path. A thumbnail is decoded in the decode box (as an upload is), the
whole image is sent as its bytes, typed by its signature (a file that is not an image is
never sent). Each REST neighbour carries this route
as its ``image_url`` (:func:`image_url`).
"""

from __future__ import annotations

import io
import os
from typing import Annotated
from urllib.parse import quote

from fastapi import APIRouter, Depends, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import Response

from nearsight.app.rest.deps import ApiError, RestState, rest_state
from nearsight.app.rest.models import ERRORS
from nearsight.core.errors import NearsightError
from nearsight.data.decode_box import fit_file
from nearsight.search.served import ServedGallery

MIN_SIZE, MAX_SIZE = 16, 1024  # a thumbnail's longer side, in pixels
# an image file's first bytes -> (its media type, its usual suffix)
IMAGE_MAGIC = ((b"\xff\xd8\xff", "image/jpeg", ".jpg"), (b"\x89PNG\r\n\x1a\n", "image/png", ".png"),
               (b"GIF8", "image/gif", ".gif"), (b"BM", "image/bmp", ".bmp"),
               (b"II*\x00", "image/tiff", ".tif"), (b"MM\x00*", "image/tiff", ".tif"))  # fmt: skip


def image_kind(data: bytes) -> tuple[str, str] | None:
    """(media type, suffix) of an image file's bytes by their signature, None when they are
    not a JPEG, PNG, WebP, GIF, BMP or TIFF file."""
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp", ".webp"
    return next(((kind, suffix) for magic, kind, suffix in IMAGE_MAGIC if data.startswith(magic)),
                None)  # fmt: skip


router = APIRouter(
    tags=["items"],
    responses={s: ERRORS[s] for s in (401, 404, 415, 422, 503)},
)


def image_url(request: Request, gallery: str, item_id: int) -> str:
    """The path of item ``item_id``'s image route, under the API's mount point."""
    root = request.scope.get("root_path", "").rstrip("/")
    return f"{root}/items/{int(item_id)}/image?gallery={quote(gallery, safe='')}"


@router.get(
    "/items/{item_id}/image",
    response_class=Response,
    responses={200: {"content": {"image/*": {}}, "description": "the image, or a JPEG thumbnail"}},
)
async def item_image(
    state: Annotated[RestState, Depends(rest_state)],
    item_id: int,
    gallery: str | None = None,
    size: Annotated[
        int | None,
        Query(ge=MIN_SIZE, le=MAX_SIZE, description="a JPEG thumbnail of at most N pixels"),
    ] = None,
) -> Response:
    """The item's image as stored (or a thumbnail, ``?size=N``)."""
    view = state.view(gallery)
    if item_id not in view.rows():
        raise ApiError(404, f"gallery {view.name} has no item with id {item_id}")
    path = str(view.row(item_id)["path"])
    if size is None:
        data = await run_in_threadpool(_read, view, item_id, path)
        kind = image_kind(data)
        if kind is None:  # served only as what it is: never another file's bytes
            raise ApiError(415, f"item {item_id} of gallery {view.name}: its file is not an "
                                "image this server sends")  # fmt: skip
        return Response(data, media_type=kind[0], headers=_HEADERS)
    data = await state.decoding.run(lambda: _thumbnail(view, item_id, path, size))
    return Response(data, media_type="image/jpeg", headers=_HEADERS)


_HEADERS = {"X-Content-Type-Options": "nosniff", "Cache-Control": "private, max-age=300"}


def _read(view: ServedGallery, item_id: int, path: str) -> bytes:
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except OSError:  # the message names the item, never the server's folder
        raise ApiError(404, f"item {item_id} of gallery {view.name}: its image is not on this "
                            "server") from None  # fmt: skip


def _thumbnail(view: ServedGallery, item_id: int, path: str, size: int) -> bytes:
    if not os.path.isfile(path):
        _read(view, item_id, path)  # the 404
    try:
        image = fit_file(path, size).image  # in the decode box: the file is not trusted
    except (NearsightError, OSError):
        raise ApiError(415, f"item {item_id} of gallery {view.name}: its file is not an image "
                            "this server can read") from None  # fmt: skip
    image.thumbnail((size, size))
    out = io.BytesIO()
    image.convert("RGB").save(out, format="JPEG", quality=85)
    return out.getvalue()
