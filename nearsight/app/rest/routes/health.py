"""``GET /api/health``: whether the server is up, and its galleries (no key needed)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends

from nearsight.app.rest.deps import RestState, rest_state

router = APIRouter(tags=["health"])


@router.get("/health")
def health(state: Annotated[RestState, Depends(rest_state)]) -> dict[str, Any]:
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
            for view in list(state.views.values())
        ],
    }
