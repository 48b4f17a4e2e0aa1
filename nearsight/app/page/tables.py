"""The page's tables and markdown, made from a :class:`~nearsight.app.page.view.GalleryView` and
its leave-one-out analysis: plain data for gr.Dataframe / gr.LinePlot and markdown text."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Literal

from nearsight.app.page.view import GalleryView
from nearsight.index.gallery.summary import gallery_summary
from nearsight.models.spec import ModelSpec
from nearsight.search.analysis import Analysis, Failure
from nearsight.search.rerank.changes import Change

if TYPE_CHECKING:
    import pandas as pd

FAILURE_ROWS = 1000  # rows of the failure table sent to the browser (worst first)
THUMBNAIL_ROWS = 50  # of those, the first rows shown with thumbnails
FAILURE_COLUMNS = [
    "id",
    "image",
    "key",
    "class",
    "top-1 id",
    "top-1 image",
    "top-1 key",
    "top-1 class",
    "top-1 distance",
    "nearest same-class distance",
    "margin",
]
# how gr.Dataframe shows a column (its own Literal, so the checker sees a valid kind)
ColumnType = Literal["str", "number", "bool", "date", "markdown", "html"]
FAILURE_TYPES: list[ColumnType] = ["number", "markdown", "str", "str", "number", "markdown",
                                   "str", "str", "number", "number", "number"]  # fmt: skip
TABLE_THUMBNAIL_PX = 56
PAIR_COLUMNS = ["class a", "class b", "failures"]


def gallery_header(view: GalleryView) -> str:
    facts = gallery_summary(view.gallery)
    key = f", key `{facts['key_column']}`" if facts["key_column"] else ""
    return (
        f"**{view.name}**: {facts['items']} items ({facts['labelled']} labelled), "
        f"{facts['classes']} classes{key}, model `{Path(str(view.embedder.path)).name}`"
    )


def summary_markdown(view: GalleryView, show_paths: bool = False) -> str:
    """The gallery's facts; folders and the model by name only unless ``show_paths`` (a
    visitor has no use for the server's absolute paths)."""
    facts = gallery_summary(view.gallery)  # the facts of index info and /api/galleries
    folder = str(view.gallery.path) if show_paths else view.gallery.path.name
    model = str(view.embedder.path) if show_paths else Path(view.embedder.path).name
    columns = ", ".join(f"{name} ({kind})" for name, kind in facts["columns"].items())
    lines = [
        f"### {view.name}",
        f"- folder: `{folder}`",
        f"- items: {facts['items']} ({facts['labelled']} labelled), classes: {facts['classes']}",
        f"- model: `{model}` (sha256 {facts['model_sha256'][:12]}..), "
        f"{spec_line(view.embedder.spec)}",
        f"- index: {facts['index_type']} ({facts['metric']}, dim {facts['dim']}), "
        f"built {facts['created'] or '?'}",
        f"- key column: {facts['key_column'] or 'none'}; columns: {columns or 'none'}",
    ]
    if facts["dataset"]:
        lines.append(f"- dataset: {facts['dataset']}, split: {facts['split'] or '?'}")
    analysis = view.analysis()
    if analysis.error:
        lines.append(f"- leave-one-out evaluation: not available ({analysis.error})")
    else:
        lines.append(
            "- leave-one-out evaluation (the papers' protocol): every labelled item queries "
            "all the others, from the stored embeddings"
        )
        which = "a random sample of" if analysis.pairs_sampled else "all"
        lines.append(
            f"- pair distances below: {which} {analysis.matching_pairs} matching and "
            f"{analysis.non_matching_pairs} non-matching pairs"
        )
    return "\n".join(lines)


def spec_line(spec: ModelSpec) -> str:
    """A model spec in one line of markdown: the width of the vectors the gallery holds (and
    which heads make it), and the test-time preprocessing the embedder really applies."""
    arch = f"{spec.arch}, " if spec.arch else ""
    size = (
        f"input: short side resized to {spec.test_resize} px, centre crop "
        f"{spec.image_size} x {spec.image_size}"
    )
    if spec.foreign:  # exported elsewhere: no pooling of ours, its own input statistics
        mean, std = (" ".join(f"{v:g}" for v in values) for values in (spec.mean, spec.std))
        return (
            f"ONNX model exported elsewhere, dim {spec.dim}, {size}, input {spec.input_name} "
            f"(mean {mean}, std {std}), output {spec.output_name}"
        )
    return f"{arch}dim {spec.output_dim} {_embedding(spec)}, {size}, {spec.pooling} pooling"


