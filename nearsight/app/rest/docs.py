"""``/api/docs``: Swagger UI over the API's OpenAPI schema, served from the files of the
``swagger-ui-bundle-v2`` package (a declared dependency), so the docs work offline and the page
asks no other host for anything (FastAPI's default loads them from a CDN)."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles
from swagger_ui_bundle import swagger_ui_path

ASSETS = "/docs-assets"


def add_docs(app: FastAPI) -> None:
    """``/docs`` (the page) and ``/docs-assets/`` (Swagger UI's JS, CSS and icon)."""
    app.mount(ASSETS, StaticFiles(directory=swagger_ui_path), name="docs-assets")

    @app.get("/docs", include_in_schema=False)
    def docs(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "").rstrip("/")  # "/api" where it is mounted
        return get_swagger_ui_html(
            openapi_url=f"{root}{app.openapi_url}",
            title="nearsight API",
            swagger_js_url=f"{root}{ASSETS}/swagger-ui-bundle.js",
            swagger_css_url=f"{root}{ASSETS}/swagger-ui.css",
            swagger_favicon_url=f"{root}{ASSETS}/favicon-32x32.png",
        )
