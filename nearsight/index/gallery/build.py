"""The one gallery builder: embed a :class:`GallerySource` in finished chunks, one shard per
process, then write the gallery (``nearsight index build``, ``index import``, the demo and the
Python API's ``nearsight.build_gallery`` all come here).

The image list (in the source's order) is cut into chunks of ``chunk_size`` images; chunk j is
embedded by process ``j mod WORLD_SIZE`` (torchrun sets RANK and WORLD_SIZE; alone, the one
process does all of them). Each chunk is written to ``.OUT.chunks/`` beside the gallery as a
finished pair (:mod:`nearsight.index.chunks`: ``part-J.npy`` + ``part-J.csv``, the public
format). Process 0 then waits for every chunk (a gloo barrier under torchrun), reads them in
order and writes the gallery; the chunk folder is deleted once the gallery is in place. A build
killed part way and started again (same model, images and chunk size: ``manifest.json`` says
so) reuses the chunks that are finished. The gallery does not depend on the number of
processes: the same chunks in the same order, ids 0..N-1.

:func:`model_meta` is the one place that writes the model into a gallery's meta.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from nearsight.core.arrays import load_array
from nearsight.core.distributed import wait_for_all
from nearsight.core.errors import NearsightError, closest_names
from nearsight.data.embed import check_batching, embed_files
from nearsight.data.images import describe_image_file
from nearsight.index.ann.faiss_index import INDEX_TYPES, check_trainable
from nearsight.index.catalog.list_columns import check_list_columns, stored_cell
from nearsight.index.chunks import finished_chunks, meta_types_of, read_meta, write_chunk
from nearsight.index.gallery.core import Gallery
from nearsight.index.gallery.defaults import (
    DEFAULT_BATCH_SIZE,
    DEFAULT_CHUNK_SIZE,
    MAX_LISTED_ERRORS,
)
from nearsight.index.gallery.keys import DEFAULT_KEY_COLUMN, check_unique_keys, duplicate_note
from nearsight.index.gallery.sources import GallerySource, absolute_path, check_out_folder
from nearsight.index.gallery.write import write_gallery
from nearsight.models.embedder import Embedder
from nearsight.models.spec import SPEC_KEY


@dataclass(frozen=True)
class BuildReport:
    """What a build did. On a process other than rank 0 of a sharded build, only the chunk
    counts are filled in (rank 0 writes the gallery)."""

    out: Path
    items: int
    skipped: int
    index_type: str | None
    dim: int
    processes: int
    rank: int
    chunks_embedded: int
    chunks_reused: int
    kept_chunks: Path | None
    seconds: float

    @property
    def wrote_gallery(self) -> bool:
        return self.rank == 0

    def summary(self) -> str:
        if not self.wrote_gallery:
            return (
                f"rank {self.rank}: embedded {self.chunks_embedded} chunks, "
                f"reused {self.chunks_reused}"
            )
        shards = f", {self.processes} processes" if self.processes > 1 else ""
        reuse = f", {self.chunks_reused} chunks reused" if self.chunks_reused else ""
        note = f", {self.skipped} unreadable skipped" if self.skipped else ""
        if self.kept_chunks is not None:
            note += f", chunks kept in {self.kept_chunks} (its exact vectors)"
        return (
            f"built gallery {self.out}: {self.items} items{note}, {self.index_type} index, dim "
            f"{self.dim}{shards}{reuse}, in {self.seconds:.1f}s"
        )


def model_meta(embedder: Embedder, model_path: str | os.PathLike[str]) -> dict[str, Any]:
    """The gallery meta naming its model: the file, and the model spec (one way for every
    builder; galleries written before the spec existed keep being read by their legacy
    ``image_size``/``resize`` fields)."""
    return {"model": str(absolute_path(model_path)), SPEC_KEY: embedder.spec.to_dict()}


def catalog_settings(
    rows: Sequence[dict[str, Any]],
    key_column: str | None = None,
    list_columns: Sequence[str] = (),
) -> dict:
    """Gallery meta for the catalog: the column types of ``rows``' metadata and the key column
    (``key_column``, else ``key`` where the rows have one), checked unique; the tag columns
    (``list_columns``), whose cells are made the catalog's ``a|b`` text here, in place."""
    if list_columns:
        list_columns = check_list_columns(
            list_columns, {key for row in rows for key in (row.get("meta") or {})}
        )
        for row in rows:
            meta = row.get("meta") or {}
            for name in list_columns:
                if name in meta and (cell := stored_cell(meta[name], name)) is not None:
                    meta[name] = cell
                else:
                    meta.pop(name, None)
    column = key_column
    if column is None and any(DEFAULT_KEY_COLUMN in (row.get("meta") or {}) for row in rows):
        column = DEFAULT_KEY_COLUMN
    settings: dict[str, Any] = {"meta_types": meta_types_of(rows)}
    if list_columns:
        settings["meta_types"].update(dict.fromkeys(list_columns, "str"))
        settings["list_columns"] = list(list_columns)
    if column is not None and key_column is not None:
        columns = {key for row in rows for key in (row.get("meta") or {})}
        if rows and column not in columns:  # a typo, or the wrong case: not a per-item message
            same = [name for name in sorted(columns) if name.casefold() == column.casefold()]
            hint = f"did you mean {same[0]!r}?" if same else closest_names(column, columns)
            raise NearsightError(f"--key-column {column}: the source has no such column; {hint}")
    if column is not None:
        check_unique_keys(list(rows), column)
        settings["key_column"] = column
    return settings


