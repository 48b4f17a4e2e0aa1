"""Stable item keys (a shop's SKU) and duplicate images, for building and updating galleries.

A gallery may name one metadata column its key (catalog meta ``key_column``; ``key`` by
default when the source has such a column, or ``--key-column NAME``). Keys are unique in the
gallery and may be any text (``/``, ``%``, spaces, unicode) under one rule, :func:`normal_key`,
applied wherever a key comes in (build, import, ``index add``/``remove``/``show``, Python,
REST): surrounding spaces stripped, Unicode NFC (one spelling of "é"), 1 to
:data:`MAX_KEY_CHARS` characters.
``index add`` with a key the gallery holds replaces that item, ``index remove --keys`` deletes
by key, ``index show --key`` and REST's ``/api/items/by-key?key=K`` (or the percent-encoded
``/api/items/by-key/K``) read one. Duplicate images (the same file bytes, by sha256) are
reported, not refused: a shop may list one photo under two SKUs.
"""

from __future__ import annotations

import unicodedata
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from nearsight.core.errors import NearsightError

if TYPE_CHECKING:
    from nearsight.index.gallery.core import Gallery

DEFAULT_KEY_COLUMN = "key"
MAX_KEY_CHARS = 200
DUPLICATE_EXAMPLES = 3  # the note stays one readable line


def declared_meta_types(
    declared: Mapping[str, str] | None, key_column: str | None = None
) -> dict[str, str]:
    """The declared metadata column types, with the key column (``key_column``, else
    ``key``) declared text: keys are names, not numbers ("0042" stays "0042")."""
    types = dict(declared or {})
    types.setdefault(key_column or DEFAULT_KEY_COLUMN, "str")
    return types


def normal_key(key: object) -> str:
    """The key as stored and compared: text, surrounding spaces stripped, Unicode NFC; a
    NearsightError for an empty one or one over :data:`MAX_KEY_CHARS` characters."""
    text = unicodedata.normalize("NFC", str(key).strip())
    if not text:
        raise NearsightError("a key may not be empty")
    if len(text) > MAX_KEY_CHARS:
        raise NearsightError(f"a key has at most {MAX_KEY_CHARS} characters, got {len(text)}")
    return text


def _lookup_form(key: object) -> str | None:
    """The form of a key looked up; None for one no gallery can hold."""
    try:
        return normal_key(key)
    except NearsightError:
        return None


def key_column(gallery: Gallery) -> str | None:
    return gallery.meta.get("key_column")


def check_unique_keys(rows: Sequence[dict[str, Any]], column: str) -> None:
    """Every row has a key in ``column``, each is rewritten in its :func:`normal_key` form,
    and no key repeats (one-line error naming one)."""
    keys = [str((row.get("meta") or {}).get(column, "") or "").strip() for row in rows]
    missing = sum(not key for key in keys)
    if missing:
        raise NearsightError(
            f"{missing} items have no {column!r} (the key column): give every item one"
        )
    keys = [normal_key(key) for key in keys]
    for row, key in zip(rows, keys, strict=True):
        row["meta"][column] = key
    repeated = [key for key, count in Counter(keys).items() if count > 1]
    if repeated:
        raise NearsightError(
            f"key column {column!r} repeats {len(repeated)} keys (e.g. {repeated[0]!r}): keys "
            "must be unique in a gallery"
        )


def ids_of_keys(gallery: Gallery, keys: Sequence[str]) -> dict[str, int]:
    """key -> item id for the ``keys`` the gallery holds. A key is any text, compared in its
    :func:`normal_key` form: the answer maps each key as given."""
    column = key_column(gallery)
    if column is None:
        raise NearsightError(
            f"gallery {gallery.path} has no key column (build it with a 'key' column or "
            "--key-column NAME)"
        )
    stored = {str(key): _lookup_form(key) for key in keys}
    assert gallery._catalog is not None
    found = gallery._catalog.ids_by_meta(column, sorted({v for v in stored.values() if v}))
    return {key: found[value][0] for key, value in stored.items() if value in found}


def item_of_key(gallery: Gallery, key: str) -> dict[str, Any]:
    """The catalog row of the item with this key (one-line NearsightError when none has it)."""
    found = ids_of_keys(gallery, [key])
    if key not in found:
        raise NearsightError(f"gallery {gallery.path} has no item with key {str(key)!r}")
    return gallery.items([found[key]])[0]


def duplicate_note(
    hashes: Sequence[str | None], paths: Sequence[str], known: dict[str, int]
) -> str:
    """One line about images whose bytes repeat among ``hashes`` or match gallery items
    (``known``: sha256 -> id); empty when none do."""
    seen: dict[str, str] = {}
    pairs: list[str] = []
    for sha, path in zip(hashes, paths, strict=True):
        if not sha:
            continue
        if sha in known:
            pairs.append(f"{path} = item {known[sha]}")
        elif sha in seen:
            pairs.append(f"{path} = {seen[sha]}")
        else:
            seen[sha] = path
    if not pairs:
        return ""
    more = "; ..." if len(pairs) > DUPLICATE_EXAMPLES else ""
    examples = "; ".join(pairs[:DUPLICATE_EXAMPLES])
    return f"note: {len(pairs)} duplicate images (same bytes), e.g. {examples}{more}"
