"""Writes over REST, keyed: ``POST /api/items`` (an image, its key and metadata: insert, or
replace the item with that key), ``PATCH /api/items/by-key`` (change an item's metadata) and
``DELETE /api/items/by-key``. Off unless the server runs with ``--allow-writes`` (403), and
behind the API key like every route where the server has one; a read-only key
(``NAME KEY read`` in ``--keys-file``) is refused with 403.

Each write is what ``nearsight index add`` / ``index remove`` run
(nearsight/index/gallery/update.py): the same writer lock and atomic files, so a write killed
midway leaves the gallery as it was. The served gallery is reopened after it, so the next
search sees it. An uploaded image is checked in the decode box (as a query upload is), then
kept in the folder ``GALLERY.images`` beside the gallery (named by its SHA-256), since the
catalog names each item's file. Replacing an item (a POST with a taken key, or a PATCH)
gives it a new id, as ``index add --key`` does. Writes take one at a time.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request
from fastapi.concurrency import run_in_threadpool
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.datastructures import UploadFile

from nearsight.app.rest.deps import ApiError, RestState, echo, one_line, rest_state
from nearsight.app.rest.models import ERRORS, Item
from nearsight.app.rest.routes.images import image_kind, image_url
from nearsight.app.serve.auth import presented_key
from nearsight.core.atomic import atomic_file
from nearsight.core.errors import NearsightError
from nearsight.data.decode_box import fit_bytes
from nearsight.data.images import ImageLoadError
from nearsight.data.meta import AnswerValue
from nearsight.index.gallery.keys import ids_of_keys, key_column, normal_key
from nearsight.index.gallery.lock import gallery_lock
from nearsight.search.served import ServedGallery

UPLOADS_SUFFIX = ".images"  # GALLERY.images/: the files of items posted over REST
CHECK_SIDE = 32  # the upload is decoded at this size to check it is an image
# what nearsight.core.atomic.atomic_file names an image's file while it is written
_TEMPORARY_IMAGE = re.compile(r"\.[0-9a-f]{64}\.[a-z]+\.[A-Za-z0-9_]{8}\.tmp")
_WRITING = threading.Lock()  # one write at a time: each reopens the gallery it changed

router = APIRouter(
    prefix="/items",
    tags=["writes"],
    responses={s: ERRORS[s] for s in (400, 401, 403, 404, 413, 415, 422, 503)},
)
State = Annotated[RestState, Depends(rest_state)]


class Written(Item):
    """The item as written (its catalog row, ``key`` and ``image_url``)."""

    image_url: str
    replaced: int | None = Field(description="the id of the item it replaced, if any")


class Removed(BaseModel):
    """The answer of ``DELETE /api/items/by-key``."""

    gallery: str
    key: str
    removed: int = Field(description="the id of the removed item")
    items: int = Field(description="items in the gallery now")


class MetaPatch(BaseModel):
    """``PATCH /api/items/by-key``: the fields to set (null removes one)."""

    model_config = ConfigDict(extra="forbid")

    key: str = Field(min_length=1, max_length=200)
    meta: dict[str, AnswerValue | None]
    gallery: str | None = None


def _may_write(request: Request, state: RestState) -> None:
    """403 unless writes are on and the request's key may write (a read-only key of
    ``--keys-file`` may not); checked before the body is read."""
    if not getattr(request.app.state, "allow_writes", False):
        raise ApiError(403, "writes are off on this server (start it with --allow-writes)")
    keys = state.keys
    if not keys:
        return
    # the guard names the holder (a header's key or a browser's session); else the header's
    name = request.scope.get("nearsight.key") or keys.match(presented_key(request.scope["headers"]))
    if not keys.may_write(name):
        raise ApiError(403, f"the key {name!r} may only read: writes need a key that may write "
                       "(a line NAME KEY write in --keys-file)")  # fmt: skip


def _writable(request: Request, state: RestState, gallery: str | None) -> ServedGallery:
    _may_write(request, state)
    return state.view(gallery)


def _shown(error: NearsightError, view: ServedGallery) -> str:
    """An error of the index layer, naming the gallery as served, never its folder."""
    return one_line(str(error).replace(str(view.gallery.path), view.name))


def _swap(state: RestState, view: ServedGallery) -> ServedGallery:
    """The gallery reopened as it is on disk now, served from the next request on."""
    fresh = view.reopened()
    state.galleries.views[view.name] = fresh
    return fresh


def _answer(request: Request, view: ServedGallery, item_id: int, replaced: int | None) -> dict:
    return view.item_json(item_id) | {"replaced": replaced,
                                      "image_url": image_url(request, view.name, item_id)}  # fmt: skip


_POST_FORM = {
    "type": "object",
    "required": ["image"],
    "properties": {
        "image": {"type": "string", "format": "binary", "description": "the item's image"},
        "key": {"type": "string", "description": "its key: an item with this key is replaced"},
        "meta": {
            "type": "string",
            "description": 'its fields, a JSON object: {"price": 9.5, "tags": ["sale"]}',
        },
        "label": {"type": "string", "description": "its class: a label number or a class name"},
        "gallery": {"type": "string"},
    },
}


@router.post(
    "",
    response_model=Written,
    status_code=201,
    openapi_extra={"requestBody": {"required": True, "content": {
        "multipart/form-data": {"schema": _POST_FORM}}}},
)  # fmt: skip
async def post_item(request: Request, state: State) -> dict[str, Any]:
    """Add an item: a multipart form with ``image`` (a file), ``key`` (replaces the item with
    that key), ``meta`` (a JSON object of its fields), ``label`` and ``gallery``."""
    _may_write(request, state)  # before the upload is read
    try:
        form = await request.form(max_files=1, max_fields=8)
    except Exception as error:  # a malformed or non-form body
        raise ApiError(422, f"body: send a multipart form ({one_line(str(error))})") from None
    fields = {name: value for name, value in form.multi_items()}
    view = _writable(request, state, _text(fields, "gallery"))
    upload = fields.get("image")
    if not isinstance(upload, UploadFile):
        raise ApiError(422, "image: send the item's image file")
    data = await upload.read(state.max_upload_bytes + 1)
    if len(data) > state.max_upload_bytes:
        raise ApiError(413, "the upload is larger than the server's limit")
    meta = _meta(_text(fields, "meta"))
    key = _text(fields, "key")
    label = _text(fields, "label")
    name = echo(upload.filename or "<upload>")
    await state.decoding.run(lambda: _check_image(data, name))

    def write() -> dict[str, Any]:
        with _WRITING:
            current = state.view(view.name)
            path = _keep(current, data)
            try:
                report = _add(current, path, key, meta, label)
            except NearsightError as error:
                raise ApiError(400, _shown(error, current)) from None
            fresh = _swap(state, current)
            return _answer(request, fresh, report.ids[0], report.replaced)

    return await run_in_threadpool(write)


@router.patch(
    "/by-key",
    response_model=Written,
    openapi_extra={"requestBody": {"required": True, "content": {
        "application/json": {"schema": MetaPatch.model_json_schema()}}}},
)  # fmt: skip
async def patch_item(request: Request, state: State) -> dict[str, Any]:
    """Change an item's metadata (``{"key": K, "meta": {"price": 9.5, "colour": null}}``: set
    price, remove colour); the item keeps its file, key and label, under a new id."""
    try:
        patch = MetaPatch.model_validate(json.loads(await request.body() or b"null"))
    except (ValueError, ValidationError) as error:
        raise ApiError(
            422, f"body: {{'key': K, 'meta': {{...}}}} ({one_line(str(error))})"
        ) from None
    view = _writable(request, state, patch.gallery)

    def write() -> dict[str, Any]:
        with _WRITING:
            current = state.view(view.name)
            item_id, row = _keyed(current, patch.key)
            meta = {k: v for k, v in {**row["meta"], **patch.meta}.items() if v is not None}
            meta.pop(current.key_column or "", None)
            try:
                report = _add(current, Path(row["path"]), patch.key, meta, row["label"])
            except NearsightError as error:
                raise ApiError(400, _shown(error, current)) from None
            fresh = _swap(state, current)
            return _answer(request, fresh, report.ids[0], item_id)

    return await run_in_threadpool(write)


@router.delete("/by-key", response_model=Removed)
async def delete_item(
    request: Request,
    state: State,
    key: Annotated[str, Query(min_length=1, max_length=200)],
    gallery: str | None = None,
) -> dict[str, Any]:
    """Remove the item with this key."""
    view = _writable(request, state, gallery)

    def write() -> dict[str, Any]:
        from nearsight.index.gallery.update import remove_items

        with _WRITING:
            current = state.view(view.name)
            item_id, _ = _keyed(current, key)
            try:
                report = remove_items(current.gallery.path, ids=[item_id])
            except NearsightError as error:
                raise ApiError(400, _shown(error, current)) from None
            _swap(state, current)
            return {"gallery": current.name, "key": normal_key(key), "removed": item_id,
                    "items": report.items}  # fmt: skip

    return await run_in_threadpool(write)


def _text(fields: dict[str, Any], name: str) -> str | None:
    value = fields.get(name)
    if isinstance(value, UploadFile):
        raise ApiError(422, f"{name}: send text, not a file")
    return None if value in (None, "") else str(value)


def _meta(text: str | None) -> dict[str, Any]:
    """The ``meta`` field: a JSON object of text and numbers (a tag column's: a list of
    texts)."""
    if text is None:
        return {}
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        raise ApiError(422, 'meta: a JSON object of fields, e.g. {"price": 9.5}') from None
    if not isinstance(value, dict) or not all(map(_field_value, value.values())):
        raise ApiError(
            422, "meta: a JSON object of text and numbers (a tag column's: a list of texts)"
        )
    return value


def _field_value(value: Any) -> bool:
    """A value ``meta`` may hold: text, a number, or a list of texts (a tag column's)."""
    if isinstance(value, list):
        return all(isinstance(tag, str) for tag in value)
    return isinstance(value, str | int | float) and not isinstance(value, bool)


def _check_image(data: bytes, name: str) -> None:
    """The upload decoded in the decode box (a bomb or a non-image never reaches the
    catalog): 415 when it is not an image this server reads."""
    if image_kind(data) is None:
        raise ApiError(415, f"{name}: not a JPEG, PNG, WebP, GIF, BMP or TIFF image")
    try:
        fit_bytes(data, name, CHECK_SIDE)
    except ImageLoadError as error:
        raise ApiError(415, one_line(str(error))) from None


def _keep(view: ServedGallery, data: bytes) -> Path:
    """The upload stored (atomically) beside the gallery, named by its SHA-256, under the
    gallery's writer lock, which also sweeps the temporary files of writes killed midway
    (another server's live write holds the lock while its file is temporary)."""
    suffix = image_kind(data)[1]  # type: ignore[index]  # checked by _check_image
    folder = Path(str(view.gallery.path) + UPLOADS_SUFFIX)
    path = folder / f"{hashlib.sha256(data).hexdigest()}{suffix}"
    with gallery_lock(view.gallery.path, exclusive=True):
        if folder.is_dir():
            for leftover in folder.iterdir():
                if _TEMPORARY_IMAGE.fullmatch(leftover.name):
                    leftover.unlink(missing_ok=True)
        if not path.exists():
            with atomic_file(path, "wb") as handle:
                handle.write(data)
    return path


def _keyed(view: ServedGallery, key: str) -> tuple[int, dict[str, Any]]:
    """The id and catalog row of the item with ``key`` (404 when there is none)."""
    try:
        key = normal_key(key)
    except NearsightError as error:
        raise ApiError(422, f"key: {error}") from None
    if key_column(view.gallery) is None:
        raise ApiError(404, f"gallery {view.name} has no key column")
    found = ids_of_keys(view.gallery, [key])
    if key not in found:
        raise ApiError(404, f"gallery {view.name} has no item with that key")
    return found[key], view.row(found[key])


def _add(view: ServedGallery, path: Path, key: str | None, meta: dict, label: Any):
    """``index add`` of one file with the served model (nearsight.index.gallery.update)."""
    from nearsight.index.gallery.update import add_images

    if key is not None and key_column(view.gallery) is None:
        raise ApiError(400, f"gallery {view.name} has no key column: post without a key")
    return add_images(view.gallery.path, [path], key=key, meta=meta, label=label,
                      model=view.embedder, device="cpu")  # fmt: skip
