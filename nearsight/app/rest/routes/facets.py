"""``GET /api/facets``: what the items a filter allows hold, column by column: each text
column's most frequent values with exact counts, each number and date column's range and a
histogram (nearsight/search/facets.py, the function behind every face)."""

from __future__ import annotations

import json
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query
from pydantic import BaseModel, Field

from nearsight.app.rest.deps import ApiError, RestState, rest_state
from nearsight.app.rest.models import ERRORS
from nearsight.index.catalog.facets import BINS, TOP_VALUES
from nearsight.search.facets import MAX_BINS, MAX_TOP, gallery_facets


class FacetValue(BaseModel):
    value: str
    count: int


class FacetBin(BaseModel):
    low: float | str = Field(description="the bin's start (a number, or an ISO date)")
    high: float | str = Field(description="its end (held by the last bin only)")
    count: int


class ColumnFacets(BaseModel):
    key: str
    type: str = Field(description="int, float, str, date or datetime")
    missing: int = Field(description="allowed items without a value")
    distinct: int | None = Field(None, description="text: distinct values among the allowed")
    values: list[FacetValue] | None = Field(None, description="text: most frequent first")
    low: float | str | None = Field(None, description="numbers, dates: the smallest value")
    high: float | str | None = Field(None, description="numbers, dates: the largest value")
    histogram: list[FacetBin] | None = None


class FacetsAnswer(BaseModel):
    """The answer of ``GET /api/facets``."""

    gallery: str
    items: int = Field(description="how many items the filter allows")
    columns: list[ColumnFacets]
    notes: list[str] = Field(description="notes on filter values no item holds")


router = APIRouter(tags=["facets"], responses={s: ERRORS[s] for s in (400, 401, 404, 422, 503)})
State = Annotated[RestState, Depends(rest_state)]


@router.get("/facets", response_model=FacetsAnswer, response_model_exclude_none=True)
async def facets(
    state: State,
    filter: Annotated[
        list[str] | None,
        Query(
            description="KEY=VALUE;KEY=A|B;KEY>=N;... (repeatable: all must hold), or one "
            'JSON object {"KEY": VALUE or [VALUES]}'
        ),  # fmt: skip
    ] = None,
    gallery: str | None = None,
    top: Annotated[int, Query(ge=1, le=MAX_TOP)] = TOP_VALUES,
    bins: Annotated[int, Query(ge=1, le=MAX_BINS)] = BINS,
) -> dict[str, Any]:
    """Facets of the items the filter allows (all items without one): ``items`` (how many),
    ``columns`` (text: ``values`` [{value, count}], most frequent first, and ``distinct``;
    numbers and dates: ``low``, ``high``, ``histogram`` [{low, high, count}]; each with
    ``missing``, the allowed items without a value) and ``notes`` on filter values no item
    holds."""
    view = state.view(gallery)
    filters: Any = [part for part in filter or [] if part.strip()]
    if len(filters) == 1 and filters[0].lstrip().startswith("{"):
        try:
            filters = json.loads(filters[0])
        except ValueError:
            raise ApiError(422, "filter: not a valid JSON object") from None
        if not isinstance(filters, dict):
            raise ApiError(422, "filter: a JSON object of KEY: VALUE")
    found = await state.heavy.run(
        lambda: gallery_facets(
            view.gallery, filters or None, top, bins, state.max_filter_conditions
        )  # fmt: skip
    )
    return {"gallery": view.name, **found.as_dict()}
