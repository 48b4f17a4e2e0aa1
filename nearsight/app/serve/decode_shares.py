"""The decode box charges time: each client (its identity: a named key's holder, else its
network, nearsight/app/serve/clients.py) pays for the decodes its images made fail.

Without a charge, two clients looping an image that runs into the time limit kept both
workers busy for the whole limit, and every other upload waited behind them. So:

- a failed decode (past the time limit, over the memory limit, crashed, or refused by the
  decoder) costs its client the seconds it held a worker, and what a client owes is paid
  back as time passes. A client that owes more than :attr:`DecodeShares.allowance_s` (1 s,
  or half the time limit if less: a corrupt file or two cost milliseconds, and owe nothing
  that counts) is refused at once, with 429 and Retry-After, until it owes no more;
- a client that owed more than the allowance in the last :attr:`DecodeShares.recent_s`
  seconds is decoded on a share of ``workers - 1`` workers, shared with every other such
  client (past it, 429 at once), and waits behind every other client for a worker; so one
  worker is always left to clients whose images decode, and an upload of theirs waits for
  at most one attacker's decode.

The box (nearsight/data/decode_box.py) asks :meth:`admit` before each image and says what it
cost in :meth:`settle`; the identity is the calling thread's :data:`CURRENT_CLIENT`."""

from __future__ import annotations

import collections
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from nearsight.app.serve.clients import CURRENT_CLIENT
from nearsight.data.decode_charges import DecodeRefused, DecodeTicket

CLIENTS_REMEMBERED = 10_000  # accounts kept (the least recently charged are forgotten first)
RECENT_TIMEOUTS = 10  # a failure is recent for this many decode time limits...
MIN_RECENT_S = 60.0  # ...and at least this long
ALLOWANCE_S = 1.0  # seconds of failed decoding a client may owe and still be served


@dataclass
class _Account:
    paid_at: float = 0.0  # when what its failures cost is paid back (owed: paid_at - now)
    last_over: float = -math.inf  # when it last owed more than the allowance
    failures: int = 0


@dataclass
class DecodeRecord:
    """What the charges did, for operators and tests."""

    failures: collections.Counter[str] = field(default_factory=collections.Counter)
    refused: collections.Counter[str] = field(default_factory=collections.Counter)
    charged_s: dict[str, float] = field(default_factory=dict)
    decodes: collections.Counter[str] = field(default_factory=collections.Counter)
    # per identity without recent failures: the most decodes of clients with recent failures
    # in flight when one of its decodes was admitted (at most workers - 1)
    behind: dict[str, int] = field(default_factory=dict)
    restricted_peak: int = 0  # the most decodes on the restricted share at once

    def forget_past(self, clients: int) -> None:
        """Bounded memory: past ``clients`` identities, the counts start over."""
        for counts in (self.failures, self.refused, self.charged_s, self.decodes, self.behind):
            if len(counts) > clients:
                counts.clear()


class DecodeShares:
    """Admits and charges decodes by identity (see the module docstring); ``timeout_s``: the
    box's time limit an image (a failure stays recent for :data:`RECENT_TIMEOUTS` of them,
    and half of it is the allowance where that is under :data:`ALLOWANCE_S`)."""

    def __init__(
        self,
        timeout_s: float,
        *,
        recent_s: float | None = None,
        identity: Callable[[], str] = CURRENT_CLIENT.get,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.timeout_s = timeout_s
        self.recent_s = recent_s if recent_s is not None else max(MIN_RECENT_S,
                                                                   RECENT_TIMEOUTS * timeout_s)  # fmt: skip
        self.allowance_s = min(ALLOWANCE_S, timeout_s / 2)
        self._identity, self._clock = identity, clock
        self._lock = threading.Lock()
        self._accounts: collections.OrderedDict[str, _Account] = collections.OrderedDict()
        self._restricted: dict[int, float] = {}  # id(ticket) -> when its decode was admitted
        self.record = DecodeRecord()

    def admit(self, workers: int) -> DecodeTicket:
        identity = self._identity()
        now = self._clock()
        with self._lock:
            account = self._accounts.get(identity)
            wait = 0.0 if account is None else account.paid_at - now - self.allowance_s
            if account is not None and wait > 0:
                self.record.refused[identity] += 1
                raise DecodeRefused(
                    f"your recent images hit the decoder's limits ({account.failures} failed): "
                    f"wait {math.ceil(wait)} s before the next upload",
                    math.ceil(wait),
                )
            restricted = account is not None and now - account.last_over < self.recent_s
            ticket = DecodeTicket(identity, restricted)
            if restricted:
                share = max(1, workers - 1)
                if len(self._restricted) >= share:
                    self.record.refused[identity] += 1
                    ends = min(self._restricted.values()) + self.timeout_s
                    raise DecodeRefused(
                        "your recent images hit the decoder's limits, and the workers left to "
                        "such clients are busy: retry in a moment",
                        math.ceil(max(1.0, ends - now)),
                    )
                self._restricted[id(ticket)] = now
                self.record.restricted_peak = max(self.record.restricted_peak,
                                                  len(self._restricted))  # fmt: skip
            else:
                behind = self.record.behind
                behind[identity] = max(behind.get(identity, 0), len(self._restricted))
            self.record.decodes[identity] += 1
            self.record.forget_past(CLIENTS_REMEMBERED)
        return ticket

    def settle(self, ticket: DecodeTicket, seconds: float, failed: bool) -> None:
        now = self._clock()
        with self._lock:
            self._restricted.pop(id(ticket), None)
            if not failed:
                return
            account = self._accounts.pop(ticket.identity, None) or _Account()
            self._accounts[ticket.identity] = account  # the most recently charged last
            while len(self._accounts) > CLIENTS_REMEMBERED:
                self._accounts.popitem(last=False)
            account.paid_at = max(now, account.paid_at) + seconds
            if account.paid_at - now > self.allowance_s:
                account.last_over = now
            account.failures += 1
            self.record.failures[ticket.identity] += 1
            charged = self.record.charged_s
            charged[ticket.identity] = charged.get(ticket.identity, 0.0) + seconds

    def owed(self, identity: str) -> float:
        """Seconds of failed decoding ``identity`` owes now (0: none)."""
        with self._lock:
            account = self._accounts.get(identity)
        return 0.0 if account is None else max(0.0, account.paid_at - self._clock())
