"""``nearsight serve``: the Gradio page over one or more galleries (nearsight/app/page/layout.py); the
command line of :func:`nearsight.app.serve.run.serve`."""

from __future__ import annotations

import argparse
from pathlib import Path

import nearsight.app.serve.run as serving
from nearsight.app.commands.device_option import add_device_option
from nearsight.app.commands.rerank_option import add_rerank_option


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "serve",
        help="serve the search page (Gradio) over one or more galleries",
        description="Serve a web page to query the galleries by image: the top-k framed green "
        "(the query's class) or red (another class), the gallery's leave-one-out failures and "
        "its Recall@k. Also an API endpoint /search for gradio_client. Prints the URL and "
        "serves until interrupted.",
    )
    parser.add_argument(
        "--gallery",
        type=Path,
        action="append",
        required=True,
        metavar="DIR",
        help="gallery folder (repeat for several; the page offers a choice)",
    )
    parser.add_argument(
        "--model",
        type=Path,
        help="model that embeds uploads (default: the model each gallery was built with; "
        "it must be the gallery's model)",
    )
    parser.add_argument(
        "--host",
        default=serving.DEFAULT_HOST,
        help=f"address to listen on (default {serving.DEFAULT_HOST}; 0.0.0.0 serves the local "
        "network)",
    )
    parser.add_argument(
        "--port", type=int, default=serving.DEFAULT_PORT, help=f"default {serving.DEFAULT_PORT}"
    )
    add_device_option(parser)
    parser.add_argument(
        "--max-upload-mb",
        type=float,
        default=serving.DEFAULT_MAX_UPLOAD_MB,
        help=f"largest image a user may upload, in MB (default {serving.DEFAULT_MAX_UPLOAD_MB:g})",
    )
    parser.add_argument(
        "--concurrency",
        type=int,
        default=serving.DEFAULT_CONCURRENCY,
        help="searches embedded at once; more wait in the queue (default "
        f"{serving.DEFAULT_CONCURRENCY})",
    )
    parser.add_argument(
        "--max-queue",
        type=int,
        default=serving.DEFAULT_MAX_QUEUE,
        help="events allowed to wait in the queue; more are refused (default "
        f"{serving.DEFAULT_MAX_QUEUE})",
    )
    parser.add_argument(
        "--analysis-max-items",
        type=int,
        default=serving.DEFAULT_ANALYSIS_MAX_ITEMS,
        help="largest gallery (labelled items) whose leave-one-out failure list and Recall@k "
        f"the page computes at start: two exact O(N^2) passes (default "
        f"{serving.DEFAULT_ANALYSIS_MAX_ITEMS})",
    )
    parser.add_argument(
        "--api-key",
        help="key every route but /api/health requires: X-API-Key or Authorization: Bearer "
        "for API clients, a sign-in form for browsers (default: --api-key-file, else the "
        "NEARSIGHT_API_KEY environment variable; required, of 16 characters or more, when "
        "--host is not a loopback address). Prefer the file or the variable: a flag shows "
        "in `ps`",
    )
    parser.add_argument("--api-key-file", type=Path, help="read the API key from this file")
    parser.add_argument(
        "--max-connections",
        type=int,
        default=serving.DEFAULT_MAX_CONNECTIONS,
        help=f"open connections beyond this get 503 (default {serving.DEFAULT_MAX_CONNECTIONS})",
    )
    parser.add_argument(
        "--max-client-connections",
        type=int,
        default=serving.DEFAULT_MAX_CLIENT_CONNECTIONS,
        help="open connections one client address may hold; more get 429 (default "
        f"{serving.DEFAULT_MAX_CLIENT_CONNECTIONS})",
    )
    parser.add_argument(
        "--header-timeout",
        type=float,
        default=serving.DEFAULT_HEADER_TIMEOUT_S,
        help="seconds a request's headers may take to arrive, on every request of a "
        f"connection (default {serving.DEFAULT_HEADER_TIMEOUT_S:g})",
    )
    parser.add_argument(
        "--allowed-hosts",
        default="",
        metavar="NAMES",
        help="comma-separated host names the server answers to, besides the defaults "
        "(loopback names on a loopback --host; the address itself; this machine's names on "
        "0.0.0.0); other Host headers get 400 and other Origins 403 (DNS rebinding). "
        "'*': any",
    )
    parser.add_argument(
        "--secure-cookie",
        action="store_true",
        help="mark the browser's session cookie Secure (serving behind an HTTPS proxy "
        "that does not send X-Forwarded-Proto; over HTTPS it is always Secure)",
    )
    parser.add_argument(
        "--no-access-log",
        action="store_true",
        help="no line per request on stderr (default: client, method, path, status, ms)",
    )
    parser.add_argument(
        "--body-timeout",
        type=float,
        default=serving.DEFAULT_BODY_TIMEOUT_S,
        help="seconds a whole request body may take to arrive, from its headers to its last "
        f"byte; later, 408 (default {serving.DEFAULT_BODY_TIMEOUT_S:g})",
    )
    parser.add_argument(
        "--sign-in-timeout",
        type=float,
        default=serving.DEFAULT_SIGN_IN_TIMEOUT_S,
        help="seconds a whole sign-in form (POST /login) may take to arrive (default "
        f"{serving.DEFAULT_SIGN_IN_TIMEOUT_S:g})",
    )
    parser.add_argument(
        "--max-unauthenticated",
        type=int,
        default=serving.DEFAULT_MAX_UNAUTHENTICATED,
        help="connections that may wait without the key at once: sign-in forms being read "
        "(more get 503) and connections sending their headers or idle (past this the one "
        f"waiting longest is closed) (default {serving.DEFAULT_MAX_UNAUTHENTICATED})",
    )
    parser.add_argument(
        "--forwarded-allow-ips",
        default="",
        metavar="ADDRESSES",
        help="comma-separated addresses or networks of trusted proxies ('*': any): a request "
        "from one counts as the client its X-Forwarded-For names, with the scheme of its "
        "X-Forwarded-Proto (default: none; a client is its socket's address)",
    )
    parser.add_argument(
        "--max-filter-conditions",
        type=int,
        default=None,
        help="distinct conditions one search's filter may hold (default 32; repeats count once)",
    )
    parser.add_argument(
        "--watch-interval",
        type=float,
        default=serving.DEFAULT_WATCH_INTERVAL_S,
        help="seconds between looks at the galleries' files: changes made by `index add`, "
        f"`remove` or `compact` while serving are picked up (0: never; default "
        f"{serving.DEFAULT_WATCH_INTERVAL_S:g})",
    )
    parser.add_argument(
        "--show-paths",
        action="store_true",
        help="show the galleries' absolute folder paths on the Summary tab (default: folder "
        "names only)",
    )
    parser.add_argument(
        "--card-fields",
        metavar="F1,F2,...",
        help="the metadata fields each result card leads with, in order (e.g. sku,shop,price); "
        "default: the gallery's key column (then the fields a search filtered on, then the "
        "others as they fit; every field is one hover or click away)",
    )
    parser.add_argument(
        "--decode-memory-mb",
        type=int,
        default=None,
        help="memory each upload's decoding may take, in MB: uploads are decoded in worker "
        "processes under this address-space limit, and one that needs more is refused "
        f"(default {serving.DEFAULT_DECODE_MEMORY_MB})",
    )
    parser.add_argument(
        "--decode-timeout",
        type=float,
        default=None,
        help=f"seconds an upload's decoding may take (default {serving.DEFAULT_DECODE_TIMEOUT_S:g})",
    )
    add_rerank_option(parser)
    parser.set_defaults(func=run_serve)


