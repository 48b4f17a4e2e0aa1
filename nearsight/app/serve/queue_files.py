"""Files in the page's queue payloads, held to the upload route's rules.

An event's data can carry a file three ways: a path Gradio's upload route gave the client
(Gradio checks that it is in its upload folder), a ``data:`` URL holding the file's bytes, or
an http(s) URL as its path, for the server to fetch. A ``data:`` URL was bounded only by the
body limit and was then kept whole in the session's state (Gradio stores each input's value,
for up to ``STATE_SESSIONS`` sessions: ~10 MB each, outside the upload budget); a URL made the
server download whatever it named. :func:`hold_queue_files` wraps the queue's ``push`` so that,
before an event is queued:

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
from typing import Any

from nearsight.app.serve.fair_queue import host_of
from nearsight.app.serve.uploads import UploadBudget, UploadRefused, is_image_start

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


def hold_queue_files(queue: Any, budget: UploadBudget) -> None:
    """Wrap ``queue.push`` (a gradio.queueing.Queue) as the module docstring says."""
    if getattr(queue, "_nearsight_files", False):
        return
    original = queue.push

    async def push(body: Any, request: Any, username: str | None) -> tuple[bool, Any, str]:
        if budget.upload_dir is not None:
            try:
                await hold_files(getattr(body, "data", None), host_of(request), budget)
            except QueueFileRefused as refused:
                return False, str(refused), "error"
        return await original(body, request, username)

    queue.push = push
    queue._nearsight_files = True
