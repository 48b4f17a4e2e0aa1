"""Query latency of `nearsight serve` through its APIs: the REST API (nearsight/app/rest/) and Gradio's
``/search`` through gradio_client, beside the model alone, in one run.

    python bench/app_latency.py [--items 60000] [--dim 128] [--classes 100] [--image-size 224]
                                [--model-format onnx|pt] [--queries 40] [--clients 1 4]
                                [--concurrency 2] [--k 8] [--analysis] [--workdir DIR]
                                [--json FILE] [--quick | --smoke]

Setup (timed, not measured as latency):

1. a random (untrained) 224-px ResNet-50 embedding net, saved as a checkpoint and, by default,
   exported to ONNX (what a deployment serves; ``--model-format pt`` serves the checkpoint);
2. a gallery of ``--items`` random unit vectors (D = ``--dim``) written by index.gallery's
   write_gallery, each item pointing at one of a few real image files (search by upload never
   opens them; the page's thumbnails would) with ``--classes`` balanced labels, so that the
   page's leave-one-out analysis runs at full size too;
3. the page (app.page.build_app / launch_app) in a separate server process on 127.0.0.1, CPU
   only. The page's leave-one-out analysis (Recall@k and the failure list: two O(N^2) passes)
   is left out by default, as /search never needs it; with ``--analysis`` the server computes
   it at start as `nearsight serve` does, and the bench times it and measures after it.

The query images are 320-px PNGs of noisy synthetic textures, which barely compress: the
slowest decode a small upload asks for (3-4 ms here). ``--query-format jpeg`` writes the same
pictures as JPEGs (quality 90), what a camera or a shop's photo gives (about 1 ms to decode).

Measured: the same query images uploaded (k = ``--k``) by N concurrent clients (each a thread
with its own connection; default N = 1 and 4), every client sending ``--queries`` queries back
to back: p50/p95 per query and the throughput, for ``POST /api/search`` (httpx, multipart) and
for Gradio's ``/search`` (gradio_client). Beside them, in the bench process before the server
starts, the embedding and the FAISS search alone (``embedder.embed_images`` + ``search_one``,
the calls a REST search makes, no server) for the servers' overhead. The query images are files
of their own, not the gallery's: an upload whose bytes are a gallery file's is searched as that
item, without embedding it (nearsight/search/searcher.py ``query_vector``).

Goals (ratios within the run, issue #16): REST p50 at one client <= 1.2 x the direct time per
query (embed + search p50); REST throughput at four clients >= 0.8 x 1 / (direct time per
query); micro-batching concurrent requests into one embedding call can take it above 1. The
one-client ratio comes from ``--queries`` rounds in turns (bench/app_latency_paired.py's: each
round the same query to the model in this process and to the server, 50 ms apart), as this
VM's speed drifts by 20% within minutes; the ratio of the two sequential figures is printed
beside it.

The server runs as it would when exposed: with an API key (sent by both clients), the default
limits and the gallery watcher on.

``--quick``: 10k items and 12 queries per client. ``--smoke``: the smallest run that still
prints every figure (a 32-px ResNet-18, 200 items, 4 queries, 1 and 4 REST clients, 1
gradio_client; the suite runs it: tests/bench/test_bench_smoke.py). A script, not a test. The machine may be
shared: the load average is printed with the numbers.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
from app_latency_rounds import (
    BENCH_KEY,
    GAP_MS,
    MIME,
    direct_paths,
    measure,
    report_of,
    rest_path,
    summary,
)

READY = "NEARSIGHT-BENCH-READY"
QUERY_FORMATS = ("png", "jpeg")


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--items", type=int, default=60_000, help="gallery size (default 60k)")
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--classes", type=int, default=100)
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--model-format", choices=["onnx", "pt"], default="onnx")
    parser.add_argument("--queries", type=int, default=40, help="queries per client (default 40)")
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--concurrency", type=int, default=2, help="server's embedding limit")
    parser.add_argument("--k", type=int, default=8)
    parser.add_argument(
        "--query-format",
        choices=QUERY_FORMATS,
        default="png",
        help="the query pictures as PNG (as written: the slow decode) or JPEG (quality 90)",
    )
    parser.add_argument("--workdir", type=Path, help="keep the model and gallery here")
    parser.add_argument(
        "--analysis",
        action="store_true",
        help="also time the page's leave-one-out analysis (Recall@k + failure list; two "
        "O(N^2) passes: minutes at 60k on 2 cores) and measure after it, as after a start",
    )
    parser.add_argument("--json", type=Path, help="also write the numbers to this file")
    parser.add_argument("--quick", action="store_true", help="10k items, 12 queries per client")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes: checks it runs")
    parser.add_argument("--arch", default="resnet50", help=argparse.SUPPRESS)
    parser.add_argument("--serve", type=Path, help=argparse.SUPPRESS)  # the server process
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.quick:
        args.items, args.queries = min(args.items, 10_000), min(args.queries, 12)
    if args.smoke:
        args.items, args.queries, args.image_size = 200, 4, 32
        args.arch, args.classes = "resnet18", 10
    return args


# -- the server process ------------------------------------------------------------------------


def serve(args: argparse.Namespace) -> int:
    from nearsight.app.page.layout import build_app
    from nearsight.app.serve.run import stop_on_sigterm
    from nearsight.app.serve.settings import Settings
    from nearsight.app.server_app import launch_app, served, stop_app

    start = time.perf_counter()
    demo = build_app(
        [args.serve],
        device="cpu",
        concurrency=args.concurrency,
        max_queue=256,
        analyse=args.analysis,
    )
    opened = time.perf_counter() - start
    # as exposed: the key on every route, the default limits, live galleries watched
    settings = Settings(port=args.port, api_key=BENCH_KEY, watch_interval=1.0,
                        concurrency=args.concurrency, max_queue=256, access_log=False)  # fmt: skip
    url = launch_app(demo, settings)
    start = time.perf_counter()
    demo.nearsight.wait_analysis()
    analysed = time.perf_counter() - start if args.analysis else float("nan")
    print(f"{READY} {url} {opened:.2f} {analysed:.2f}", flush=True)
    try:
        with stop_on_sigterm():  # the bench stops it with SIGTERM
            served(demo).thread.join()
    except KeyboardInterrupt:
        pass
    finally:
        stop_app(demo)
    return 0


# -- setup -------------------------------------------------------------------------------------


def make_model(workdir: Path, args: argparse.Namespace) -> tuple[Path, dict]:
    import torch

    from nearsight.models.checkpoint import save_checkpoint
    from nearsight.models.embedding import EmbeddingConfig, build_embedding_net

    timings = {}
    torch.manual_seed(0)
    start = time.perf_counter()
    arch = getattr(args, "arch", "resnet50")  # bench/rerank.py passes its own options
    config = EmbeddingConfig(dim=args.dim, image_size=args.image_size, arch=arch)
    net = build_embedding_net(config)
    checkpoint = workdir / "model.pt"
    save_checkpoint(checkpoint, net)
    timings["checkpoint_s"] = time.perf_counter() - start
    if args.model_format == "pt":
        return checkpoint, timings
    from nearsight.models.export import export_onnx

    start = time.perf_counter()
    model = workdir / "model.onnx"
    export_onnx(checkpoint, model)
    timings["onnx_export_s"] = time.perf_counter() - start
    return model, timings


def make_images(
    workdir: Path, name: str = "images", seed: int = 0, query_format: str = "png"
) -> list[Path]:
    """16 synthetic 320-px pictures, as PNG files or (``query_format`` "jpeg") JPEG files."""
    from nearsight.data.datasets.synthetic import write_synthetic

    data = workdir / name
    write_synthetic(data, classes=4, per_class=4, size=320, seed=seed)
    paths = sorted(data.rglob("*.png"))
    if query_format == "png":
        return paths
    from PIL import Image

    for path in paths:
        with Image.open(path) as image:
            image.convert("RGB").save(path.with_suffix(".jpg"), "JPEG", quality=90)
    return [path.with_suffix(".jpg") for path in paths]


def make_gallery(workdir: Path, model: Path, images: list[Path], args) -> tuple[Path, float]:
    from nearsight.data.images import describe_image_file
    from nearsight.index.gallery.write import write_gallery
    from nearsight.models.loading import load_embedder

    rng = np.random.default_rng(0)
    vectors = rng.standard_normal((args.items, args.dim), dtype=np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    described = [describe_image_file(path) for path in images]
    items = [
        {
            "path": str(images[i % len(images)]),
            "label": i % args.classes,
            "class_name": f"class {i % args.classes:03d}",
            "split": "test",
            **described[i % len(images)],
        }
        for i in range(args.items)
    ]
    embedder = load_embedder(model, device="cpu")
    start = time.perf_counter()
    gallery = write_gallery(
        workdir / "gallery",
        vectors,
        items,
        model_sha256=embedder.model_sha256,
        meta={"model": str(model), "image_size": embedder.image_size, "source": "bench"},
    )
    return gallery, time.perf_counter() - start


def direct_latency(gallery: Path, images: list[Path], args) -> dict:
    """Embedding + search without Gradio, in this process (the server is not running yet)."""
    from nearsight.data.images import load_image
    from nearsight.search.served import ServedGallery, open_served

    (view,) = open_served([gallery], device="cpu", kind=ServedGallery)
    pictures = [load_image(path) for path in images]
    for picture in pictures[:2]:  # warm-up
        view.search(picture, args.k)
    embed, search = [], []
    for i in range(max(8, args.queries // 2)):
        picture = pictures[i % len(pictures)]
        start = time.perf_counter()
        vector = view.embedder.embed_images([picture])[0]
        middle = time.perf_counter()
        found = view.search_one(vector, args.k)
        search.append(time.perf_counter() - middle)
        embed.append(middle - start)
        assert len(found) == args.k
    view.close()
    return {"embed": summary(embed), "search": summary(search)}


# -- measuring ---------------------------------------------------------------------------------


def gradio_latency(url: str, images: list[Path], clients: int, args) -> dict:
    from gradio_client import Client, handle_file

    def connect():
        return Client(url, verbose=False, headers={"X-API-Key": BENCH_KEY})

    def query(client, path: Path) -> int:
        return len(json.loads(client.predict(handle_file(path), args.k, api_name="/search")))

    return load_latency(connect, query, images, clients, args)


def rest_latency(url: str, images: list[Path], clients: int, args) -> dict:
    import httpx

    payloads = {path: path.read_bytes() for path in images}
    endpoint = url.rstrip("/") + "/api/search"

    def connect():
        return httpx.Client(timeout=120, headers={"X-API-Key": BENCH_KEY})

    def query(client, path: Path) -> int:
        files = {"image": (path.name, payloads[path], MIME[path.suffix])}
        answer = client.post(endpoint, files=files, data={"k": str(args.k)})
        answer.raise_for_status()
        return len(answer.json()["neighbours"])

    return load_latency(connect, query, images, clients, args)


def load_latency(connect, query, images: list[Path], clients: int, args) -> dict:
    """``clients`` threads, each with its own connection, sending ``args.queries`` queries back
    to back after one warm-up query each."""
    latencies: list[float] = []
    errors: queue.Queue = queue.Queue()
    lock = threading.Lock()
    began: list[float] = []  # when every client has warmed up: the measured span starts
    barrier = threading.Barrier(clients, action=lambda: began.append(time.perf_counter()))

    def run(offset: int) -> None:
        try:
            client = connect()
            query(client, images[offset % len(images)])
            barrier.wait()
            for i in range(args.queries):
                path = images[(offset + i) % len(images)]
                start = time.perf_counter()
                found = query(client, path)
                elapsed = time.perf_counter() - start
                assert found == args.k
                with lock:
                    latencies.append(elapsed)
        except BaseException as error:  # reported after the run
            errors.put(error)
            barrier.abort()

    threads = [threading.Thread(target=run, args=(n,)) for n in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - began[0] if began else float("nan")
    if not errors.empty():
        raise errors.get()
    result = summary(latencies)
    result["clients"] = clients
    result["queries_per_s"] = len(latencies) / wall  # after the warm-up calls
    return result


def in_turns(gallery: Path, images: list[Path], url: str, args) -> dict:
    """REST at one client against the model's embed + search, query by query in turns."""
    view, direct = direct_paths(gallery, args.k)
    client, rest = rest_path(url, args.k, images[0].name)
    try:
        payloads = [path.read_bytes() for path in images]
        times = measure(payloads, direct, {"rest": rest}, args.queries, GAP_MS / 1000)
        return report_of(times)
    finally:
        client.close()
        view.close()


