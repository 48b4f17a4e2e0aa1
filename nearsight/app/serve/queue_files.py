"""Files in the page's queue payloads, held to the upload route's rules.

An event's data can carry a file three ways: a path Gradio's upload route gave the client
(Gradio checks that it is in its upload folder), a ``data:`` URL holding the file's bytes, or
an http(s) URL as its path, for the server to fetch. A ``data:`` URL was bounded only by the
body limit and was then kept whole in the session's state (Gradio stores each input's value,
for up to ``STATE_SESSIONS`` sessions: ~10 MB each, outside the upload budget); a URL made the
server download whatever it named. so that,
before an event is queued (:class:`QueueJoinFiles`, in front of Gradio's join route):

- a ``data:`` URL's bytes are held to an upload's rules (within the upload limit, beginning as
  an image, within the client's share and the whole of the disk budget:
  nearsight/app/serve/uploads.py), written to the upload folder and charged to the client as
  an upload is; the event carries the file's path instead, so the session keeps a path;
- an http(s) URL as a file's path is refused: the server fetches nothing a request names.

Either way the image is decoded later in the decode box, as an upload is.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
from typing import Any

from nearsight.app.serve.uploads import UploadBudget, UploadRefused, is_image_start

JOIN_PATH = "/gradio_api/queue/join"
MAX_EVENT_VALUES = 10_000  # keys and list items of one event's JSON, roughly
PASTED_NAME = "pasted.png"  # the name a pasted image's file gets (its bytes say its format)


class QueueFileRefused(Exception):
    """A file in an event's data that the server does not take (one line)."""


def files_in(data: Any) -> list[dict[str, Any]]:
    """The dicts in ``data`` (an event's inputs, JSON) that name a file by a path or a URL."""
    found, stack = [], [data]
    while stack:  # iterative: the JSON's depth is the client's choice
        value = stack.pop()
        if isinstance(value, dict):
            if isinstance(value.get("url"), str) or isinstance(value.get("path"), str):
                found.append(value)
            stack.extend(value.values())
        elif isinstance(value, list):
            stack.extend(value)
    return found


def pasted_bytes(url: str, max_bytes: int) -> bytes:
    """The bytes of a ``data:`` URL within ``max_bytes`` that begin as an image, or
    :class:`QueueFileRefused`."""
    encoded = url.partition(",")[2]
    if len(encoded) > (max_bytes + 2) // 3 * 4 + 4:
        raise QueueFileRefused(f"the pasted image is larger than the server's limit "
                               f"({max_bytes / 1024 / 1024:g} MB)")  # fmt: skip
    try:
        data = base64.b64decode(encoded, validate=True)
    except (ValueError, binascii.Error):
        raise QueueFileRefused("cannot read the pasted image: not base64 data") from None
    if len(data) > max_bytes:
        raise QueueFileRefused(f"the pasted image is larger than the server's limit "
                               f"({max_bytes / 1024 / 1024:g} MB)")  # fmt: skip
    if not is_image_start(data):
        raise QueueFileRefused("cannot read the pasted image: not an image (JPEG, PNG, GIF, "
                               "WebP, BMP, TIFF, PNM, AVIF or HEIF)")  # fmt: skip
    return data


async def store_pasted(data: bytes, client: str, budget: UploadBudget) -> str:
    """Write a pasted image to the upload folder within ``client``'s budget; its path."""
    from gradio.processing_utils import save_bytes_to_cache

    assert budget.upload_dir is not None
    try:
        budget.reserve(client, len(data))
    except UploadRefused as refused:
        raise QueueFileRefused(refused.message) from None
    try:  # Gradio's own naming: its copy to the block's cache finds the file there already
        path = await asyncio.to_thread(save_bytes_to_cache, data, PASTED_NAME,
                                       str(budget.upload_dir))  # fmt: skip
    finally:
        budget.release(client, len(data))
    budget.keep(client, [path])
    return path


async def hold_files(data: Any, client: str, budget: UploadBudget) -> None:
    """Hold the files of one event's ``data`` to the rules (module docstring), in place."""
    for file in files_in(data):
        path, url = file.get("path"), file.get("url")
        if isinstance(path, str) and path.lower().startswith(("http:", "https:", "//")):
            raise QueueFileRefused("a file is sent through the upload route, not as a URL")
        if isinstance(url, str) and url[:5].lower() == "data:":
            pasted = pasted_bytes(url, budget.max_file_bytes)
            file["path"] = await store_pasted(pasted, client, budget)
            file["url"], file["size"], file["orig_name"] = None, len(pasted), PASTED_NAME
            file["meta"] = {"_type": "gradio.FileData"}
        elif not (isinstance(path, str) and budget.in_upload_folder(path)):
            # only what was uploaded to this server: never a file named by the client (a
            # Gradio app mounted into another checks none while it thinks itself unlaunched)
            raise QueueFileRefused("a file is sent through the upload route first")


class QueueJoinFiles:
    """ASGI middleware in front of Gradio's app: the body of ``POST /gradio_api/queue/join``
    (an event's data) is read (the guard has bounded its size and time already), refused
    (413) when it holds more than :data:`MAX_EVENT_VALUES` values, parsed in a worker thread,
    its files held to the rules (the module docstring) and handed on rewritten; a refused file
    is answered 400 with one line, as Gradio answers a bad event."""

    def __init__(self, app: Any, budget: UploadBudget) -> None:
        self.app = app
        self.budget = budget

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if (scope["type"] != "http" or scope.get("method") != "POST"
                or not scope.get("path", "").endswith(JOIN_PATH)
                or self.budget.upload_dir is None):  # fmt: skip
            await self.app(scope, receive, send)
            return
        chunks = []
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client left
            chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        body = b"".join(chunks)
        # values cost far more to parse than their bytes (on Gradio's side, on the event
        # loop): an event holds a handful, a pasted image one long string
        if body.count(b":") + body.count(b",") > MAX_EVENT_VALUES:
            await _answer(send, 413, {"detail": "the event holds too many values"})
            return
        try:
            event = await asyncio.to_thread(json.loads, body) if body else None
        except (ValueError, RecursionError):
            event = None  # Gradio answers it as it does any malformed event
        if isinstance(event, dict) and files_in(event.get("data")):
            try:
                await hold_files(event.get("data"), host_of(scope), self.budget)
            except QueueFileRefused as refused:
                await _answer(send, 400, {"detail": str(refused)})
                return
            body = (await asyncio.to_thread(json.dumps, event)).encode()
            scope = {**scope, "headers": [
                (name, str(len(body)).encode() if name == b"content-length" else value)
                for name, value in scope.get("headers", ())
            ]}  # fmt: skip
        given = {"sent": False}

        async def replay() -> dict:
            if not given["sent"]:
                given["sent"] = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


def host_of(scope: dict) -> str:
    return (scope.get("client") or ("", 0))[0] or ""


async def _answer(send: Any, status: int, payload: dict) -> None:
    body = json.dumps(payload).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
