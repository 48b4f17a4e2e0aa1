"""The REST API's answers and requests as pydantic models, so that the OpenAPI schema
(``/api/openapi.json``) describes exactly what the server sends: every 200 answer, and every
error as it really is, ``{"error": "one line"}``."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from nearsight.data.meta import AnswerValue, MetaValue


class Neighbour(BaseModel):
    """A gallery item found for a query (nearsight.search.neighbour.Neighbour)."""

    rank: int = Field(description="1 for the nearest")
    id: int
    key: str | None = Field(description="the item's key (the gallery's key column), if any")
    path: str = Field(description="the item's path relative to the gallery's root")
    label: int | None
    class_name: str | None
    distance: float | None = Field(description="Euclidean distance between unit embeddings, 0 to 2")
    meta: dict[str, AnswerValue] = Field(
        description="the item's metadata columns (a tag column's value: its list of tags)"
    )
    image_url: str = Field(
        description="the item's image, behind the API key like every route (GET; ?size=N for "
        "a thumbnail)"
    )


class Group(BaseModel):
    """One value of a grouped search's column and its best hits (nearsight.search.groups)."""

    value: MetaValue = Field(description="the value the group's items hold")
    count: int = Field(description="the items the filters allow that hold it")
    neighbours: list[Neighbour] = Field(description="its best group_size items, nearest first")


class SearchAnswer(BaseModel):
    """The answer of ``POST /api/search``."""

    gallery: str
    k: int
    rerank: str = Field(
        description="the re-ranking applied ('none' for none; a pairwise re-ranker by its file name)"
    )
    notes: list[str] = Field(
        description="notes on the request, e.g. a filter value no item holds and the closest "
        "values its column holds"
    )
    offset: int = Field(description="ranks (or groups) before this page")
    group_by: str | None = Field(description="the column grouped by, null when not grouped")
    groups: list[Group] | None = Field(
        description="a grouped search's groups (ordered by their best distance), null when not "
        "grouped"
    )
    neighbours: list[Neighbour] = Field(
        description="the page's items, nearest first (grouped: every group's hits, group after "
        "group)"
    )


class Item(BaseModel):
    """A gallery item's catalog row (``GET /api/items/...``)."""

    id: int
    key: str | None
    path: str
    label: int | None
    class_name: str | None
    split: str | None
    sha256: str | None
    width: int | None
    height: int | None
    meta: dict[str, AnswerValue] = Field(
        description="its metadata columns (a tag column's value: its list of tags)"
    )


class GallerySummary(BaseModel):
    """One served gallery's facts (nearsight.index.gallery.summary.gallery_summary)."""

    name: str
    generation: int = Field(description="reloads since the server started (live galleries)")
    items: int
    labelled: int
    classes: int
    dim: int
    metric: str
    index_type: str
    model: str | None = Field(description="the model file's name")
    model_sha256: str
    key_column: str | None
    columns: dict[str, str] = Field(
        description="each metadata column's type: int, float, str, date, datetime, or list[str] "
        "(a tag column)"
    )
    created: str | None
    dataset: str | None
    split: str | None


class Galleries(BaseModel):
    """The answer of ``GET /api/galleries``."""

    galleries: list[GallerySummary]


class Health(BaseModel):
    """The answer of ``GET /api/health``."""

    status: Literal["ok"]
    galleries: list[GallerySummary]


class Error(BaseModel):
    """Every error the API sends, with a 4xx status (503 when the server is busy)."""

    error: str = Field(description="what was wrong, in one line")


FilterValue = str | int | float | bool | list[str | int | float] | None


class SearchJson(BaseModel):
    """``POST /api/search`` as a JSON body: a query by ``id``, ``key`` or ``vector`` (an image
    goes in a multipart form)."""

    model_config = ConfigDict(extra="forbid")

    id: int | None = Field(None, description="query by this gallery item (itself first)")
    key: str | None = Field(
        None, min_length=1, max_length=200, description="query by the item with this key"
    )
    vector: list[float] | None = Field(None, description="query by a vector of D numbers")
    k: int = Field(8, ge=1, le=1000, description="items (or groups) per page")
    offset: int = Field(
        0,
        ge=0,
        le=10000,
        description="a page: ranks offset+1 to offset+k of the search of "
        "offset+k (with group_by: groups)",
    )
    group_by: str | None = Field(
        None,
        min_length=1,
        max_length=200,
        description="group by this column (a product's SKU): at most k groups ordered by their "
        "best distance; items without a value are left out",
    )
    group_size: int = Field(1, ge=1, le=100, description="with group_by: the best hits per group")
    filter: str | list[str] | dict[str, FilterValue] | None = Field(
        None,
        description="KEY=VALUE;KEY=A|B;KEY>=N;... (or a list of them), or a JSON object "
        '{"KEY": VALUE} (a list value: any of them; null: items without the key)',
    )
    gallery: str | None = None
    rerank: str | None = Field(
        None,
        max_length=200,
        description="none | aqe | dba | dba+aqe | kreciprocal | pairwise[:K=V,...] (default: "
        "the server's; pairwise runs the server's own re-ranker only)",
    )


ERRORS = {
    status: {"model": Error, "description": description}
    for status, description in {
        400: "bad input (a filter, a metadata value)",
        401: "missing or wrong API key",
        403: "writes are off on this server (serve --allow-writes turns them on)",
        404: "no such gallery or item",
        413: "the request is too large",
        415: "the upload is not an image",
        422: "a field is missing or malformed",
        503: "the server is busy: retry after Retry-After seconds",
    }.items()
}
