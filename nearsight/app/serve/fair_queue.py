"""The page's queue (Gradio's) shared fairly between clients, as the REST API's work gates are
(nearsight/app/rest/gates.py).

Gradio runs a concurrency group's events first come, first served, up to ``--max-queue`` in
all: one client's flood filled it, and everyone else waited behind it or was told the queue
was full. :func:`share_fairly` wraps one queue's ``push`` so that:

- one client (the guard's identity, nearsight/app/serve/clients.py) has at most ``per_client``
  events waiting; past that its next one is refused as Gradio refuses a full queue;
- a new event is placed in turn: after every waiting client's events of the same round (its
  own n-th waiting event after the others' n-th), so a flood waits behind its own events.

Gradio takes each group's events from the front of its list; the wrapper only reorders that
list, between two awaits of the event loop that owns it.
"""

from __future__ import annotations

import collections
from collections.abc import Sequence
from typing import Any


def host_of(request: Any) -> str:
    client = getattr(request, "client", None)
    return getattr(client, "host", None) or ""


def client_of(event: Any) -> str:
    return host_of(getattr(event, "request", None))


def fair_position(waiting: Sequence[Any], client: str) -> int:
    """Where a new event of ``client`` goes in ``waiting`` (events in the order they will run):
    before the first event of a later round than its own."""
    rounds: collections.Counter[str] = collections.Counter()
    own = sum(client_of(event) == client for event in waiting)
    for position, event in enumerate(waiting):
        other = client_of(event)
        if rounds[other] > own:
            return position
        rounds[other] += 1
    return len(waiting)


def share_fairly(queue: Any, per_client: int) -> None:
    """Wrap ``queue.push`` (a gradio.queueing.Queue) as the module docstring says."""
    if getattr(queue, "_nearsight_fair", False):
        return
    original = queue.push

    async def push(body: Any, request: Any, username: str | None) -> tuple[bool, Any, str]:
        client = host_of(request)
        queues = queue.event_queue_per_concurrency_id.values()
        mine = sum(client_of(e) == client for q in queues for e in q.queue)
        if mine >= per_client:
            return (False, f"{mine} of your searches are waiting already (at most {per_client} "
                    "per client): retry when they are answered", "queue_full")  # fmt: skip
        success, event_id, state = await original(body, request, username)
        if success and state == "success":
            _place(queue, event_id, client)
        return success, event_id, state

    queue.push = push
    queue._nearsight_fair = True


def _place(queue: Any, event_id: str, client: str) -> None:
    for event_queue in queue.event_queue_per_concurrency_id.values():
        waiting = event_queue.queue
        for index in range(len(waiting) - 1, -1, -1):  # it was appended: look from the end
            if getattr(waiting[index], "_id", None) == event_id:
                event = waiting.pop(index)
                waiting.insert(fair_position(waiting, client), event)
                return
