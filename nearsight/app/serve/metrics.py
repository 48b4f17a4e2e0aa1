"""Prometheus metrics of a running server (prometheus-client), served at ``/metrics``:
requests by route and status, request latency, images waiting for the model, and each
gallery's size and generation. One registry per server, so two servers in one process (the
tests) never share counters."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST

# a fixed set of route labels: a label per raw path would grow without bound
ROUTES = (
    "/api/search",
    "/api/items",
    "/api/health",
    "/api/docs",
    "/api/openapi.json",
    "/gradio_api/upload",
    "/gradio_api/queue",
    "/gradio_api/call",
    "/gradio_api",
    "/metrics",
    "/login",
)
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


def route_label(path: str) -> str:
    if path in ("", "/"):
        return "/"
    for route in ROUTES:
        if path == route or path.startswith(route + "/") or path.startswith(route + "?"):
            return route
    return "other"


class ServerMetrics:
    """Counters and histograms the guard updates, gauges read when scraped."""

    def __init__(
        self,
        galleries: Callable[[], Iterable[tuple[str, int, int]]],
        waiting: Callable[[], int],
    ):
        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter(
            "nearsight_requests", "HTTP requests by route and status", ["route", "status"],
            registry=self.registry,
        )  # fmt: skip
        self.latency = Histogram(
            "nearsight_request_seconds", "HTTP request latency by route", ["route"],
            buckets=LATENCY_BUCKETS, registry=self.registry,
        )  # fmt: skip
        self.registry.register(_Gauges(galleries, waiting))

    def observe(self, path: str, status: int, seconds: float) -> None:
        route = route_label(path)
        self.requests.labels(route, str(status)).inc()
        self.latency.labels(route).observe(seconds)

    def render(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


class _Gauges:
    """Values read at scrape time: the galleries' sizes and the model queue."""

    def __init__(self, galleries, waiting):
        self._galleries = galleries
        self._waiting = waiting

    def collect(self):
        items = GaugeMetricFamily(
            "nearsight_gallery_items", "items in a gallery", labels=["gallery"]
        )
        generation = GaugeMetricFamily(
            "nearsight_gallery_generation", "reloads of a live gallery", labels=["gallery"]
        )
        for name, count, reloads in self._galleries():
            items.add_metric([name], count)
            generation.add_metric([name], reloads)
        yield items
        yield generation
        yield GaugeMetricFamily(
            "nearsight_embed_queue", "images waiting for the model", value=self._waiting()
        )

    def describe(self):
        return []
