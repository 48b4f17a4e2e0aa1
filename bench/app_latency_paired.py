"""REST search latency beside its yardsticks, measured query by query in turns, in one run.

    python bench/app_latency_paired.py [--items 10000] [--queries 60] [--k 8]
                                       [--query-format png|jpeg] [--before TREE]
                                       [--json FILE] [--workdir DIR] [--smoke]

bench/app_latency.py measures the model alone first and the server after it, so a VM whose
speed drifts within minutes (this one's does, by 20%) moves one figure and not the other. Here
every round sends the same query image, one client at a time, to each path in turn, the order
rotating from round to round, with ``--gap-ms`` of idle time before each call (onnxruntime's
threads spin for a while after a run; without the gap each path would share the cores with the
one before it):

- ``direct``: in this process, no server: the embedding of the decoded picture plus the FAISS
  search (bench/app_latency.py's yardstick: ``embed_images`` + ``search_one``), timed with and
  without decoding the file's bytes first (a search by upload has to decode them; the decode
  is timed on its own too);
- ``rest``: ``POST /api/search`` (multipart, the API key sent) to `nearsight serve`'s server
  from this tree, as bench/app_latency.py starts it, from an httpx client;
- ``rest_lean``: the same request to the same server from the standard library's
  ``http.client`` (a client as light as curl: httpx spends about 1.7 ms of a round trip on
  its own encoding and layers);
- ``before`` (``--before TREE``): the same request to a server started from another checkout
  (TREE's own bench/app_latency.py ``--serve``), on the same gallery: a before/after whose two
  sides share every minute of the run.

The query pictures are bench/app_latency.py's (``--query-format``: its PNGs of noisy textures,
the slowest decode a small upload asks for, or the same pictures as JPEGs).

Figures: p50/p95 of each path; the issue's goals as ratios of p50s (REST over direct embed +
search <= 1.2; REST over before <= 1.1), and the median of the per-round ratios (each round's
paths ran within a fraction of a second of each other). A script, not a test; the load average
is printed with the numbers. ``--smoke``: a 32-px ResNet-18, 200 items, 4 rounds (the suite
runs it).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import app_latency  # noqa: E402  (the setup and the server are its)
from app_latency_rounds import (  # noqa: E402
    GAP_MS,
    direct_paths,
    lean_rest_path,
    measure,
    report_of,
    rest_path,
)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--items", type=int, default=10_000, help="gallery size (default 10k)")
    parser.add_argument("--queries", type=int, default=60, help="rounds (default 60)")
    parser.add_argument("--k", type=int, default=8)
    parser.add_argument("--before", type=Path, help="a checkout whose server to compare with")
    parser.add_argument(
        "--gap-ms",
        type=float,
        default=GAP_MS,
        help="idle time before each timed call (default 50 ms): onnxruntime's threads spin a "
        "while after a run, and a call that follows at once shares the cores with them",
    )
    parser.add_argument(
        "--query-format",
        choices=app_latency.QUERY_FORMATS,
        default="png",
        help="the query pictures as PNG (as written: the slow decode) or JPEG (quality 90)",
    )
    parser.add_argument("--workdir", type=Path, help="keep the model and gallery here")
    parser.add_argument("--json", type=Path, help="also write the numbers to this file")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes: checks it runs")
    args = parser.parse_args(argv)
    # the server and the setup read bench/app_latency.py's settings
    args.dim, args.classes, args.image_size, args.arch = 128, 100, 224, "resnet50"
    args.model_format, args.concurrency, args.analysis = "onnx", 2, False
    if args.smoke:
        args.items, args.queries, args.image_size, args.arch, args.classes = (
            200,
            4,
            32,
            "resnet18",
            10,
        )
    return args


def start_server(gallery: Path, args, tree: Path | None) -> tuple[subprocess.Popen, str]:
    """A server from this tree (bench/app_latency.py's), or from ``tree`` with its own code."""
    if tree is None:
        server, url, _, _ = app_latency.start_server(gallery, args)
        return server, url
    tree = tree.resolve()
    command = [sys.executable, str(tree / "bench" / "app_latency.py"), "--serve", str(gallery),
               "--concurrency", str(args.concurrency), "--port", str(app_latency.free_port())]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(tree)}
    server = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, cwd=tree, env=env)
    assert server.stdout is not None
    for line in server.stdout:
        if line.startswith(app_latency.READY):
            return server, line.split()[1]
    raise SystemExit(f"the server from {tree} ended (status {server.wait()})")


def main(argv=None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="nearsight-paired-bench-"))
    workdir.mkdir(parents=True, exist_ok=True)
    servers = []
    try:
        model, _ = app_latency.make_model(workdir, args)
        images = app_latency.make_images(workdir, "images", 0)
        gallery, _ = app_latency.make_gallery(workdir, model, images, args)
        queries = app_latency.make_images(workdir, "queries", 1, args.query_format)
        payloads = [path.read_bytes() for path in queries]
        view, direct = direct_paths(gallery, args.k)
        rests = {}
        for name, tree in (("rest", None), ("before", args.before)):
            if name == "before" and tree is None:
                continue
            server, url = start_server(gallery, args, tree)
            servers.append(server)
            client, rests[name] = rest_path(url, args.k, queries[0].name)
            print(f"{name}: {url} ({tree or 'this tree'})", flush=True)
            if name == "rest":
                _, rests["rest_lean"] = lean_rest_path(url, args.k, queries[0].name)
        load_before = os.getloadavg()
        report = report_of(measure(payloads, direct, rests, args.queries, args.gap_ms / 1000))
        report["load_average"] = {"before": load_before, "after": os.getloadavg()}
        report["settings"] = {k: str(v) for k, v in vars(args).items()}
        view.close()
    finally:
        for server in servers:
            server.terminate()
            server.wait(timeout=60)
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)
    for name, s in report["paths"].items():
        print(f"{name:20s}: p50 {s['p50_ms']:7.1f} ms  p95 {s['p95_ms']:7.1f} ms  (n {s['n']})")
    for key, value in report["goals"].items():
        print(f"  {key}: {value:.3f}" if isinstance(value, float) else f"  {key}: {value}")
    print(f"load average {report['load_average']['before'][0]:.2f} -> "
          f"{report['load_average']['after'][0]:.2f} (cores: {os.cpu_count()})")  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
