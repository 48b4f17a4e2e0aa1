"""What the decode box asks of whoever charges its clients for their decodes (a server:
nearsight/app/serve/decode_shares.py). The box knows workers and limits, not clients: before
an image it asks for a :class:`DecodeTicket` (or is refused with :class:`DecodeRefused`), and
after it says what the image cost and whether it failed. Without a charger (the CLI, the
Python API) every caller is served alike."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from nearsight.core.errors import NearsightError


@dataclass
class DecodeTicket:
    """One admitted decode: whose it is, and whether it runs on the share of the clients with
    recent failures (then it waits behind every caller without, for a worker)."""

    identity: str
    restricted: bool = False


class DecodeRefused(NearsightError):
    """Not decoded now: the client's recent images hit the decoder's limits, and it waits
    ``retry_after_s`` seconds (the REST API answers 429 with Retry-After)."""

    def __init__(self, message: str, retry_after_s: int):
        super().__init__(message)
        self.retry_after_s = max(1, int(retry_after_s))


class DecodeCharging(Protocol):
    def admit(self, workers: int) -> DecodeTicket:
        """A ticket for the calling client's next decode in a box of ``workers``, or
        :class:`DecodeRefused`."""
        ...

    def settle(self, ticket: DecodeTicket, seconds: float, failed: bool) -> None:
        """The decode of ``ticket`` is over: it held a worker ``seconds``, and ``failed``
        when the image hit a limit (time, memory) or was refused by the decoder."""
        ...
