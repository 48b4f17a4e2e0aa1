"""``GET /api/items/{id}`` and ``GET /api/items/by-key``: a gallery item's catalog row and
metadata, by id or by key (any text: a query parameter, or percent-encoded in the path)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Query

from nearsight.app.rest.deps import ApiError, RestState, rest_state
from nearsight.app.rest.models import ERRORS, Item
from nearsight.core.errors import NearsightError
from nearsight.index.gallery.keys import ids_of_keys, key_column, normal_key

KEY_RULE = "the key rule of every route: spaces around it dropped, Unicode NFC, 1 to 200 characters"

router = APIRouter(
    prefix="/items",
    tags=["items"],
    responses={s: ERRORS[s] for s in (401, 404, 422, 503)},
)
State = Annotated[RestState, Depends(rest_state)]


def _keyed_item(state: RestState, key: str, gallery: str | None) -> dict[str, Any]:
    try:
        key = normal_key(key)  # the one rule (nearsight/index/gallery/keys.py)
    except NearsightError as error:
        raise ApiError(422, f"key: {error}") from None
    view = state.view(gallery)
    if key_column(view.gallery) is None:
        raise ApiError(404, f"gallery {view.name} has no key column")
    found = ids_of_keys(view.gallery, [key])
    if key not in found or found[key] not in view.rows():
        raise ApiError(404, f"gallery {view.name} has no item with that key")
    return view.item_json(found[key])


# before /items/{item_id}, which would read "by-key" as an id
@router.get("/by-key", response_model=Item)
def item_by_key_query(
    state: State,
    key: Annotated[str, Query(description=KEY_RULE)],
    gallery: str | None = None,
) -> dict[str, Any]:
    """The item with this key (the gallery's key column, e.g. a SKU): any text, as a query
    parameter (``?key=a/b%20c``)."""
    return _keyed_item(state, key, gallery)


# a path converter: the server decodes %2F to "/" before routing, so a key may hold "/"
@router.get("/by-key/{key:path}", response_model=Item)
def item_by_key(
    state: State,
    key: Annotated[str, Path(description=KEY_RULE)],
    gallery: str | None = None,
) -> dict[str, Any]:
    """The item with this key, percent-encoded in the path (``/items/by-key/a%2Fb``)."""
    return _keyed_item(state, key, gallery)


@router.get("/{item_id}", response_model=Item)
def item(state: State, item_id: int, gallery: str | None = None) -> dict[str, Any]:
    """A gallery item's catalog row and metadata."""
    view = state.view(gallery)
    if item_id not in view.rows():  # the message names the gallery, never its folder
        raise ApiError(404, f"gallery {view.name} has no item with id {item_id}")
    return view.item_json(item_id)
