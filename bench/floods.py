"""A victim's searches under the floods of issue 51, measured as an attacker would send them.

    python bench/floods.py [--items 3000] [--tries 9] [--pause 0.5] [--json FILE] [--smoke]

Setup: a 32-px ResNet-18 (8-d, random) exported to ONNX and a flat gallery of ``--items``
random unit vectors with a ``shop`` column (`nearsight index import`); `nearsight serve` in a
process of its own, default settings but ``--write-timeout`` (10 s here). The floods run in a
process of their own too (their threads do not share the victim's interpreter).

The victim (127.0.250.2) measures, idle and under each flood, the p50 of ``--tries`` of each
of its searches, ``--pause`` seconds apart (0.5 s: a user who reads an answer before asking
again; with 0 it asks back to back, exactly like each of the 80 flooders, and a fair gate can
give it no more than their share): plain (an item, k 8), filtered (``shop=s1``), re-ranked (``kreciprocal``) and
an upload (a 32-px PNG). The floods:

- ``networks``: 80 identities (127.0.N.2, one /24 each), one connection each, looping a
  filtered search (issue 51 item 5);
- ``connections``: 4 identities x 32 connections looping k=1000 plain searches (item 6);
- ``bodies``: four 9.3 MB JSON bodies (500,000 extra keys) posted at once, again and again
  (item 1): the longest wait of ``/api/health`` and of a plain search meanwhile;
- ``pipelining``: 8 identities x 28 connections that pipeline 200 ``GET /api/health`` each
  and never read (item 7): the seconds until the server closes each.

Goals (issue 51): under each of the first two floods, each search's p50 within 3 x its idle
p50 + 100 ms (printed as the ratio to that bound: at most 1 meets it); no wait over 1 s during
``bodies``; every pipelining connection closed within the write deadline. ``--smoke``: 300
items, 3 tries, 8 flooding networks, 2 x 4 connections, one round of bodies, 8 pipelining
connections, floods of 0.5 s before the victim's searches (1 s of bodies) and a 2 s write
deadline. A script, not a test; run it under ``flock /tmp/nearsight-bench.lock`` on a
shared machine, and note the load average (written to the results).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import select
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling bench modules
from served_bench import random_gallery, served  # noqa: E402

VICTIM = "127.0.250.2"
WRITE_TIMEOUT_S = 10.0
SHOPS = 4
KINDS = ("plain", "filtered", "reranked", "upload")


def photo() -> bytes:
    from PIL import Image

    pixels = np.random.default_rng(7).integers(0, 255, (40, 32, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="PNG")
    return out.getvalue()


def victim_search(client: httpx.Client, url: str, kind: str, n: int, image: bytes) -> float:
    """Seconds of one of the victim's searches (an error if it is not answered 200)."""
    started = time.perf_counter()
    if kind == "upload":
        files = {"image": ("q.png", image, "image/png")}
        answer = client.post(f"{url}/api/search", files=files, data={"k": "8"})
    else:
        body: dict = {"id": n, "k": 8}
        if kind == "filtered":
            body["filter"] = "shop=s1"
        elif kind == "reranked":
            body["rerank"] = "kreciprocal"
        answer = client.post(f"{url}/api/search", json=body)
    seconds = time.perf_counter() - started
    if answer.status_code != 200:
        raise RuntimeError(f"victim's {kind} search: {answer.status_code} {answer.text[:200]}")
    return seconds


def victim_p50s(url: str, tries: int, items: int, pause_s: float = 0.0) -> dict[str, float]:
    """The p50 of ``tries`` of each of the victim's searches, ``pause_s`` apart (untimed)."""
    image = photo()
    transport = httpx.HTTPTransport(local_address=VICTIM, retries=1)
    out = {}
    with httpx.Client(timeout=300, transport=transport) as client:
        for kind in KINDS:
            seconds = []
            for n in range(tries):
                time.sleep(pause_s)
                seconds.append(victim_search(client, url, kind, (37 * n) % items, image))
            out[kind] = round(float(np.median(seconds)), 4)
    return out


# -- the floods (in a process of their own: python bench/floods.py --flood KIND URL N C) ----


