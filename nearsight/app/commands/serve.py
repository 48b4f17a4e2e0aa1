"""``nearsight serve``: the Gradio page over one or more galleries (nearsight/app/page.py)."""

from __future__ import annotations

import argparse
import errno
import socket
import sys
from pathlib import Path

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
        default="127.0.0.1",
        help="address to listen on (default 127.0.0.1; 0.0.0.0 serves the local network)",
    )
    parser.add_argument("--port", type=int, default=7860, help="default 7860")
    parser.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    parser.add_argument(
        "--max-upload-mb",
        type=float,
        default=10.0,
        help="largest image a user may upload, in MB (default 10)",
    )
    parser.add_argument(
        "--concurrency",
        type=int,
        default=2,
        help="searches embedded at once; more wait in the queue (default 2)",
    )
    parser.add_argument(
        "--max-queue",
        type=int,
        default=64,
        help="events allowed to wait in the queue; more are refused (default 64)",
    )
    parser.add_argument(
        "--analysis-max-items",
        type=int,
        default=100_000,
        help="largest gallery (labelled items) whose leave-one-out failure list and Recall@k "
        "the page computes at start: two exact O(N^2) passes (default 100000)",
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
        default=256,
        help="open connections beyond this get 503 (default 256)",
    )
    parser.add_argument(
        "--max-client-connections",
        type=int,
        default=32,
        help="open connections one client address may hold; more get 429 (default 32)",
    )
    parser.add_argument(
        "--header-timeout",
        type=float,
        default=10.0,
        help="seconds a request's headers may take to arrive, on every request of a "
        "connection (default 10)",
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
        default=30.0,
        help="seconds a request body may stall between chunks before a 408 (default 30)",
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
        default=1.0,
        help="seconds between looks at the galleries' files: changes made by `index add`, "
        "`remove` or `compact` while serving are picked up (0: never; default 1)",
    )
    parser.add_argument(
        "--show-paths",
        action="store_true",
        help="show the galleries' absolute folder paths on the Summary tab (default: folder "
        "names only)",
    )
    add_rerank_option(parser)
    parser.set_defaults(func=run_serve)


def run_serve(args: argparse.Namespace) -> int:
    from nearsight.core.errors import NearsightError

    if not 0 <= args.port <= 65535:
        raise NearsightError(f"--port must be from 0 to 65535, got {args.port}")
    if not args.max_upload_mb > 0:
        raise NearsightError(f"--max-upload-mb must be positive, got {args.max_upload_mb}")
    if args.concurrency < 1:
        raise NearsightError(f"--concurrency must be at least 1, got {args.concurrency}")
    if args.max_queue < 1:
        raise NearsightError(f"--max-queue must be at least 1, got {args.max_queue}")
    if args.max_filter_conditions is not None and args.max_filter_conditions < 1:
        raise NearsightError(
            f"--max-filter-conditions must be at least 1, got {args.max_filter_conditions}"
        )
    if args.max_connections < 1:
        raise NearsightError(f"--max-connections must be at least 1, got {args.max_connections}")
    if args.max_client_connections < 1:
        raise NearsightError(
            f"--max-client-connections must be at least 1, got {args.max_client_connections}"
        )
    if not args.header_timeout > 0:
        raise NearsightError(f"--header-timeout must be positive, got {args.header_timeout}")
    if not args.body_timeout > 0:
        raise NearsightError(f"--body-timeout must be positive, got {args.body_timeout}")
    if args.watch_interval < 0:
        raise NearsightError(f"--watch-interval must be 0 or more, got {args.watch_interval}")
    if args.analysis_max_items < 0:
        raise NearsightError(
            f"--analysis-max-items must be 0 or more, got {args.analysis_max_items}"
        )

    _check_address(args.host, args.port)  # before minutes of loading galleries
    api_key = _api_key(args)

    from nearsight.app.page import build_app
    from nearsight.app.server import launch_app, stop_app

    demo = build_app(
        args.gallery,
        args.model,
        device=args.device,
        concurrency=args.concurrency,
        max_queue=args.max_queue,
        analysis_max_items=args.analysis_max_items,
        show_paths=args.show_paths,
        rerank=args.rerank,
    )
    try:
        url = launch_app(
            demo,
            host=args.host,
            port=args.port,
            max_upload_mb=args.max_upload_mb,
            prevent_thread_lock=True,
            quiet=True,
            api_key=api_key,
            max_filter_conditions=args.max_filter_conditions,
            watch_interval=args.watch_interval,
            max_connections=args.max_connections,
            max_client_connections=args.max_client_connections,
            body_timeout_s=args.body_timeout,
            header_timeout_s=args.header_timeout,
            allowed_hosts=[name.strip() for name in args.allowed_hosts.split(",")],
            access_log=not args.no_access_log,
            secure_cookie=args.secure_cookie,
        )
    except OSError as error:  # the port is taken, or the address is not ours
        demo.nearsight.close()
        reason = (
            "the port is in use (choose another with --port)"
            if "empty port" in str(error)
            else str(error)
        )
        raise NearsightError(f"cannot serve on {args.host}:{args.port}: {reason}") from None
    print(f"nearsight: serving {len(demo.nearsight.names)} gallery(ies) at {url}", flush=True)
    print(f"nearsight: REST API at {url.rstrip('/')}/api (docs: /api/docs)", flush=True)
    try:
        demo.block_thread()  # until Ctrl-C
    finally:
        stop_app(demo)
    print("nearsight: stopped", file=sys.stderr)
    return 0


def _api_key(args: argparse.Namespace) -> str | None:
    """--api-key, else --api-key-file, else NEARSIGHT_API_KEY; beyond localhost one is
    required, and long enough (nearsight.app.auth.check_key)."""
    import os

    from nearsight.app.auth import API_KEY_ENV, check_key
    from nearsight.core.errors import NearsightError

    key = args.api_key
    if key is None and args.api_key_file is not None:
        try:
            key = args.api_key_file.read_text().strip()
        except (OSError, UnicodeDecodeError) as error:
            reason = getattr(error, "strerror", None) or "not text"
            raise NearsightError(f"cannot read --api-key-file {args.api_key_file}: {reason}") from None
        if not key:
            raise NearsightError(f"--api-key-file {args.api_key_file} is empty")
    if key is None:
        key = os.environ.get(API_KEY_ENV)
    key = (key or "").strip() or None
    check_key(key, args.host)
    return key


def _check_address(host: str, port: int) -> None:
    """NearsightError unless ``host``:``port`` can be listened on. Gradio reports every failure
    to listen (an unknown host, an address that is not this machine's) as "no empty port"."""
    from nearsight.core.errors import NearsightError

    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except (socket.gaierror, UnicodeError) as error:
        reason = getattr(error, "strerror", None) or str(error)
        raise NearsightError(f"cannot serve on {host}:{port}: unknown host ({reason})") from None
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
        try:
            probe.bind(address)
        except OSError as error:
            reason = (
                "the port is in use (choose another with --port)"
                if error.errno == errno.EADDRINUSE
                else error.strerror or str(error)
            )
            raise NearsightError(f"cannot serve on {host}:{port}: {reason}") from None
