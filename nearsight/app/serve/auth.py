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
import os
import secrets
import time
from collections.abc import Collection, Iterable
from pathlib import Path

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
            f'needs at least {MIN_KEY_CHARS} (e.g. `python -c "import secrets; '
            'print(secrets.token_urlsafe(24))"`)'
        )


DEFAULT_KEY_NAME = "key"  # the name of a lone --api-key in the log and the fair shares
READ, WRITE = "read", "write"  # what a key may do (a keys file's third word)


class ApiKeys:
    """The server's keys, each with a name (a colleague, a service): the name of the key a
    request presents is who it is, in the access log and the fair shares. One ``--api-key``
    is the key named :data:`DEFAULT_KEY_NAME`; ``--keys-file`` holds ``NAME KEY [ACCESS]``
    lines. A key may write (:data:`WRITE`, the default: a file of ``NAME KEY`` lines means
    what it did before keys could be read-only) or only read (:data:`READ`): the REST writes
    (``serve --allow-writes``) refuse a read-only key with 403."""

    def __init__(self, keys: dict[str, str], read_only: Collection[str] = ()):
        self.keys = dict(keys)
        self.read_only = frozenset(read_only) & set(self.keys)
        # the sessions' secret: a change of any key, or of what it may do, ends every
        # browser's session
        self.secret = "\n".join(f"{n} {k} {self.access(n)}" for n, k in sorted(self.keys.items()))

    def __bool__(self) -> bool:
        return bool(self.keys)

    def __len__(self) -> int:
        return len(self.keys)

    @property
    def named(self) -> bool:
        """Whether the keys were named (a keys file), so a key's name is its holder."""
        return list(self.keys) != [DEFAULT_KEY_NAME]

    def access(self, name: str) -> str:
        """:data:`READ` or :data:`WRITE`: what the key ``name`` may do."""
        return READ if name in self.read_only else WRITE

    def may_write(self, name: str | None) -> bool:
        """Whether ``name`` is a key of this server that may write."""
        return name is not None and name in self.keys and name not in self.read_only

    def match(self, given: str) -> str | None:
        """The name of the key ``given`` is, or None; every key is compared (constant time)."""
        found = None
        for name, key in self.keys.items():
            if key_matches(given, key):
                found = name
        return found

    @classmethod
    def of(cls, key: str | None, keys_file: str | os.PathLike[str] | None = None,
           host: str = "127.0.0.1") -> ApiKeys | None:  # fmt: skip
        """``key`` (as :data:`DEFAULT_KEY_NAME`, a key that may write) and the keys of
        ``keys_file``; None when there are none. Beyond loopback each must be long enough
        (:func:`check_key`)."""
        keys = {} if key is None else {DEFAULT_KEY_NAME: key}
        read_only: set[str] = set()
        if keys_file is not None:
            listed, read_only = parse_keys_file(Path(keys_file))
            for name, value in listed.items():
                if name in keys:
                    raise NearsightError(f"--keys-file {keys_file}: the name {name!r} is taken "
                                         "by --api-key")  # fmt: skip
                keys[name] = value
        for value in keys.values():
            check_key(value, host)
        return cls(keys, read_only) if keys else None


def read_keys_file(path: Path) -> dict[str, str]:
    """name -> key of a keys file (:func:`parse_keys_file`)."""
    return parse_keys_file(path)[0]


def parse_keys_file(path: Path) -> tuple[dict[str, str], set[str]]:
    """``NAME KEY [read|write]`` lines (blank lines and ``#`` comments skipped; without the
    third word a key may write): name -> key, and the names of the read-only keys. One-line
    NearsightError for a line that is not two or three such words, a name or a key given
    twice."""
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as error:
        reason = getattr(error, "strerror", None) or "not text"
        raise NearsightError(f"cannot read --keys-file {path}: {reason}") from None
    keys: dict[str, str] = {}
    read_only: set[str] = set()
    for number, line in enumerate(text.splitlines(), 1):
        words = line.split("#", 1)[0].split()
        if not words:
            continue
        if len(words) not in (2, 3):
            raise NearsightError(f"--keys-file {path}:{number}: a line is NAME KEY [read|write], "
                                 f"got {len(words)} word(s)")  # fmt: skip
        name, key = words[:2]
        access = words[2].lower() if len(words) == 3 else WRITE
        if access not in (READ, WRITE):
            raise NearsightError(f"--keys-file {path}:{number}: the third word is read or "
                                 f"write (what the key may do), got {words[2][:40]!r}")  # fmt: skip
        if name in keys:
            raise NearsightError(f"--keys-file {path}:{number}: the name {name!r} is given twice")
        if key in keys.values():
            raise NearsightError(f"--keys-file {path}:{number}: a key is given twice")
        keys[name] = key
        if access == READ:
            read_only.add(name)
    if not keys:
        raise NearsightError(f"--keys-file {path} holds no key")
    return keys, read_only


class Sessions:
    """Browser sessions: a cookie ``EXPIRY.NAME.NONCE.MAC`` where MAC is an HMAC of the
    expiry, the name of the key signed in with and the nonce under the keys (``key``: one
    key, or :attr:`ApiKeys.secret`). Nothing is stored: a cookie is good until its expiry,
    and none survives a change of a key."""

    def __init__(self, key: str, lifetime_s: float = SESSION_S, *, secure: bool = False):
        self._key = key.encode()
        self.lifetime_s = lifetime_s
        self.secure = secure  # Secure on every cookie (a TLS proxy in front); else by scheme

    def _mac(self, body: str) -> str:
        return hmac.new(self._key, f"nearsight-session|{body}".encode(), hashlib.sha256).hexdigest()

    def issue(self, now: float | None = None, name: str = DEFAULT_KEY_NAME) -> str:
        """A cookie for the holder of the key ``name`` (names are single words)."""
        expiry = int((time.time() if now is None else now) + self.lifetime_s)
        body = f"{expiry}.{name.replace('.', '_')}.{secrets.token_urlsafe(12)}"
        return f"{body}.{self._mac(body)}"

    def holder(self, token: str, now: float | None = None) -> str | None:
        """The name of the key a valid, unexpired cookie was issued for; None otherwise."""
        body, _, mac = token.rpartition(".")
        parts = body.split(".")
        if not (mac and len(parts) == 3 and parts[0].isdigit()):
            return None
        if not hmac.compare_digest(mac.encode(), self._mac(body).encode()):
            return None
        return parts[1] if int(parts[0]) > (time.time() if now is None else now) else None

    def valid(self, token: str, now: float | None = None) -> bool:
        return self.holder(token, now) is not None

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
