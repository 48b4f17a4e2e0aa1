"""``nearsight index``: build a gallery from a dataset or a list of images, add to it, remove
from it, show one item (the gallery folder is described in nearsight/index/gallery/core.py)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from nearsight.app.commands.catalog_options import add_catalog_options, add_embeddings_option
from nearsight.app.commands.device_option import add_device_option
from nearsight.app.commands.facets import register_facets
from nearsight.app.commands.index_build import run_build
from nearsight.app.commands.index_import import register as register_import
from nearsight.app.commands.index_items import run_add, run_info, run_remove, run_show
from nearsight.app.commands.model_options import add_foreign_model_options, add_timm_model_options
from nearsight.index.gallery.defaults import (
    DEFAULT_BATCH_SIZE,
    DEFAULT_CHUNK_SIZE,
    DEFAULT_WORKERS,
)

if TYPE_CHECKING:  # typing only: the CLI loads these when a command runs
    from nearsight.index.gallery.core import Gallery
    from nearsight.models.embedder import Embedder

# index.ann.faiss_index.INDEX_TYPES, written out: importing it would load faiss for every command
INDEX_TYPES = ["auto", "flat", "ivf", "ivfpq", "opq", "hnsw"]


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "index",
        help="build a FAISS gallery, add images to it, remove them",
        description="Build, grow and shrink a gallery: a folder holding catalog.db (SQLite), "
        "index.faiss, embeddings.npy and the segments appended since the last compaction, "
        "never half-written.",
    )
    actions = parser.add_subparsers(dest="index_command", metavar="ACTION", required=True)

    build = actions.add_parser(
        "build",
        help="embed a dataset split (or a list of images) and write a gallery",
        description="Embed the images of a dataset split, or of a list of image files, with "
        "MODEL and write the gallery folder OUT (replacing a gallery there). Unreadable images "
        "are skipped, listed on stderr and counted. Under torchrun each process embeds a shard "
        "of the chunks and process 0 merges them; a build killed part way and started again "
        "reuses the finished chunks (kept in .OUT.chunks beside OUT until the gallery is "
        "written).",
    )
    build.add_argument(
        "--model",
        type=Path,
        required=True,
        help="model.onnx or a .pt checkpoint; an ONNX model exported elsewhere, with "
        "--input-size (below); or timm:NAME, a pretrained timm model (zero-shot, below)",
    )
    source = build.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--dataset",
        choices=["cub", "cars", "sop", "folder", "csv"],
        help="dataset layout of --root (folder: one sub-folder per class)",
    )
    source.add_argument(
        "--images", nargs="+", type=Path, metavar="FILE", help="image files (unlabelled)"
    )
    source.add_argument(
        "--list",
        type=Path,
        metavar="FILE",
        help="text file with one image path per line (unlabelled; relative paths are relative "
        "to the file; blank lines and lines starting with # are ignored)",
    )
    build.add_argument("--root", type=Path, help="dataset folder (or its parent), with --dataset")
    build.add_argument(
        "--split",
        default="auto",
        choices=["auto", "train", "test", "all"],
        help="auto (default): the test split of cub, cars and sop and of any dataset with a "
        "split of its own (train/ and test/ folders, a CSV split column); every item otherwise",
    )
    build.add_argument("--out", type=Path, required=True, help="gallery folder to write")
    build.add_argument(
        "--index-type",
        default="auto",
        choices=INDEX_TYPES,
        help="auto (default): by item count and --max-index-memory, autofaiss's rules: exact "
        "(flat) up to 1M items while it fits, then HNSW while it fits, then OPQ + IVF-PQ. "
        "ivfpq and opq need at least 256 items (opq: and one per dimension)",
    )
    build.add_argument(
        "--max-index-memory",
        metavar="SIZE",
        help="memory budget of the index for --index-type auto, e.g. 2G (default: a quarter "
        "of this machine's RAM)",
    )
    add_embeddings_option(build)
    build.add_argument(
        "--chunk-size",
        type=int,
        default=DEFAULT_CHUNK_SIZE,
        help=f"images per finished chunk, the unit of sharding and resume (default "
        f"{DEFAULT_CHUNK_SIZE})",
    )
    _add_embedding_options(build)
    add_foreign_model_options(build)
    add_timm_model_options(build)
    build.set_defaults(func=run_build)

    add = actions.add_parser(
        "add",
        help="embed images and add them to a gallery",
        description="Embed IMAGE... with the gallery's model (or --model, which must be the "
        "same model) and add them to the gallery. Unreadable images are skipped and listed.",
    )
    add.add_argument("--gallery", type=Path, required=True, help="gallery folder")
    add.add_argument("images", nargs="+", type=Path, metavar="IMAGE")
    add.add_argument(
        "--label",
        help="class of the images: an integer label, or a class name (the gallery's label of "
        "that name, or a new one)",
    )
    add.add_argument(
        "--key",
        help="the item's unique key (one image), any text: an item with this key is replaced",
    )
    add_catalog_options(add, key_column=False)
    add.add_argument("--class-name", help="class name of the images")
    add.add_argument(
        "--meta",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="metadata of the images (repeatable), typed as a number or text: "
        "--meta shop=north --meta price=12.5",
    )
    add.add_argument("--model", type=Path, help="default: the model the gallery was built with")
    _add_embedding_options(add)
    add.set_defaults(func=run_add)

    remove = actions.add_parser(
        "remove",
        help="remove items from a gallery by id or by key",
        description="Remove the items with ids ID... (from `nearsight search`), or with keys "
        "KEY... (the gallery's key column), from the gallery: all of them, or none when one is "
        "unknown.",
    )
    remove.add_argument("--gallery", type=Path, required=True, help="gallery folder")
    which = remove.add_mutually_exclusive_group(required=True)
    which.add_argument("--ids", type=int, nargs="+", metavar="ID")
    which.add_argument("--keys", nargs="+", metavar="KEY", help="items by their key")
    remove.set_defaults(func=run_remove)

    show = actions.add_parser(
        "show",
        help="print one item of a gallery, by id or by key, as JSON",
        description="Print the catalog row of one item (id, path, label, class_name, split, "
        "sha256, width, height, meta) as one JSON object. A key is any text: quote it for the "
        "shell, and write one that starts with '-' as --key=-K.",
    )
    show.add_argument("--gallery", type=Path, required=True, help="gallery folder")
    one = show.add_mutually_exclusive_group(required=True)
    one.add_argument("--id", type=int, help="the item's id")
    one.add_argument("--key", help="the item's key (the gallery's key column)")
    show.set_defaults(func=run_show)

    info = actions.add_parser(
        "info",
        help="print a gallery's summary: items, dim, model, index type, key and columns",
        description="Print what a gallery holds: its item count (labelled, classes), the "
        "embedding dim and metric, the model, the index type, the key column and each metadata "
        "column's type (int, float, str, date, datetime; list[str] for a tag column); the same "
        "facts as REST's /api/galleries and the page's Summary tab.",
    )
    info.add_argument("--gallery", type=Path, required=True, help="gallery folder")
    info.add_argument("--json", action="store_true", help="print one JSON object")
    info.set_defaults(func=run_info)

    register_import(actions, INDEX_TYPES)
    register_facets(actions)


def _add_embedding_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--batch-size",
        type=int,
        default=DEFAULT_BATCH_SIZE,
        help=f"images per batch (default {DEFAULT_BATCH_SIZE})",
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=DEFAULT_WORKERS,
        help="image-decoding threads (default min(4, cores))",
    )
    parser.add_argument(
        "--trusted-images",
        action="store_true",
        help="decode the images in this process, not in the bounded decode box (only for "
        "folders you vouch for; the same pixels)",
    )
    add_device_option(parser)


# -- shared with search ----------------------------------------------------------------------


def load_gallery_model(gallery: Gallery, override: Path | None, device: str = "auto") -> Embedder:
    """The embedder for ``gallery``: ``override`` or the model path its meta records; checked
    to be the model the gallery was built with."""
    return gallery.load_model(override, device=device)
