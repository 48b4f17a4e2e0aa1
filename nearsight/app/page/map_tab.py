"""The page's Map tab: the gallery's embeddings in 2-D, coloured by class, with leave-one-out
failures ringed in black; clicking a point queries that item. Beside it, Recall@1 per class
(leave-one-out), worst classes first.

The projection is PCA (always: two principal axes of the stored embeddings, by SVD) or UMAP
when the optional ``umap-learn`` package is installed (``pip install nearsight[map]``). The
map is drawn on the server as a PNG (Pillow): the page's gr.Image reports a click as the pixel
it hit, and the nearest drawn point within :data:`CLICK_RADIUS` pixels is queried. At most
:data:`MAP_MAX_POINTS` items are drawn (a fixed random sample past that).
"""

from __future__ import annotations

import colorsys
import html
import importlib.util
import threading
from collections import Counter
from dataclasses import dataclass
from typing import Any

import gradio as gr
import numpy as np
from PIL import Image, ImageDraw

from nearsight.app.page.view import GalleryView

MAP_WIDTH, MAP_HEIGHT = 720, 520
MAP_MARGIN = 24
POINT_RADIUS = 4
CLICK_RADIUS = 14  # pixels: a click this close to a point queries it
MAP_MAX_POINTS = 5000
RECALL_ROWS = 40  # classes in the Recall@1 chart (worst first)
PCA, UMAP = "PCA", "UMAP"
UNLABELLED_COLOUR = (156, 163, 175)
FAILURE_RING = (17, 17, 17)


def umap_available() -> bool:
    return importlib.util.find_spec("umap") is not None


def methods() -> list[str]:
    return [PCA, UMAP] if umap_available() else [PCA]


@dataclass
class EmbeddingMap:
    method: str
    ids: np.ndarray  # the drawn items
    labels: np.ndarray
    failed: np.ndarray  # bool: the item's leave-one-out top-1 is of another class
    pixels: np.ndarray  # [n, 2] point centres in the image
    image: Image.Image

    def nearest(self, x: float, y: float) -> int | None:
        """The id of the drawn point nearest to pixel (x, y), if one is within reach."""
        if not len(self.ids):
            return None
        gaps = np.hypot(self.pixels[:, 0] - x, self.pixels[:, 1] - y)
        best = int(np.argmin(gaps))
        return int(self.ids[best]) if gaps[best] <= CLICK_RADIUS else None

    def pixel_of(self, item_id: int) -> tuple[int, int]:
        row = int(np.flatnonzero(self.ids == item_id)[0])
        return int(round(self.pixels[row, 0])), int(round(self.pixels[row, 1]))


def project(vectors: np.ndarray, method: str = PCA, seed: int = 0) -> np.ndarray:
    """[n, 2] coordinates of ``vectors`` by PCA or UMAP."""
    data = np.asarray(vectors, dtype=np.float64)
    if len(data) < 3:
        return np.zeros((len(data), 2)) + np.arange(len(data))[:, None]
    if method == UMAP:
        import umap  # optional extra: nearsight[map]

        neighbours = max(2, min(15, len(data) - 1))
        reducer = umap.UMAP(n_components=2, n_neighbors=neighbours, random_state=seed)
        return np.asarray(reducer.fit_transform(data), dtype=np.float64)
    centred = data - data.mean(axis=0)
    _, _, axes = np.linalg.svd(centred, full_matrices=False)
    return centred @ axes[:2].T


def class_colour(label: int) -> tuple[int, int, int]:
    """A distinct colour per class (golden-ratio hues), grey when unlabelled."""
    if label < 0:
        return UNLABELLED_COLOUR
    hue = (label * 0.618033988749895) % 1.0
    red, green, blue = colorsys.hsv_to_rgb(hue, 0.75, 0.85)
    return int(red * 255), int(green * 255), int(blue * 255)