def run_serve(args: argparse.Namespace) -> int:
    serving.serve(
        args.gallery,
        model=args.model,
        host=args.host,
        port=args.port,
        device=args.device,
        api_key=args.api_key,
        api_key_file=args.api_key_file,
        max_upload_mb=args.max_upload_mb,
        concurrency=args.concurrency,
        max_queue=args.max_queue,
        analysis_max_items=args.analysis_max_items,
        max_connections=args.max_connections,
        max_client_connections=args.max_client_connections,
        header_timeout=args.header_timeout,
        body_timeout=args.body_timeout,
        max_filter_conditions=args.max_filter_conditions,
        watch_interval=args.watch_interval,
        allowed_hosts=args.allowed_hosts.split(","),
        access_log=not args.no_access_log,
        secure_cookie=args.secure_cookie,
        show_paths=args.show_paths,
        rerank=args.rerank,
        card_fields=[f.strip() for f in (args.card_fields or "").split(",") if f.strip()],
        forwarded_allow_ips=args.forwarded_allow_ips,
        sign_in_timeout=args.sign_in_timeout,
        max_unauthenticated=args.max_unauthenticated,
        decode_memory_mb=args.decode_memory_mb,
        decode_timeout=args.decode_timeout,
    )
    return 0


def _api_key(args: argparse.Namespace) -> str | None:
    """--api-key, else --api-key-file, else NEARSIGHT_API_KEY; beyond localhost one is
    required, and long enough (nearsight.app.serve.auth.check_key)."""
    return serving.resolve_api_key(args.api_key, args.api_key_file, args.host)