def goals(report: dict) -> dict:
    """The issue's goals as ratios of this run's numbers."""
    direct_ms = report["direct"]["embed"]["p50_ms"] + report["direct"]["search"]["p50_ms"]
    rest = {r["clients"]: r for r in report["rest"]}
    out: dict = {"direct_ms_per_query": direct_ms}
    if 1 in rest:
        out["rest_p50_1_client_over_direct"] = report["in_turns"]["goals"][
            "rest_over_embed+search_p50"
        ]
        out["rest_p50_goal_met"] = out["rest_p50_1_client_over_direct"] <= 1.2
        out["rest_p50_1_client_over_direct_sequential"] = rest[1]["p50_ms"] / direct_ms
    if 4 in rest:
        out["rest_qps_4_clients_over_direct_rate"] = rest[4]["queries_per_s"] * direct_ms / 1000
        out["rest_throughput_goal_met"] = out["rest_qps_4_clients_over_direct_rate"] >= 0.8
    return out


def start_server(gallery: Path, args) -> tuple[subprocess.Popen, str, float, float]:
    command = [sys.executable, __file__, "--serve", str(gallery)]
    command += ["--concurrency", str(args.concurrency), "--port", str(free_port())]
    command += ["--analysis"] if args.analysis else []
    server = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    assert server.stdout is not None
    for line in server.stdout:
        if line.startswith(READY):
            _, url, opened, analysed = line.split()
            return server, url, float(opened), float(analysed)
    raise SystemExit(f"the server process ended (status {server.wait()})")


