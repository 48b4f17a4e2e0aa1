"""Every serving option in one place: :class:`Settings`, its defaults and its help.

``nearsight serve``'s flags are made from these fields (nearsight/app/commands/serve.py), and
so are the ``NEARSIGHT_<NAME>`` environment variables and the keys of an optional TOML file
(``--config FILE``); the server is built from one :class:`Settings` object. Where a value is
given several ways, a flag beats the environment, which beats the file, which beats the
default. docs/serving.md's settings table is checked against this class (a test).

This module imports no Gradio and no Pillow: ``nearsight serve --help`` stays fast.
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nearsight.core.errors import NearsightError

ENV_PREFIX = "NEARSIGHT_"


def option(default: Any, help: str, *, flag: str | None = None, metavar: str | None = None,
           env: bool = True, **extra: Any) -> Any:  # fmt: skip
    """A field of :class:`Settings` with its help (``flag``: the command-line spelling when it
    is not ``--name-with-dashes``; ``env``: whether NEARSIGHT_NAME sets it)."""
    meta = {"help": help, "flag": flag, "metavar": metavar, "env": env, **extra}
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata=meta)
    return field(default=default, metadata=meta)


@dataclass
class Settings:
    """The options of one server (``nearsight serve``'s flags, in the same words)."""

    galleries: list[Path] = option(
        [], "gallery folder (repeat for several; the page offers a choice)",
        flag="--gallery", metavar="DIR", env=False,
    )  # fmt: skip
    model: Path | None = option(
        None, "model that embeds uploads (default: the model each gallery was built with; it "
        "must be the gallery's model)",
    )  # fmt: skip
    host: str = option("127.0.0.1", "address to listen on (0.0.0.0 serves the local network)")
    port: int = option(7860, "port to listen on (0: any free one)")
    device: str = option(
        "auto", "where the model runs: auto, cpu or cuda", choices=("auto", "cpu", "cuda")
    )
    api_key: str | None = option(
        None, "key every route but /api/health requires: X-API-Key or Authorization: Bearer for "
        "API clients, a sign-in form for browsers (default: --api-key-file, else "
        "NEARSIGHT_API_KEY; required, of 16 characters or more, when --host is not a loopback "
        "address). Prefer the file or the variable: a flag shows in `ps`",
    )  # fmt: skip
    api_key_file: Path | None = option(None, "read the API key from this file")
    keys_file: Path | None = option(
        None, "several named API keys, one `NAME KEY [read|write]` line each (# starts a "
        "comment): the access log and the fair shares name the key's owner; a `read` key may "
        "not write over REST (403), a key without the third word may",
    )  # fmt: skip
    max_upload_mb: float = option(10.0, "largest image a user may upload, in MB")
    concurrency: int = option(2, "searches embedded at once, and uploads decoded at once")
    max_queue: int = option(
        64, "requests allowed to wait for a decode, the model or a heavy search (the page's "
        "events too); more get 503 with Retry-After",
    )  # fmt: skip
    analysis_max_items: int = option(
        100_000, "largest gallery (labelled items) whose leave-one-out failure list and "
        "Recall@k the page computes at start: two exact O(N^2) passes",
    )  # fmt: skip
    max_connections: int = option(256, "open connections beyond this get 503")
    max_client_connections: int = option(32, "open connections one client may hold; more get 429")
    header_timeout: float = option(
        10.0, "seconds a request's headers may take to arrive, on every request of a connection"
    )
    body_timeout: float = option(
        30.0, "seconds a whole request body may take to arrive, from its headers to its last "
        "byte; later, 408",
    )  # fmt: skip
    write_timeout: float = option(
        30.0, "seconds an answer may take to drain to the client; a connection whose answer "
        "has not drained by then is closed",
    )  # fmt: skip
    max_pipelined: int = option(
        8, "requests one connection may send ahead of their answers (HTTP pipelining); past "
        "this the connection stops being read until they are answered",
    )  # fmt: skip
    keep_alive: float = option(5.0, "seconds an idle kept-alive connection stays open")
    sign_in_timeout: float = option(
        5.0, "seconds a whole sign-in form (POST /login) may take to arrive"
    )
    max_unauthenticated: int = option(
        64, "connections that may wait without the key at once: sign-in forms being read "
        "(more get 503) and connections sending their headers or idle (past this the one "
        "waiting longest is closed)",
    )  # fmt: skip
    forwarded_allow_ips: str = option(
        "", "comma-separated addresses or networks of trusted proxies ('*': any): a request "
        "from one counts as the client its X-Forwarded-For names, with the scheme of its "
        "X-Forwarded-Proto (default: none; a client is its socket's address)",
        metavar="ADDRESSES",
    )  # fmt: skip
    allowed_hosts: str = option(
        "", "comma-separated host names the server answers to, besides the defaults (loopback "
        "names on a loopback --host; the address itself; this machine's names on 0.0.0.0); "
        "other Host headers get 400 and other Origins 403 (DNS rebinding). '*': any",
        metavar="NAMES",
    )  # fmt: skip
    max_filter_conditions: int = option(
        32, "distinct conditions one search's filter may hold (repeats count once)"
    )
    watch_interval: float = option(
        1.0, "seconds between looks at the galleries' files: changes made by `index add`, "
        "`remove` or `compact` while serving are picked up (0: never)",
    )  # fmt: skip
    access_log: bool = option(
        True, "one line per request on stderr: client, method, path, status, ms",
        flag="--no-access-log",
    )  # fmt: skip
    secure_cookie: bool = option(
        False, "mark the browser's session cookie Secure (serving behind an HTTPS proxy that "
        "does not send X-Forwarded-Proto; over HTTPS it is always Secure)",
    )  # fmt: skip
    show_paths: bool = option(
        False, "show the galleries' absolute folder paths on the Summary tab (default: folder "
        "names only)",
    )  # fmt: skip
    allow_writes: bool = option(
        False, "let REST clients add, update and delete items (POST /api/items, PATCH and "
        "DELETE /api/items/by-key; with a key that may write where there are keys)",
    )  # fmt: skip
    card_fields: str = option(
        "", "the metadata fields each result card leads with, in order (e.g. sku,shop,price); "
        "default: the gallery's key column", metavar="F1,F2,...",
    )  # fmt: skip
    decode_memory_mb: int = option(
        768, "memory each upload's decoding may take, in MB: uploads are decoded in worker "
        "processes under this address-space limit, and one that needs more is refused",
    )  # fmt: skip
    decode_timeout: float = option(
        30.0, "seconds an upload's decoding may take, waiting for a worker included"
    )
    rerank: str | None = option(
        None, "re-rank the index's top candidates: none | aqe | dba | dba+aqe | kreciprocal | "
        "pairwise, with parameters after a colon (default: what the gallery stores, else none)",
        metavar="METHOD[:K=V,...]",
    )  # fmt: skip
    session_s: float = option(
        12 * 3600.0, "seconds a browser's sign-in lasts", flag="--session-seconds"
    )

    # -- loading ---------------------------------------------------------------------------

    @classmethod
    def load(
        cls,
        flags: Mapping[str, Any] | None = None,
        *,
        config_file: str | os.PathLike[str] | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> Settings:
        """Defaults, then ``config_file`` (TOML, the field names as keys), then the
        NEARSIGHT_* variables of ``environ`` (os.environ by default), then ``flags`` (the
        values given on the command line, by field name); checked (:meth:`check`)."""
        values: dict[str, Any] = {}
        if config_file is not None:
            values.update(_read_config(Path(config_file)))
        environ = os.environ if environ is None else environ
        for spec in fields():
            name = ENV_PREFIX + spec.name.upper()
            if spec.metadata["env"] and name in environ:
                values[spec.name] = _convert(spec, environ[name], name)
        values.update({k: v for k, v in (flags or {}).items() if v is not None})
        settings = cls(**values)
        settings.check()
        return settings

    def replace(self, **changes: Any) -> Settings:
        return dataclasses.replace(self, **changes)

    def check(self) -> None:
        """One-line errors naming the flags."""
        self.galleries = [Path(g) for g in self.galleries]
        if not 0 <= self.port <= 65535:
            raise NearsightError(f"--port must be from 0 to 65535, got {self.port}")
        positive = ("max_upload_mb", "header_timeout", "body_timeout", "write_timeout",
                    "sign_in_timeout", "keep_alive", "decode_timeout", "session_s")  # fmt: skip
        for name in positive:
            if not getattr(self, name) > 0:
                raise NearsightError(f"{flag_of(name)} must be positive, got {getattr(self, name)}")
        at_least_one = ("concurrency", "max_queue", "max_filter_conditions", "max_connections",
                        "max_client_connections", "max_unauthenticated", "max_pipelined")  # fmt: skip
        for name in at_least_one:
            if getattr(self, name) < 1:
                raise NearsightError(
                    f"{flag_of(name)} must be at least 1, got {getattr(self, name)}"
                )
        for name in ("watch_interval", "analysis_max_items"):
            if getattr(self, name) < 0:
                raise NearsightError(
                    f"{flag_of(name)} must be 0 or more, got {getattr(self, name)}"
                )
        if self.decode_memory_mb < 64:
            raise NearsightError(
                f"--decode-memory-mb must be at least 64, got {self.decode_memory_mb}"
            )

    @property
    def max_upload_bytes(self) -> int:
        return int(self.max_upload_mb * 1024 * 1024)

    @property
    def host_names(self) -> list[str]:
        return [name.strip() for name in self.allowed_hosts.split(",") if name.strip()]

    @property
    def card_field_names(self) -> list[str]:
        return [name.strip() for name in self.card_fields.split(",") if name.strip()]


def fields() -> tuple[dataclasses.Field, ...]:
    return dataclasses.fields(Settings)


def flag_of(name: str) -> str:
    spec = next(s for s in fields() if s.name == name)
    return spec.metadata["flag"] or "--" + name.replace("_", "-")


def kind_of(spec: dataclasses.Field) -> type:
    """The plain type of a field: bool, int, float, str, Path or list."""
    text = str(spec.type)
    for name, kind in (("list", list), ("bool", bool), ("int", int), ("float", float),
                       ("Path", Path), ("str", str)):  # fmt: skip
        if text.startswith(name):
            return kind
    raise TypeError(f"Settings.{spec.name}: unsupported type {text}")


def _convert(spec: dataclasses.Field, text: str, where: str) -> Any:
    kind = kind_of(spec)
    if kind is bool:
        lowered = text.strip().lower()
        if lowered not in ("1", "0", "true", "false", "yes", "no", "on", "off"):
            raise NearsightError(f"{where} must be true or false, got {text!r}")
        return lowered in ("1", "true", "yes", "on")
    if kind is list:
        return [Path(part) for part in text.split(os.pathsep) if part]
    try:
        return kind(text)
    except ValueError:
        raise NearsightError(f"{where} must be a {kind.__name__}, got {text!r}") from None


def _read_config(path: Path) -> dict[str, Any]:
    try:
        data = tomllib.loads(path.read_text())
    except OSError as error:
        raise NearsightError(f"cannot read --config {path}: {error.strerror}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as error:
        raise NearsightError(f"--config {path} is not TOML: {str(error).splitlines()[0]}") from None
    known = {spec.name: spec for spec in fields()}
    values: dict[str, Any] = {}
    for key, value in data.items():
        name = key.replace("-", "_")
        if name not in known:
            raise NearsightError(f"--config {path}: unknown setting {key!r}")
        kind = kind_of(known[name])
        if kind is list:  # folders, relative to the file
            value = [path.parent / v for v in (value if isinstance(value, list) else [value])]
        elif kind is Path:
            value = path.parent / value
        elif isinstance(value, str) and kind is not str:
            value = _convert(known[name], value, f"--config {path}: {key}")
        elif kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        elif not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise NearsightError(f"--config {path}: {key} must be a {kind.__name__}, got {value!r}")
        values[name] = value
    return values


def settings_table() -> str:
    """The Markdown table of every setting (docs/serving.md holds it; a test compares)."""
    defaults = Settings()
    rows = ["| flag | environment | default | what |", "|---|---|---|---|"]
    for spec in fields():
        default = getattr(defaults, spec.name)
        shown = (
            "-"
            if default in (None, "", [])
            else f"`{default:g}`"
            if isinstance(default, float)
            else f"`{str(default).lower() if isinstance(default, bool) else default}`"
        )
        env = f"`{ENV_PREFIX}{spec.name.upper()}`" if spec.metadata["env"] else "-"
        what = spec.metadata["help"].replace("|", "\\|")
        rows.append(f"| `{flag_of(spec.name)}` | {env} | {shown} | {what} |")
    return "\n".join(rows)
