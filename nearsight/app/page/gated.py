"""The page's searches admitted as the REST API's are: through fair work gates
(nearsight/app/serve/gates.py), not Gradio's first come, first served queue.

Gradio runs the events of one concurrency group in arrival order, up to ``--max-queue`` waiting
in all: one client's flood filled it, and everyone else waited behind it or was told the queue
was full. Each search event of the page is registered here as an async handler with no limit
of Gradio's own; its work waits in a :class:`~nearsight.app.serve.gates.WorkGate` instead,
where each client (the guard's identity, on Gradio's ``gr.Request``) has its own queue, a free
slot goes to the client served longest ago, and a client past its share of waiting places is
told so in one line (as a gr.Error) at once. Waiting holds no thread.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

import gradio as gr

from nearsight.app.serve.clients import IDENTITY_HEADER
from nearsight.app.serve.gates import GateFull, WorkGate

REQUEST_PARAMETER = "nearsight_request"


class PageGates:
    """The page's two pools: uploads embedded (``embed``) and searches of gallery items
    (``search``), each ``concurrency`` at once and ``max_queue`` waiting."""

    def __init__(self, concurrency: int, max_queue: int) -> None:
        self.embed = WorkGate(concurrency, max_queue, "image searches")
        self.search = WorkGate(concurrency, max_queue, "searches")
        # Gradio's own limit for a gated event: none (the gate limits, fairly)
        self.limits: dict[str, Any] = {"concurrency_limit": None}

    @staticmethod
    def through(gate: WorkGate, handler: Callable[..., Any]) -> Callable[..., Any]:
        """``handler`` as an async handler whose work waits its client's turn at ``gate``.
        Gradio sees ``handler``'s own parameters (its special ones, such as gr.EventData, still
        filled in) after one more, the request, which it fills in first."""
        signature = inspect.signature(handler)
        request = inspect.Parameter(REQUEST_PARAMETER, inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                    annotation=gr.Request)  # fmt: skip
        parameters = [request, *signature.parameters.values()]

        async def gated(*args: Any) -> Any:
            asked, *given = args
            client = _identity(asked)
            try:
                return await gate.run(lambda: handler(*given), client)
            except GateFull as full:
                raise gr.Error(str(full)) from None

        wrapper = functools.update_wrapper(gated, handler)
        del wrapper.__wrapped__  # Gradio reads the signature below, not the handler's
        # inspect.signature reads __signature__ (PEP 362), an attribute typeshed's functions lack
        wrapper.__signature__ = signature.replace(parameters=parameters)  # type: ignore[attr-defined]
        hints = dict(getattr(handler, "__annotations__", {}))
        wrapper.__annotations__ = {REQUEST_PARAMETER: gr.Request, **_resolved(handler, hints)}
        return wrapper


def _identity(request: Any) -> str:
    """Who a page event is for the gates: the guard's identity header (a named key's holder,
    else the client's network), else the client's address."""
    headers = getattr(request, "headers", None)
    named = headers.get(IDENTITY_HEADER.decode()) if headers is not None else None
    return named or getattr(getattr(request, "client", None), "host", None) or ""


def _resolved(handler: Callable[..., Any], hints: dict[str, Any]) -> dict[str, Any]:
    """The handler's annotations as objects (its module may postpone them as strings)."""
    import typing

    try:
        return typing.get_type_hints(handler)
    except (NameError, TypeError):
        return hints