def free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.serve:
        return serve(args)
    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="nearsight-app-bench-"))
    workdir.mkdir(parents=True, exist_ok=True)
    report: dict = {"settings": {k: v for k, v in vars(args).items() if k not in ("serve", "port")}}
    try:
        print(
            f"setup in {workdir}: {args.image_size}-px model ({args.model_format}), "
            f"{args.items} x {args.dim} gallery, {args.classes} classes",
            flush=True,
        )
        model, timings = make_model(workdir, args)
        gallery, build_s = make_gallery(workdir, model, make_images(workdir, "images", 0), args)
        images = make_images(workdir, "queries", 1, args.query_format)  # not the gallery's
        timings["gallery_build_s"] = build_s
        report["setup"] = timings
        print("  " + ", ".join(f"{k} {v:.1f}" for k, v in timings.items()), flush=True)

        report["direct"] = direct_latency(gallery, images, args)
        for part in ("embed", "search"):
            s = report["direct"][part]
            print(f"direct {part:6s}: p50 {s['p50_ms']:7.1f} ms  p95 {s['p95_ms']:7.1f} ms")

        server, url, opened, analysed = start_server(gallery, args)
        report["server"] = {"open_s": opened, "analysis_s": analysed}
        analysis = f", leave-one-out analysis {analysed:.1f}s" if args.analysis else ""
        print(f"server {url}: opened in {opened:.1f}s{analysis}", flush=True)
        try:
            report["in_turns"] = in_turns(gallery, images, url, args)
            for name in ("embed+search", "rest"):
                s = report["in_turns"]["paths"][name]
                print(f"in turns, {name:12s}: p50 {s['p50_ms']:7.1f} ms  p95 {s['p95_ms']:7.1f} ms")
            for name, measure, label in (
                ("rest", rest_latency, "REST POST /api/search"),
                ("api", gradio_latency, "gradio_client /search"),
            ):
                report[name] = []
                # smoke: gradio_client at one client (its figure), REST at both (the goals')
                for clients in [1] if args.smoke and name == "api" else args.clients:
                    result = measure(url, images, clients, args)
                    report[name].append(result)
                    print(
                        f"{label}, {clients} client(s) x {args.queries}: "
                        f"p50 {result['p50_ms']:7.1f} ms  p95 {result['p95_ms']:7.1f} ms  "
                        f"{result['queries_per_s']:.2f} queries/s",
                        flush=True,
                    )
            report["goals"] = goals(report)
            for key, value in report["goals"].items():
                shown = f"{value:.2f}" if isinstance(value, float) else str(value)
                print(f"  {key}: {shown}")
        finally:
            server.terminate()
            server.wait(timeout=60)
        report["load_average"] = os.getloadavg()
        print(f"load average {report['load_average'][0]:.2f} (cores: {os.cpu_count()})")
        if args.json:
            args.json.write_text(json.dumps(report, indent=2, default=str))
    finally:
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
