"""Hand ``/api`` requests to the REST app right behind the guard, past Gradio's middleware.

The REST app is also a route of Gradio's app (a :class:`~starlette.routing.Mount`); reached
that way, each search went through Gradio's CORS and Brotli layers and its exception
middleware before the router found the mount. The guard has already checked the Host, the
Origin, the key and the body budget by then; the REST app has its own error handlers. So a
request the mount matches is handed to it here, with the scope the router would have given it.
"""

from __future__ import annotations

from starlette.routing import Match, Mount
from starlette.types import ASGIApp, Receive, Scope, Send


class ApiFirst:
    """Sends what ``mount`` matches (HTTP only) straight to it; everything else to ``app``."""

    def __init__(self, app: ASGIApp, mount: Mount) -> None:
        self.app = app
        self.mount = mount

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            match, child = self.mount.matches(scope)
            if match is Match.FULL:
                scope.update(child)
                await self.mount.handle(scope, receive, send)
                return
        await self.app(scope, receive, send)
