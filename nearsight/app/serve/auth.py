"""The API key, in one place: how a request presents it, how it is compared, how strong it
must be, the browser's session cookie derived from it, and how wrong guesses are slowed.

The guard (nearsight/app/serve/guard.py) checks every request with :func:`presented_key` and
:func:`key_matches`; the REST API's dependency (nearsight/app/rest/) uses the same two.
"""

from __future__ import annotations

import collections
import hashlib
import hmac
import html
import secrets
import time
from collections.abc import Iterable

from nearsight.app.serve.hosts import is_loopback
from nearsight.core.errors import NearsightError

API_KEY_HEADER = "X-API-Key"
API_KEY_ENV = "NEARSIGHT_API_KEY"
MIN_KEY_CHARS = 16  # for a server that listens beyond this machine
SESSION_COOKIE = "nearsight_session"
LOGIN_PATH = "/login"
SESSION_S = 12 * 3600  # a browser signs in again after this
FREE_FAILURES = 5  # wrong keys a client may send within the window before it is slowed
LOCK_FAILURES = 20  # past this many within the window, the client gets 429
FAILURE_WINDOW_S = 60.0
MAX_DELAY_S = 2.0  # the longest a wrong key's answer is held back
MAX_CLIENTS_TRACKED = 10_000


def presented_key(headers: Iterable[tuple[bytes, bytes]]) -> str:
    """The key a request presents: ``X-API-Key``, else ``Authorization: Bearer``; "" if none."""
    bearer = ""
    for name, value in headers:
        if name == b"x-api-key":
            return value.decode("latin-1").strip()
        if name == b"authorization":
            text = value.decode("latin-1")
            if text[:7].lower() == "bearer ":
                bearer = text[7:].strip()
    return bearer


def key_matches(given: str, key: str) -> bool:
    """Constant-time comparison (of digests, so that not even the key's length leaks)."""
    if not given or not key:
        return False
    digest = hashlib.sha256
    return hmac.compare_digest(digest(given.encode()).digest(), digest(key.encode()).digest())


def check_key(key: str | None, host: str) -> None:
    """NearsightError unless ``key`` is fit for a server listening on ``host``: beyond this
    machine one is required, of at least :data:`MIN_KEY_CHARS` characters."""
    if is_loopback(host):
        return
    if key is None:
        raise NearsightError(
            f"serving on {host} (beyond this machine) needs an API key: pass --api-key-file "
            f"FILE or set {API_KEY_ENV}"
        )
    if len(key) < MIN_KEY_CHARS:
        raise NearsightError(
            f"the API key has {len(key)} characters; serving on {host} (beyond this machine) "
            f"needs at least {MIN_KEY_CHARS} (e.g. `python -c \"import secrets; "
            'print(secrets.token_urlsafe(24))"`)'
        )


class Sessions:
    """Browser sessions: a cookie ``EXPIRY.NONCE.MAC`` where MAC is an HMAC of the expiry and
    nonce under the key. Nothing is stored: a cookie is good until its expiry, and none
    survives a change of the key."""

    def __init__(self, key: str, lifetime_s: float = SESSION_S, *, secure: bool = False):
        self._key = key.encode()
        self.lifetime_s = lifetime_s
        self.secure = secure  # Secure on every cookie (a TLS proxy in front); else by scheme

    def _mac(self, body: str) -> str:
        return hmac.new(self._key, f"nearsight-session|{body}".encode(), hashlib.sha256).hexdigest()

    def issue(self, now: float | None = None) -> str:
        expiry = int((time.time() if now is None else now) + self.lifetime_s)
        body = f"{expiry}.{secrets.token_urlsafe(12)}"
        return f"{body}.{self._mac(body)}"

    def valid(self, token: str, now: float | None = None) -> bool:
        body, _, mac = token.rpartition(".")
        expiry = body.partition(".")[0]
        if not (mac and expiry.isdigit()):
            return False
        if not hmac.compare_digest(mac.encode(), self._mac(body).encode()):
            return False
        return int(expiry) > (time.time() if now is None else now)

    def set_cookie(self, token: str, https: bool) -> str:
        secure = "; Secure" if self.secure or https else ""
        return (
            f"{SESSION_COOKIE}={token}; Path=/; Max-Age={int(self.lifetime_s)}; HttpOnly; "
            f"SameSite=Strict{secure}"
        )


class FailedAttempts:
    """Wrong keys per client address: the first :data:`FREE_FAILURES` within
    :data:`FAILURE_WINDOW_S` are answered at once, the next ones after a delay that doubles
    up to :data:`MAX_DELAY_S`, and from :data:`LOCK_FAILURES` on the client is refused with
    429, whatever key it sends, until its failures are older than the window."""

    def __init__(
        self,
        free: int = FREE_FAILURES,
        lock_after: int = LOCK_FAILURES,
        window_s: float = FAILURE_WINDOW_S,
    ):
        self.free, self.lock_after, self.window_s = free, lock_after, window_s
        self._times: collections.OrderedDict[str, collections.deque[float]] = (
            collections.OrderedDict()
        )

    def _recent(self, client: str, now: float) -> collections.deque[float]:
        times = self._times.get(client)
        if times is None:
            return collections.deque()
        while times and times[0] <= now - self.window_s:
            times.popleft()
        if not times:
            del self._times[client]
        return times

    def locked_for(self, client: str, now: float | None = None) -> float:
        """Seconds until ``client`` may try again (0: it may now)."""
        now = time.monotonic() if now is None else now
        times = self._recent(client, now)
        if len(times) < self.lock_after:
            return 0.0
        return max(0.0, times[-self.lock_after] + self.window_s - now)

    def failed(self, client: str, now: float | None = None) -> float:
        """Record a wrong key from ``client``; returns how long to hold the answer back."""
        now = time.monotonic() if now is None else now
        times = self._recent(client, now)
        times.append(now)
        self._times[client] = times
        self._times.move_to_end(client)
        while len(self._times) > MAX_CLIENTS_TRACKED:
            self._times.popitem(last=False)
        over = len(times) - self.free
        return 0.0 if over <= 0 else min(MAX_DELAY_S, 0.125 * 2 ** (over - 1))

    def count(self, client: str) -> int:
        return len(self._recent(client, time.monotonic()))


def login_page(message: str = "") -> str:
    note = f"<p style='color:#dc2626'>{html.escape(message)}</p>" if message else ""
    return (
        "<!doctype html><html><head><meta charset='utf-8'><title>nearsight: sign in</title>"
        "</head><body style='font-family:sans-serif;max-width:24rem;margin:4rem auto'>"
        "<h2>nearsight</h2><p>This server needs its API key.</p>" + note +
        f"<form method='post' action='{LOGIN_PATH}'><input type='password' name='key' "
        "autofocus style='width:100%'><p><button type='submit'>Sign in</button></p></form>"
        "</body></html>"
    )  # fmt: skip
