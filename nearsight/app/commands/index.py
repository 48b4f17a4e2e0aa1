"""``nearsight index``: build a gallery from a dataset or a list of images, add to it, remove
from it (the gallery folder is described in nearsight/index/gallery/core.py)."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from nearsight.app.commands import index_import
from nearsight.app.commands.catalog_options import add_catalog_options, declared_types
from nearsight.app.commands.index_add import run_add, run_remove
from nearsight.app.commands.index_build import DEFAULT_CHUNK_SIZE, run_build
from nearsight.app.commands.model_options import add_foreign_model_options

# index.faiss_index.INDEX_TYPES, written out: importing it would load faiss for every command
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
        help="model.onnx or a .pt checkpoint; or an ONNX model exported elsewhere, with "
        "--input-size (below)",
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
        "(flat) up to 1M items while it fits, then HNSW while it fits, then OPQ + IVF-PQ",
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
        help="the item's unique key (one image): an item with this key is replaced",
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
        help="remove items from a gallery by id",
        description="Remove the items with ids ID... (from `nearsight search`) from the gallery.",
    )
    remove.add_argument("--gallery", type=Path, required=True, help="gallery folder")
    which = remove.add_mutually_exclusive_group(required=True)
    which.add_argument("--ids", type=int, nargs="+", metavar="ID")
    which.add_argument("--keys", nargs="+", metavar="KEY", help="items by their key")
    remove.set_defaults(func=run_remove)

    index_import.register(actions, INDEX_TYPES)


def _add_embedding_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--batch-size", type=int, default=64, help="images per batch (default 64)")
    parser.add_argument(
        "--workers",
        type=int,
        default=min(4, os.cpu_count() or 1),
        help="image-decoding worker processes (default min(4, cores))",
    )
    parser.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])


# -- shared with search ----------------------------------------------------------------------


def load_gallery_model(gallery: Any, override: Path | None, device: str = "auto") -> Any:
    """The embedder for ``gallery``: ``override`` or the model path its meta records; checked
    to be the model the gallery was built with."""
    return gallery.load_model(override, device=device)


def _check_batching(args: argparse.Namespace) -> None:
    from nearsight.core.errors import NearsightError

    if args.batch_size < 1:
        raise NearsightError(f"--batch-size must be at least 1, got {args.batch_size}")
    if args.workers < 0:
        raise NearsightError(f"--workers must be 0 or more, got {args.workers}")


def _absolute(path: str | os.PathLike[str]) -> Path:
    """Absolute and normalised ("a/../b" -> "b"), symlinks kept: what the catalog records."""
    return Path(os.path.abspath(Path(path).expanduser()))


def _skipped_note(errors: Sequence[str]) -> str:
    return f", {len(errors)} unreadable skipped" if errors else ""


# -- build -----------------------------------------------------------------------------------


def _read_list(list_file: Path) -> list[Path]:
    from nearsight.core.errors import NearsightError

    try:
        text = list_file.read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as error:
        reason = getattr(error, "strerror", None) or str(error)
        raise NearsightError(f"cannot read image list {list_file}: {reason}") from None
    base = _absolute(list_file).parent
    paths = []
    for line in text.splitlines():
        entry = line.strip()
        if entry and not entry.startswith("#"):
            path = Path(entry).expanduser()
            paths.append(_absolute(base / path))
    if not paths:
        raise NearsightError(f"image list {list_file} names no images")
    return paths


def _build_sources(args: argparse.Namespace) -> tuple[list[Path], list[dict[str, Any]], dict]:
    """(paths, catalog fields per path, meta about where they came from)."""
    from nearsight.core.errors import NearsightError
    from nearsight.index.datasets import load_dataset, resolve_split

    if args.dataset is not None:
        if args.root is None:
            raise NearsightError("--root is required with --dataset (the dataset folder)")
        chosen = args.split
        if chosen == "auto":
            chosen = resolve_split(args.dataset, args.root)
        split = load_dataset(args.dataset, args.root, chosen, declared_types(args))
        if args.split == "auto":
            why = "its own test split" if chosen == "test" else "no split of its own: every item"
            print(f"split: {chosen} ({args.dataset} has {why}; --split to choose)", file=sys.stderr)
        paths = [_absolute(sample.path) for sample in split.samples]
        fields = [  # each item keeps the split its dataset gives it (None: it gives none)
            {
                "label": sample.label,
                "class_name": sample.class_name,
                "split": sample.split,
                "meta": sample.meta,
            }
            for sample in split.samples
        ]
        meta = {"dataset": args.dataset, "root": str(_absolute(split.root)), "split": chosen}
        return paths, fields, meta
    if args.root is not None:
        raise NearsightError("--root goes with --dataset, not with --images or --list")
    if args.images is not None:
        paths = [_absolute(path) for path in args.images]
        meta = {"source": "images"}
    else:
        paths = _read_list(args.list)
        meta = {"source": str(_absolute(args.list))}
    return paths, [{} for _ in paths], meta


def _check_out(out: Path) -> None:
    """Refuse a folder that is not a gallery before spending minutes embedding."""
    from nearsight.core.errors import NearsightError
    from nearsight.index.catalog import CATALOG_FILE

    if out.exists() and not out.is_dir():
        raise NearsightError(f"cannot write a gallery to {out}: it is a file")
    if out.is_dir() and any(out.iterdir()) and not (out / CATALOG_FILE).is_file():
        raise NearsightError(
            f"{out} already exists and is not a nearsight gallery (no {CATALOG_FILE}): "
            "choose a new folder or remove it"
        )


def add_embeddings_option(parser: argparse.ArgumentParser) -> None:
    """``--embeddings auto|keep|drop`` of ``index build`` and ``index import``."""
    parser.add_argument(
        "--embeddings",
        default="auto",
        choices=["auto", "keep", "drop"],
        help="write embeddings.npy, a second copy of the vectors (keep), or not (drop); auto "
        "(default) drops it when the vectors exceed --max-index-memory and exact vectors remain "
        "without it (a flat, ivf or hnsw index; the imported files or kept build chunks for "
        "ivfpq/opq). Without it, eval and search by id read the vectors back from those",
    )
    add_catalog_options(parser)
    parser.add_argument(
        "--neighbour-graph",
        action="store_true",
        help="also store each item's 16 nearest items, so that database-side augmentation "
        "(--rerank dba, dba+aqe) looks them up instead of searching the index per candidate",
    )
