"""``GET /api/health`` and ``GET /api/galleries``: whether the server is up, and each served
gallery's facts (one function makes them, for these routes, ``nearsight index info`` and the
page: nearsight.index.gallery.summary). No key needed for health; the gallery list takes the
key like every other route."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends

from nearsight.app.rest.deps import RestState, rest_state
from nearsight.app.rest.models import ERRORS, Galleries, Health

router = APIRouter(tags=["health"])
galleries_router = APIRouter(tags=["galleries"])
State = Annotated[RestState, Depends(rest_state)]


@router.get("/health", response_model=Health, responses={503: ERRORS[503]})
def health(state: State) -> dict[str, Any]:
    """Whether the server is up, and its galleries."""
    return {"status": "ok", "galleries": state.galleries.summaries()}


@galleries_router.get(
    "/galleries", response_model=Galleries, responses={s: ERRORS[s] for s in (401, 503)}
)
def galleries(state: State) -> dict[str, Any]:
    """The served galleries: items, dim, model, index type, key column, each column's type."""
    return {"galleries": state.galleries.summaries()}
