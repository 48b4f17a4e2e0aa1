"""The REST app's upload limit, checked on the request's Content-Length before anything is read.

A plain ASGI middleware, not ``@app.middleware("http")``: Starlette's BaseHTTPMiddleware runs
every request through a task group and memory streams, a cost each search paid for one header
check."""

from __future__ import annotations

from starlette.datastructures import Headers
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send


class UploadLimit:
    """Answer 413 (``{"error": ...}``) to an HTTP request whose Content-Length is over
    ``limit_bytes``; pass every other request (and every non-HTTP scope) on untouched."""

    def __init__(self, app: ASGIApp, *, limit_bytes: int, max_upload_bytes: int) -> None:
        self.app = app
        self.limit_bytes = limit_bytes
        self.max_upload_bytes = max_upload_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            length = Headers(scope=scope).get("content-length")
            if length is not None and length.isdigit() and int(length) > self.limit_bytes:
                limit = self.max_upload_bytes / 1024 / 1024
                response = JSONResponse(
                    {"error": f"the upload is larger than the server's limit ({limit:g} MB)"},
                    status_code=413,
                )
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)
