"""The rounds in turns that bench/app_latency.py (``in_turns``) and bench/app_latency_paired.py
share: one query's paths (the model's own decode, embed and search in this process; REST by
httpx or by the standard library), timed each once a round in rotating order, and the report
of their medians against the goals. Not a script: both benches import it.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np

MIME = {".png": "image/png", ".jpg": "image/jpeg"}
BENCH_KEY = "bench-key"  # the server runs as it would when exposed: with an API key
GAP_MS = 50.0  # idle time before each timed call (app_latency_paired's --gap-ms)


def summary(seconds: list[float]) -> dict:
    values = np.asarray(seconds) * 1000
    return {
        "n": len(values),
        "p50_ms": float(np.percentile(values, 50)),
        "p95_ms": float(np.percentile(values, 95)),
        "mean_ms": float(values.mean()),
    }


def direct_paths(gallery: Path, k: int):
    """Callables: one query's file bytes -> seconds for (decode, embed, search), in this
    process (decoded here, as trusted: the model's own cost, no box)."""
    from nearsight.data.images import load_image_sized
    from nearsight.search.served import ServedGallery, open_served

    (view,) = open_served([gallery], device="cpu", kind=ServedGallery)

    def run(data: bytes) -> tuple[float, float, float]:
        start = time.perf_counter()
        picture, _ = load_image_sized(data, "query", view.embedder.resize)
        decoded = time.perf_counter()
        vector = view.embedder.embed_images([picture])[0]
        embedded = time.perf_counter()
        found = view.search_one(vector, k)
        assert len(found) == k
        return decoded - start, embedded - decoded, time.perf_counter() - embedded

    return view, run


def rest_path(url: str, k: int, name: str):
    import httpx

    client = httpx.Client(timeout=120, headers={"X-API-Key": BENCH_KEY})
    endpoint = url.rstrip("/") + "/api/search"
    mime = MIME[Path(name).suffix]

    def run(data: bytes) -> float:
        start = time.perf_counter()
        answer = client.post(endpoint, files={"image": (name, data, mime)},
                             data={"k": str(k)})  # fmt: skip
        answer.raise_for_status()
        assert len(answer.json()["neighbours"]) == k
        return time.perf_counter() - start

    return client, run


def lean_rest_path(url: str, k: int, name: str):
    """``rest_path``'s request from the standard library's ``http.client``, one kept-alive
    connection, the multipart body joined per call: httpx's own work (its multipart encoder,
    its transport layers: about 1.7 ms a round trip) is the client's, not the server's."""
    import http.client
    from urllib.parse import urlsplit

    where = urlsplit(url)
    connection = http.client.HTTPConnection(where.hostname, where.port, timeout=120)
    boundary = "nearsight-bench-boundary"
    head = (f'--{boundary}\r\nContent-Disposition: form-data; name="k"\r\n\r\n{k}\r\n'
            f'--{boundary}\r\nContent-Disposition: form-data; name="image"; '
            f'filename="{name}"\r\nContent-Type: {MIME[Path(name).suffix]}\r\n'
            '\r\n').encode()  # fmt: skip
    headers = {"X-API-Key": BENCH_KEY,
               "Content-Type": f"multipart/form-data; boundary={boundary}"}  # fmt: skip

    def run(data: bytes) -> float:
        start = time.perf_counter()
        body = b"".join((head, data, f"\r\n--{boundary}--\r\n".encode()))
        connection.request("POST", "/api/search", body=body, headers=headers)
        answer = connection.getresponse()
        payload = answer.read()
        if answer.status != 200:
            raise SystemExit(f"the server answered {answer.status}: {payload[:200]!r}")
        assert len(json.loads(payload)["neighbours"]) == k
        return time.perf_counter() - start

    return connection, run


def measure(
    payloads: list[bytes], direct, rests: dict, rounds: int, gap_s: float
) -> dict[str, list[float]]:
    """``rounds`` rounds, each path once per round with the same query, order rotating."""
    names = ["direct", *rests]
    times: dict[str, list[float]] = {"decode": [], "embed": [], "search": []}
    times.update({name: [] for name in rests})
    for data in payloads[:3]:  # warm-up: every path, a few queries
        direct(data)
        for run in rests.values():
            run(data)
    for r in range(rounds):
        data = payloads[r % len(payloads)]
        shift = r % len(names)
        for name in names[shift:] + names[:shift]:
            time.sleep(gap_s)  # the previous path's threads stop spinning: each call alone
            if name == "direct":
                for part, seconds in zip(("decode", "embed", "search"), direct(data), strict=True):
                    times[part].append(seconds)
            else:
                times[name].append(rests[name](data))
    return times


def report_of(times: dict[str, list[float]]) -> dict:
    seconds = {name: np.asarray(values) for name, values in times.items()}
    seconds["embed+search"] = seconds["embed"] + seconds["search"]
    seconds["decode+embed+search"] = seconds["decode"] + seconds["embed+search"]
    report: dict = {"paths": {n: summary(list(v)) for n, v in seconds.items()}}
    p50 = {name: report["paths"][name]["p50_ms"] for name in seconds}
    goals: dict = {}
    for yardstick in ("embed+search", "decode+embed+search"):
        goals[f"rest_over_{yardstick}_p50"] = p50["rest"] / p50[yardstick]
        goals[f"rest_over_{yardstick}_round_median"] = float(
            np.median(seconds["rest"] / seconds[yardstick])
        )
    goals["rest_goal_met (<= 1.2 x embed+search)"] = goals["rest_over_embed+search_p50"] <= 1.2
    if "rest_lean" in seconds:  # the same server, a lighter client
        goals["rest_lean_over_embed+search_p50"] = p50["rest_lean"] / p50["embed+search"]
        goals["rest_lean_over_embed+search_round_median"] = float(
            np.median(seconds["rest_lean"] / seconds["embed+search"])
        )
        goals["rest_lean_goal_met (<= 1.2 x embed+search)"] = (
            goals["rest_lean_over_embed+search_p50"] <= 1.2
        )
    if "before" in seconds:
        goals["rest_over_before_p50"] = p50["rest"] / p50["before"]
        goals["rest_over_before_round_median"] = float(
            np.median(seconds["rest"] / seconds["before"])
        )
        goals["before_goal_met (<= 1.1 x before)"] = goals["rest_over_before_p50"] <= 1.1
    report["goals"] = goals
    return report