def _embedding(spec: ModelSpec) -> str:
    """Which head(s) the served vector comes from: "(the layer4 head)", or for the concat
    embedding "(3 heads x 128: layer2, layer3, layer4, concatenated)"."""
    if spec.embedding == "concat" and len(spec.heads) > 1:
        heads = ", ".join(spec.heads)
        return f"({len(spec.heads)} heads x {spec.dim}: {heads}, concatenated)"
    if len(spec.heads) > 1:
        return f"(the {spec.heads[-1]} head of {len(spec.heads)}: the last embedding)"
    return f"(the {spec.heads[-1]} head)"


def metrics_frame(metrics: dict | None) -> pd.DataFrame:
    import pandas as pd  # the page's tables only (gradio loads it anyway)

    if not metrics:
        return pd.DataFrame(columns=["metric", "value"])
    rows = [
        (name, round(float(value), 4) if name != "queries" else int(value))
        for name, value in metrics.items()
    ]
    return pd.DataFrame(rows, columns=["metric", "value"])


def distance_frame(analysis: Analysis) -> pd.DataFrame:
    import pandas as pd

    if analysis.bin_edges is None:
        return pd.DataFrame(columns=["distance", "density", "pairs"])
    centres = (analysis.bin_edges[:-1] + analysis.bin_edges[1:]) / 2
    frames = [
        pd.DataFrame({"distance": centres, "density": density, "pairs": kind})
        for kind, density in (
            ("matching", analysis.matching_density),
            ("non-matching", analysis.non_matching_density),
        )
    ]
    return pd.concat(frames, ignore_index=True)


def failure_frame(view: GalleryView, failures: list[Failure]) -> pd.DataFrame:
    """The failures with the items' keys, and thumbnails on the first rows (markdown cells:
    ``FAILURE_TYPES``)."""
    import pandas as pd

    def image(item_id: int, row: int) -> str:
        uri = view.thumbnail(item_id) if row < THUMBNAIL_ROWS else None
        return f'<img src="{uri}" alt="#{item_id}" height="{TABLE_THUMBNAIL_PX}">' if uri else ""

    def key(item_id: int) -> str:
        return view.key_of(item_id) or ""

    rows = [
        (
            f.id,
            image(f.id, number),
            key(f.id),
            view.class_name(f.label),
            f.top1_id,
            image(f.top1_id, number),
            key(f.top1_id),
            view.class_name(f.top1_label),
            round(f.top1_distance, 4),
            None if f.positive_distance is None else round(f.positive_distance, 4),
            None if f.margin is None else round(f.margin, 4),
        )
        for number, f in enumerate(failures)
    ]
    return pd.DataFrame(rows, columns=FAILURE_COLUMNS)


CHANGE_COLUMNS = [
    "id",
    "class",
    "top-1 before",
    "class before",
    "top-1 after",
    "class after",
    "re-ranking",
]


def changes_frame(view: GalleryView, changes: list[Change]) -> pd.DataFrame:
    """Leave-one-out queries whose top-1 re-ranking fixed or broke, fixed first."""
    import pandas as pd

    rows = [
        (
            c.id,
            view.class_name(c.label),
            c.before_id,
            view.class_name(c.before_label),
            c.after_id,
            view.class_name(c.after_label),
            "fixed" if c.fixed else "broken",
        )
        for c in changes
    ]
    return pd.DataFrame(rows, columns=CHANGE_COLUMNS)


def pairs_frame(view: GalleryView, analysis: Analysis) -> pd.DataFrame:
    """The confused class pairs, by name, most failures first."""
    import pandas as pd

    rows = [
        (view.class_name(a), view.class_name(b), count) for a, b, count in analysis.confused_pairs
    ]
    return pd.DataFrame(rows, columns=PAIR_COLUMNS)


def failure_note(view: GalleryView, count: int) -> str:
    analysis = view.analysis()
    if analysis.error:
        return f"No failure list: {analysis.error}."
    shown = f" (the {FAILURE_ROWS} worst shown)" if count > FAILURE_ROWS else ""
    return (
        f"**{count}** of {analysis.labelled} labelled items have a top-1 of another class "
        f"(leave-one-out){shown}. Margin = nearest same-class distance - top-1 distance: the "
        "larger, the worse. Click a column header to sort, a row to see its grid."
    )