def build_gallery(
    embedder: Embedder,
    source: GallerySource,
    out: str | os.PathLike[str],
    *,
    model_path: str | os.PathLike[str],
    index_type: str = "auto",
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    batch_size: int = DEFAULT_BATCH_SIZE,
    workers: int = 0,
    key_column: str | None = None,
    list_columns: Sequence[str] = (),
    max_index_memory: str | int | None = None,
    embeddings: str = "auto",
    neighbour_graph: bool = False,
) -> BuildReport:
    """Embed ``source`` with ``embedder`` (loaded from ``model_path``) into the gallery folder
    ``out``: resumable chunks, sharded over torchrun's processes (see the module docstring).
    Unreadable images are listed on stderr and left out. ``workers``: image-decoding threads."""
    start = time.perf_counter()
    if index_type not in INDEX_TYPES:  # before minutes of embedding, not after
        raise NearsightError(
            f"unknown index type {index_type!r} (choose one of: {', '.join(INDEX_TYPES)})"
        )
    if chunk_size < 1:
        raise NearsightError(f"--chunk-size must be at least 1, got {chunk_size}")
    # at most this many items (unreadable images drop out): too few for a PQ type is refused now
    check_trainable(index_type, len(source.paths), embedder.dim)
    check_batching(batch_size, workers)
    rank, world = process_group()
    out = absolute_path(out)
    check_out_folder(out)
    settings = catalog_settings(source.fields, key_column, list_columns)  # before embedding
    folder = out.with_name(f".{out.name}.chunks")
    names = [f"part-{j:06d}" for j in range(-(-len(source.paths) // chunk_size))]
    if rank == 0:
        _prepare(folder, _manifest(embedder, source, chunk_size))
    wait_for_all(world)
    done = set(finished_chunks(folder))
    mine = [j for j in range(len(names)) if j % world == rank]
    reused = sum(names[j] in done for j in mine)
    try:
        for j in mine:
            if names[j] not in done:
                first = j * chunk_size
                _embed_chunk(embedder, source, first, chunk_size, folder / names[j], batch_size,
                             workers)  # fmt: skip
    except OSError as error:  # a full disk: no half-written chunks left to resume from
        shutil.rmtree(folder, ignore_errors=True)
        reason = getattr(error, "strerror", None) or str(error)
        raise OSError(f"cannot write gallery {out}: {reason}") from None
    except NearsightError:  # bad input (a model whose output is wrong): nothing to resume
        if not finished_chunks(folder):
            shutil.rmtree(folder, ignore_errors=True)
        raise
    wait_for_all(world)
    report: dict[str, Any] = dict(out=out, dim=embedder.dim, processes=world, rank=rank,
                  chunks_embedded=len(mine) - reused, chunks_reused=reused)  # fmt: skip
    if rank != 0:
        return BuildReport(items=0, skipped=0, index_type=None, kept_chunks=None,
                           seconds=time.perf_counter() - start, **report)  # fmt: skip
    vectors, items = _read_all(folder, names, settings["meta_types"])
    note = duplicate_note([row.get("sha256") for row in items], [row["path"] for row in items], {})
    if note:
        print(f"nearsight: {note}", file=sys.stderr)
    if not items:
        raise NearsightError(f"none of the {len(source.paths)} images could be read")
    skipped = len(source.paths) - len(items)
    meta = {**source.meta, **model_meta(embedder, model_path), "skipped": skipped, **settings}
    write_gallery(out, vectors, items, model_sha256=embedder.model_sha256, index_type=index_type,
                  meta=meta, max_index_memory=max_index_memory, embeddings=embeddings,
                  neighbour_graph=neighbour_graph, vector_source=folder)  # fmt: skip
    with Gallery.open(out) as gallery:
        index_type = gallery.index_type
        kept = "vector_source" in gallery.meta
    if not kept:  # else they are the exact vectors of a PQ gallery without embeddings.npy
        shutil.rmtree(folder, ignore_errors=True)
    return BuildReport(items=len(items), skipped=skipped, index_type=index_type,
                       kept_chunks=folder if kept else None,
                       seconds=time.perf_counter() - start, **report)  # fmt: skip


def import_gallery(
    vectors: np.ndarray,
    rows: list[dict[str, Any]],
    out: str | os.PathLike[str],
    *,
    vectors_path: str | os.PathLike[str],
    embedder: Embedder | None = None,
    model_path: str | os.PathLike[str] | None = None,
    index_type: str = "auto",
    key_column: str | None = None,
    list_columns: Sequence[str] = (),
    max_index_memory: str | int | None = None,
    embeddings: str = "auto",
    neighbour_graph: bool = False,
) -> BuildReport:
    """A gallery of vectors computed elsewhere (row i of ``vectors`` is ``rows[i]``), read
    from ``vectors_path``; with the ``embedder`` that made them, image queries work too."""
    start = time.perf_counter()
    out = absolute_path(out)
    check_out_folder(out)
    if len(rows) != len(vectors):
        raise NearsightError(f"the metadata has {len(rows)} rows but there are {len(vectors)} "
                             "vectors")  # fmt: skip
    meta: dict[str, Any] = {"source": "import", "vectors": str(absolute_path(vectors_path)),
                            **catalog_settings(rows, key_column, list_columns)}  # fmt: skip
    if embedder is not None:
        if embedder.dim != vectors.shape[1]:
            raise NearsightError(f"{model_path} embeds in dim {embedder.dim} but the vectors have "
                                 f"dim {vectors.shape[1]}")  # fmt: skip
        meta.update(model_meta(embedder, model_path or ""))
    write_gallery(out, vectors, rows, model_sha256=embedder.model_sha256 if embedder else "",
                  index_type=index_type, meta=meta, max_index_memory=max_index_memory,
                  embeddings=embeddings, neighbour_graph=neighbour_graph,
                  vector_source=vectors_path)  # fmt: skip
    with Gallery.open(out) as gallery:
        index_type = gallery.index_type
    return BuildReport(out=out, items=len(rows), skipped=0, index_type=index_type,
                       dim=int(vectors.shape[1]), processes=1, rank=0, chunks_embedded=0,
                       chunks_reused=0, kept_chunks=None,
                       seconds=time.perf_counter() - start)  # fmt: skip


def process_group() -> tuple[int, int]:
    """(rank, world size): from torchrun's environment, with a gloo process group for the
    barriers; (0, 1) when run alone (torch is imported only then)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    if world > 1:
        import torch.distributed as dist

        if not dist.is_initialized():
            dist.init_process_group("gloo")
    return rank, world


def _manifest(embedder: Embedder, source: GallerySource, chunk_size: int) -> dict[str, Any]:
    manifest = {
        "model_sha256": embedder.model_sha256,
        "chunk_size": chunk_size,
        "images": hashlib.sha256("\n".join(map(str, source.paths)).encode()).hexdigest(),
        "fields": hashlib.sha256(json.dumps(source.fields, sort_keys=True).encode()).hexdigest(),
    }
    if embedder.spec.foreign:  # the same file run with other --mean/--std gives other vectors
        manifest["spec"] = embedder.spec.to_json()
    return manifest


def _prepare(folder: Path, manifest: dict[str, Any]) -> None:
    """Keep the finished chunks of the same build (same manifest); start over otherwise."""
    path = folder / "manifest.json"
    try:
        same = json.loads(path.read_text()) == manifest
    except (OSError, ValueError):
        same = False
    if not same:
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        temporary = folder / ".manifest.json.tmp"
        temporary.write_text(json.dumps(manifest))
        os.replace(temporary, path)


def _embed_chunk(
    embedder: Embedder,
    source: GallerySource,
    first: int,
    chunk_size: int,
    chunk: Path,
    batch_size: int,
    workers: int,
) -> None:
    """Embed one chunk (unreadable images are listed and left out) and write it."""
    paths = source.paths[first : first + chunk_size]
    result = embed_files(embedder, paths, batch_size=batch_size, workers=workers)
    report_unreadable(result.errors)
    kept = [int(i) for i in np.flatnonzero(result.ok)]
    described = describe_files([paths[i] for i in kept], workers, result.sizes)
    rows = [
        {"path": str(paths[i]), **source.fields[first + i], **info}
        for i, info in zip(kept, described, strict=True)
    ]
    write_chunk(chunk.parent, chunk.name, result.embeddings, rows)


def describe_files(
    paths: Sequence[Path], workers: int, sizes: Sequence[tuple[int, int]] | None = None
) -> list[dict[str, Any]]:
    """sha256, width and height of each file (hashing releases the GIL: threads overlap I/O).
    ``sizes``: each file's loaded (width, height) as its decoder reported it, so that no
    untrusted header is parsed outside the decode box."""
    known = list(sizes) if sizes else [None] * len(paths)
    with ThreadPoolExecutor(max_workers=max(1, min(8, workers or 1))) as pool:
        return list(pool.map(describe_image_file, paths, known))


def report_unreadable(errors: Sequence[str]) -> None:
    """The first :data:`MAX_LISTED_ERRORS` skipped images on stderr, then a count."""
    for line in errors[:MAX_LISTED_ERRORS]:
        print(f"nearsight: skipped: {line}", file=sys.stderr)
    if len(errors) > MAX_LISTED_ERRORS:
        print(
            f"nearsight: skipped {len(errors) - MAX_LISTED_ERRORS} more unreadable images",
            file=sys.stderr,
        )


def _read_all(
    folder: Path, names: list[str], meta_types: dict[str, str]
) -> tuple[np.ndarray, list[dict[str, Any]]]:
    """Every chunk's vectors (as written: no renormalisation) and rows, in chunk order."""
    parts, items = [], []
    for name in names:
        if not (folder / f"{name}.csv").is_file():
            raise NearsightError(f"chunk {folder / name} is missing: a process did not finish")
        part = load_array(folder / f"{name}.npy", allow_pickle=False)
        rows = read_meta(folder / f"{name}.csv", meta_types)
        if len(rows) != len(part):
            raise NearsightError(f"chunk {folder / name} is damaged: rows and vectors differ")
        parts.append(part.reshape(len(rows), -1) if len(rows) else None)
        items.extend(rows)
    kept = [part for part in parts if part is not None]
    vectors = np.concatenate(kept) if kept else np.zeros((0, 1), np.float32)
    for row in items:  # chunk rows carry every field; the catalog wants the set ones
        for key in [key for key, value in row.items() if value is None]:
            del row[key]
    print(f"merging {len(names)} chunks: {len(items)} items", file=sys.stderr)
    return vectors, items