def flood_main(kind: str, url: str, identities: int, connections: int, items: int) -> None:
    """Loop ``kind``'s request from ``identities`` x ``connections`` clients until stdin
    closes; then print a JSON summary of the answers' statuses."""
    stop = threading.Event()
    statuses: dict[str, int] = {}
    lock = threading.Lock()
    big = None
    if kind == "bodies":
        extra = ", ".join(f'"x{i:06d}": 0' for i in range(500_000))
        big = ('{"id": 1, "k": 8, ' + extra + "}").encode()

    def loop(seed: int, address: str) -> None:
        transport = httpx.HTTPTransport(local_address=address)
        with httpx.Client(timeout=300, transport=transport) as client:
            for n in range(1_000_000):
                if stop.is_set():
                    return
                try:
                    if kind == "bodies":
                        answer = client.post(f"{url}/api/search", content=big,
                                             headers={"content-type": "application/json"})  # fmt: skip
                    elif kind == "networks":
                        answer = client.post(f"{url}/api/search", json={
                            "id": (seed * 101 + n) % items, "k": 8, "filter": "shop=s2"})  # fmt: skip
                    else:
                        answer = client.post(f"{url}/api/search",
                                             json={"id": (seed * 101 + n) % items, "k": 1000})  # fmt: skip
                    status = str(answer.status_code)
                except httpx.TransportError as error:
                    status = type(error).__name__
                with lock:
                    statuses[status] = statuses.get(status, 0) + 1

    threads = [threading.Thread(target=loop, args=(n, f"127.0.{10 + n}.2"), daemon=True)
               for n in range(identities) for _ in range(connections)]  # fmt: skip
    for thread in threads:
        thread.start()
    print("started", flush=True)
    sys.stdin.read()  # until the parent closes it
    stop.set()
    for thread in threads:
        thread.join(60)
    print(json.dumps(statuses), flush=True)


@contextlib.contextmanager
def flooding(kind: str, url: str, identities: int, connections: int, items: int,
             fill_s: float = 3.0):  # fmt: skip
    """The flood running in its own process, ``fill_s`` after it started (the flood fills the
    queues); yields a dict that holds its statuses after."""
    command = [sys.executable, __file__, "--flood", kind, url, str(identities),
               str(connections), str(items)]  # fmt: skip
    process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None and process.stdin is not None
    assert process.stdout.readline().strip() == "started"
    summary: dict = {}
    try:
        time.sleep(fill_s)
        yield summary
    finally:
        process.stdin.close()
        summary.update(json.loads(process.stdout.readline() or "{}"))
        process.wait(120)


def longest_waits(url: str, seconds: float) -> dict[str, float]:
    """The longest wait of /api/health and of a plain search, each asked again and again for
    ``seconds``."""
    longest = {"health": 0.0, "plain": 0.0}
    transport = httpx.HTTPTransport(local_address=VICTIM, retries=1)
    deadline = time.monotonic() + seconds
    with httpx.Client(timeout=300, transport=transport) as client:
        while time.monotonic() < deadline:
            started = time.perf_counter()
            client.get(f"{url}/api/health")
            longest["health"] = max(longest["health"], time.perf_counter() - started)
            started = time.perf_counter()
            client.post(f"{url}/api/search", json={"id": 1, "k": 8})
            longest["plain"] = max(longest["plain"], time.perf_counter() - started)
    return {name: round(value, 3) for name, value in longest.items()}


def pipelining(url: str, identities: int, connections: int,
               write_timeout_s: float = WRITE_TIMEOUT_S, waits_s: float = 5.0) -> dict:  # fmt: skip
    """Connections that pipeline 200 GET /api/health and never read: the seconds until the
    server (its ``--write-timeout`` ``write_timeout_s``) closes each (watched with poll,
    nothing read), and the longest waits over ``waits_s`` meanwhile."""
    host, port = url.rsplit("/", 1)[-1].split(":")
    request = b"GET /api/health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n" * 200
    socks, opened = [], {}
    watcher = select.poll()
    for n in range(identities):
        for _ in range(connections):
            sock = socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 2048)
            sock.bind((f"127.0.{10 + n}.3", 0))
            sock.connect((host, int(port)))
            sock.setblocking(False)
            with contextlib.suppress(BlockingIOError):
                sock.send(request)
            opened[sock.fileno()] = time.monotonic()
            watcher.register(sock, select.POLLRDHUP | select.POLLHUP | select.POLLERR)
            socks.append(sock)
    closed: dict[int, float] = {}
    waits: dict = {}
    waiter = threading.Thread(target=lambda: waits.update(longest_waits(url, waits_s)))
    waiter.start()
    deadline = time.monotonic() + 3 * write_timeout_s
    while len(closed) < len(socks) and time.monotonic() < deadline:
        for fd, _ in watcher.poll(200):
            if fd not in closed:
                closed[fd] = time.monotonic() - opened[fd]
                watcher.unregister(fd)
    waiter.join()
    for sock in socks:
        sock.close()
    seconds = sorted(closed.values())
    return {
        "connections": len(socks),
        "closed": len(closed),
        "close_p50_s": round(float(np.median(seconds)), 3) if seconds else None,
        "close_max_s": round(seconds[-1], 3) if seconds else None,
        "write_timeout_s": write_timeout_s,
        "all_closed_within_write_deadline": len(closed) == len(socks)
        and seconds[-1] <= write_timeout_s,
        "longest_wait_meanwhile_s": waits,
    }


