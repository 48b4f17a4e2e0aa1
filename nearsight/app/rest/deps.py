"""What every REST route shares (FastAPI's ``deps`` pattern): the server's state on
``app.state.rest``, the one error type, the gallery a request names, and the key check."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import Request, Security
from fastapi.security import APIKeyHeader, HTTPBearer

from nearsight.app.serve.auth import API_KEY_HEADER, ApiKeys, presented_key
from nearsight.app.serve.batcher import EmbedBatcher
from nearsight.app.serve.galleries import Galleries, UnknownGallery
from nearsight.app.serve.gates import WorkGate
from nearsight.search.served import ServedGallery

MAX_ECHO_CHARS = 200  # an error message quoting a request's input is cut to this
RETRY_AFTER_S = 1


class ApiError(Exception):
    """A request refused with ``status`` and a one-line ``message`` (``{"error": ...}``)."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass
class RestState:
    """The REST API's state: the galleries' owner (a live reload may swap one: each request
    looks its gallery up once), one batcher per model, the work gates and the limits."""

    galleries: Galleries
    batchers: dict[int, EmbedBatcher]
    decoding: WorkGate  # uploads decoded at once
    heavy: WorkGate  # filtered or re-ranked searches at once
    plain: WorkGate  # plain searches by item or vector at once
    keys: ApiKeys | None
    max_upload_bytes: int

    @property
    def views(self) -> Mapping[str, ServedGallery]:
        return self.galleries.views

    @property
    def max_filter_conditions(self) -> int | None:
        return self.galleries.max_filter_conditions

    def view(self, name: str | None) -> ServedGallery:
        """The gallery ``name`` (default: the first), or a 404 naming the ones there are."""
        try:
            return self.galleries.get(name)
        except UnknownGallery as error:
            raise ApiError(404, str(error)) from None


# The dependencies are coroutines: FastAPI runs a plain ``def`` dependency in its thread pool,
# two thread hops a request for an attribute read and a header check.
async def rest_state(request: Request) -> RestState:
    return request.app.state.rest


# only for the OpenAPI schema: require_key reads the key as the guard does
_KEY_HEADER = APIKeyHeader(name=API_KEY_HEADER, auto_error=False, scheme_name="APIKey")
_BEARER = HTTPBearer(auto_error=False, scheme_name="Bearer")


async def require_key(
    request: Request,
    _header: Annotated[str | None, Security(_KEY_HEADER)] = None,
    _bearer: Annotated[Any, Security(_BEARER)] = None,
) -> None:
    """The key checked as the guard checks it (nearsight/app/serve/auth.py), and declared in the
    OpenAPI schema (X-API-Key, or a bearer token); routers take it only when there is a key."""
    keys = request.app.state.rest.keys
    if keys and keys.match(presented_key(request.scope["headers"])) is None:
        raise ApiError(401, f"missing or wrong API key (send it in the {API_KEY_HEADER} header)")


def echo(text: str) -> str:
    """Request input quoted in a message: at most :data:`MAX_ECHO_CHARS` characters."""
    return text if len(text) <= MAX_ECHO_CHARS else text[:MAX_ECHO_CHARS] + "..."


def one_line(text: str) -> str:
    return echo(" ".join(text.split()))