def build_map(view: GalleryView, method: str = PCA) -> EmbeddingMap:
    ids = np.asarray(view.ids)
    rows = np.arange(len(ids))
    if len(rows) > MAP_MAX_POINTS:
        rows = np.sort(np.random.default_rng(0).choice(len(rows), MAP_MAX_POINTS, replace=False))
    vectors = view.gallery.vectors_of(ids[rows])
    coords = project(vectors, method)
    span = np.ptp(coords, axis=0)
    span[span == 0] = 1.0
    unit = (coords - coords.min(axis=0)) / span
    inner = np.array([MAP_WIDTH - 2 * MAP_MARGIN, MAP_HEIGHT - 2 * MAP_MARGIN], dtype=np.float64)
    pixels = MAP_MARGIN + unit * inner
    pixels[:, 1] = MAP_HEIGHT - pixels[:, 1]  # y grows upwards on a plot
    analysis = view.analysis()
    failed_ids = {f.id for f in analysis.failures}
    drawn_ids = ids[rows]
    failed = np.fromiter((int(i) in failed_ids for i in drawn_ids), bool, count=len(rows))
    labels = np.asarray(view.labels)[rows]
    image = _draw(pixels, labels, failed, f"{method} of {len(rows)} of {len(ids)} items")
    return EmbeddingMap(method, drawn_ids, labels, failed, pixels, image)


def _draw(pixels: np.ndarray, labels: np.ndarray, failed: np.ndarray, caption: str) -> Image.Image:
    image = Image.new("RGB", (MAP_WIDTH, MAP_HEIGHT), (255, 255, 255))
    draw = ImageDraw.Draw(image)
    draw.rectangle([1, 1, MAP_WIDTH - 2, MAP_HEIGHT - 2], outline=(210, 210, 210))
    draw.text((8, 6), caption + "; black ring: leave-one-out failure", fill=(80, 80, 80))
    order = np.argsort(failed, kind="stable")  # failures on top
    r = POINT_RADIUS
    for row in order:
        x, y = pixels[row]
        box = [x - r, y - r, x + r, y + r]
        if failed[row]:
            draw.ellipse(box, fill=class_colour(int(labels[row])), outline=FAILURE_RING, width=2)
        else:
            draw.ellipse(box, fill=class_colour(int(labels[row])))
    return image


def recall_chart_html(view: GalleryView) -> str:
    """Recall@1 per class (leave-one-out), worst first, as HTML bars."""
    analysis = view.analysis()
    if analysis.error:
        return _note(f"Recall@1 per class: not available ({analysis.error})")
    labels = np.asarray(view.labels)
    counts = Counter(int(label) for label in labels[labels >= 0])
    misses = Counter(int(f.label) for f in analysis.failures if f.label is not None)
    recalls = sorted(
        ((1.0 - misses[label] / count, view.class_name(label), label, count)
         for label, count in counts.items()),
        key=lambda row: (row[0], row[1]),
    )  # fmt: skip
    parts = [
        '<div class="ns-recall" style="font-size:12px">',
        f"<strong>Recall@1 per class</strong> (leave-one-out, worst first; {len(recalls)} classes)",
    ]
    for recall, name, label, count in recalls[:RECALL_ROWS]:
        colour = "#dc2626" if recall < 0.5 else "#f59e0b" if recall < 0.8 else "#16a34a"
        parts.append(
            f'<div class="ns-recall-row" data-label="{label}" data-recall="{recall:.4f}" '
            'style="display:flex;align-items:center;gap:6px;margin:2px 0">'
            f'<span style="width:120px;overflow:hidden;text-overflow:ellipsis;white-space:nowrap"'
            f' title="{html.escape(name, quote=True)}">{html.escape(name)}</span>'
            '<span style="flex:1;background:#e5e7eb;height:10px">'
            f'<span style="display:block;height:10px;width:{recall * 100:.1f}%;'
            f'background:{colour}"></span></span>'
            f'<span style="width:80px">{recall:.2f} ({count})</span></div>'
        )
    if len(recalls) > RECALL_ROWS:
        parts.append(f"<div>... and {len(recalls) - RECALL_ROWS} better classes</div>")
    parts.append("</div>")
    return "".join(parts)


LEGEND_CLASSES = 24  # classes named in the legend (the others share "... more classes")