def ratios(idle: dict[str, float], flooded: dict[str, float]) -> dict[str, float]:
    """Each search's p50 under a flood over its bound, 3 x idle p50 + 100 ms (<= 1: met)."""
    return {kind: round(flooded[kind] / (3 * idle[kind] + 0.1), 3) for kind in KINDS}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=3000)
    parser.add_argument("--tries", type=int, default=9)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--pause", type=float, default=0.5,
                        help="seconds the victim waits between its searches (a user reading "
                             "an answer); 0: back to back, like each flooder")  # fmt: skip
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args(argv)
    sizes = {"networks": (80, 1), "connections": (4, 32), "bodies": (4, 1), "pipelining": (8, 28)}
    rounds_s, fill_s, write_timeout_s, waits_s = 20.0, 3.0, WRITE_TIMEOUT_S, 5.0
    if args.smoke:
        args.items, args.tries, args.pause = 300, 3, min(args.pause, 0.05)
        sizes = {"networks": (8, 1), "connections": (2, 4), "bodies": (4, 1),
                 "pipelining": (2, 4)}  # fmt: skip
        # it runs, not how long the floods last: short floods, a short write deadline
        rounds_s, fill_s, write_timeout_s, waits_s = 1.0, 0.5, 2.0, 1.0
    report: dict = {"load_before": os.getloadavg(), "sizes": sizes, "victim_pause_s": args.pause}
    with tempfile.TemporaryDirectory() as folder:
        gallery = random_gallery(Path(folder), args.items, SHOPS)
        with served(gallery, ["--write-timeout", str(write_timeout_s)]) as url:
            victim_p50s(url, 2, args.items)  # warm: the model, the re-ranker, the decoder
            idle = victim_p50s(url, args.tries, args.items, args.pause)
            report["idle_p50_s"] = idle
            print("idle p50 s", json.dumps(idle), flush=True)
            for kind in ("networks", "connections"):
                with flooding(kind, url, *sizes[kind], args.items, fill_s) as statuses:
                    flooded = victim_p50s(url, args.tries, args.items, args.pause)
                report[kind] = {"p50_s": flooded, "ratio_to_goal": ratios(idle, flooded),
                                "flood_statuses": statuses}  # fmt: skip
                print(
                    f"{kind}: p50 s {json.dumps(flooded)}; ratio to 3 x idle + 100 ms "
                    f"{json.dumps(report[kind]['ratio_to_goal'])}",
                    flush=True,
                )
            with flooding("bodies", url, *sizes["bodies"], args.items, fill_s) as statuses:
                waits = longest_waits(url, rounds_s)
            report["bodies"] = {"longest_wait_s": waits, "flood_statuses": statuses,
                                "goal_met": max(waits.values()) <= 1.0}  # fmt: skip
            print(f"bodies: longest wait s {json.dumps(waits)}", flush=True)
            report["pipelining"] = pipelining(url, *sizes["pipelining"], write_timeout_s, waits_s)
            print(f"pipelining: {json.dumps(report['pipelining'])}", flush=True)
    report["load_after"] = os.getloadavg()
    print(json.dumps(report, indent=1))
    if args.json:
        args.json.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--flood":
        kind, url, identities, connections, items = sys.argv[2:7]
        flood_main(kind, url, int(identities), int(connections), int(items))
        sys.exit(0)
    sys.exit(main())