def legend_html(view: GalleryView) -> str:
    """What the map's marks mean: each class's colour (the first few classes), grey for
    unlabelled items, a black ring for a leave-one-out failure."""
    e = html.escape
    labels = sorted({int(label) for label in np.asarray(view.labels)})
    entries = []
    for label in labels[:LEGEND_CLASSES]:
        red, green, blue = class_colour(label)
        name = view.class_name(label) if label >= 0 else "unlabelled"
        entries.append(
            f'<span class="ns-legend-class" data-label="{label}" style="display:inline-flex;'
            'align-items:center;gap:4px;margin-right:10px">'
            f'<span style="width:10px;height:10px;border-radius:50%;'
            f'background:rgb({red},{green},{blue})"></span>{e(name)}</span>'
        )
    if len(labels) > LEGEND_CLASSES:
        entries.append(f"<span>... {len(labels) - LEGEND_CLASSES} more classes</span>")
    ring = (
        '<span class="ns-legend-failure" style="display:inline-flex;align-items:center;gap:4px">'
        '<span style="width:8px;height:8px;border-radius:50%;border:2px solid #000"></span>'
        "leave-one-out failure (its nearest item is of another class)</span>"
    )
    return (
        '<div class="ns-legend" style="font-size:12px;line-height:1.8">'
        f"<strong>Legend</strong>: colour = class; {ring}<br>{''.join(entries)}</div>"
    )


def _note(text: str) -> str:
    return f'<div class="ns-message" style="padding:12px;opacity:0.8">{html.escape(text)}</div>'


class MapTab:
    """The Map tab's maps, computed once per gallery and projection."""

    def __init__(self, views: dict[str, GalleryView]):
        self.views = views
        self._maps: dict[tuple[str, str], EmbeddingMap] = {}
        self._lock = threading.Lock()

    def map(self, gallery: str, method: str) -> EmbeddingMap:
        method = method if method in methods() else PCA
        key = (gallery, method)
        with self._lock:
            if key not in self._maps:
                self._maps[key] = build_map(self.views[gallery], method)
            return self._maps[key]

    def outputs(self, gallery: str, method: str) -> tuple[Any, str, str]:
        view = self.views[gallery]
        return self.map(view.name, method).image, legend_html(view), recall_chart_html(view)

    def clicked_item(self, gallery: str, method: str, index: Any) -> int | None:
        """The item at a clicked pixel ``index`` = [x, y], or None."""
        if not isinstance(index, list | tuple) or len(index) != 2:
            return None
        try:
            x, y = float(index[0]), float(index[1])
        except (TypeError, ValueError):
            return None
        return self.map(gallery, method).nearest(x, y)


# -- the tab's layout and events (called inside the page's gr.Blocks) ---------------------------


@dataclass
class MapParts:
    method: Any  # gr.Radio
    image: Any  # gr.Image
    legend: Any  # gr.HTML
    chart: Any  # gr.HTML
    results: Any  # gr.HTML

    @property
    def outputs(self) -> list[Any]:
        return [self.image, self.legend, self.chart]


def map_tab_layout() -> MapParts:
    """The Map tab (inside ``gr.Tabs``)."""
    with gr.Tab("Map", id="map"):
        method = gr.Radio(
            choices=methods(),
            value=PCA,
            label="Projection (UMAP needs the optional umap-learn package: nearsight[map])",
            elem_id="ns-map-method",
        )
        with gr.Row():
            with gr.Column(scale=3):
                image = gr.Image(
                    label="Embeddings in 2-D, coloured by class (click a point to query it)",
                    type="pil",
                    format="png",
                    interactive=False,
                    buttons=[],
                    elem_id="ns-map",
                )
                legend = gr.HTML(elem_id="ns-map-legend")
            with gr.Column(scale=2):
                chart = gr.HTML(_note("Computing Recall@1 per class..."), elem_id="ns-recall")
        results = gr.HTML(
            _note("Click a point of the map to see its grid."), elem_id="ns-map-results"
        )
    return MapParts(method, image, legend, chart, results)


def wire_map_tab(
    parts: MapParts, maps: MapTab, page: Any, gallery_choice: Any, k_slider: Any, private: dict
) -> None:
    """Redraw on a new projection; a click on the map shows that item's grid below it."""
    parts.method.change(maps.outputs, [gallery_choice, parts.method], parts.outputs, **private)

    def clicked(gallery: str, method: str, k: Any, event: gr.SelectData) -> str:
        item = maps.clicked_item(gallery, method, event.index)
        if item is None:
            return _note("No point there: click on a point of the map.")
        return page.item_grid(gallery, item, k)[0]

    parts.image.select(
        clicked,
        [gallery_choice, parts.method, k_slider],
        parts.results,
        api_name="map_clicked",
        **private,
    )
