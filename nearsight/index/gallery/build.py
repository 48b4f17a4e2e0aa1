"""Build a gallery from images: embed in finished chunks, one shard per process, then merge.

The image list (in the caller's order) is cut into chunks of ``chunk_size`` images; chunk j is
embedded by process ``j mod WORLD_SIZE`` (torchrun sets RANK and WORLD_SIZE; alone, the one
process does all of them). Each chunk is written to ``.OUT.chunks/`` beside the gallery as a
finished pair (nearsight/index/chunks.py: ``part-J.npy`` + ``part-J.csv``, the public format).
Process 0 then waits for every chunk (a gloo barrier under torchrun), reads them in order and
writes the gallery; the chunk folder is deleted once the gallery is in place. A build killed
part way and started again (same model, images and chunk size: ``manifest.json`` says so)
reuses the chunks that are finished. The gallery does not depend on the number of processes:
the same chunks in the same order, ids 0..N-1.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nearsight.core.errors import NearsightError

if TYPE_CHECKING:  # the CLI imports this module at start: numpy and the runtimes load on use
    import numpy as np

    from nearsight.models.embedder import Embedder

DEFAULT_CHUNK_SIZE = 4096  # images per chunk
MAX_LISTED_ERRORS = 20  # unreadable images listed one per line; past this, a count


@dataclass(frozen=True)
class BuildReport:
    """What one process did in :func:`build_gallery`; ``items`` etc. are 0 on ranks > 0."""

    out: Path
    rank: int
    world: int
    chunks: int  # this process's chunks
    embedded: int  # ... embedded now
    reused: int  # ... finished by an earlier, killed run
    items: int = 0
    skipped: int = 0
    index_type: str = ""
    dim: int = 0
    kept_chunks: Path | None = None  # the chunk folder kept as a PQ gallery's exact vectors
    seconds: float = 0.0
    unreadable: list[str] = field(default_factory=list)

    def summary(self) -> str:
        if self.rank != 0:
            return f"rank {self.rank}: embedded {self.embedded} chunks, reused {self.reused}"
        shards = f", {self.world} processes" if self.world > 1 else ""
        reuse = f", {self.reused} chunks reused" if self.reused else ""
        note = f", {self.skipped} unreadable skipped" if self.skipped else ""
        if self.kept_chunks is not None:
            note += f", chunks kept in {self.kept_chunks} (its exact vectors)"
        return (
            f"built gallery {self.out}: {self.items} items{note}, {self.index_type} index, dim "
            f"{self.dim}{shards}{reuse}, in {self.seconds:.1f}s"
        )


def build_gallery(
    embedder: Embedder,
    paths: Sequence[str | os.PathLike[str]],
    out: str | os.PathLike[str],
    *,
    fields: Sequence[Mapping[str, Any]] | None = None,
    meta: Mapping[str, Any] | None = None,
    meta_types: Mapping[str, str] | None = None,
    model_path: str | os.PathLike[str] | None = None,
    index_type: str = "auto",
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    batch_size: int = 64,
    workers: int = 0,
    max_index_memory: str | int | None = None,
    embeddings: str = "auto",
    neighbour_graph: bool = False,
) -> BuildReport:
    """Embed ``paths`` with ``embedder`` and write the gallery ``out`` (resumable, sharded
    under torchrun; see the module docstring). ``fields``: per-image catalog fields (label,
    class_name, split, meta ...), aligned with ``paths``; ``meta``: the gallery meta to add
    (dataset, root, catalog settings); ``meta_types``: the declared catalog column types.
    Unreadable images are skipped and listed in the report."""
    from nearsight.index.chunks import finished_chunks
    from nearsight.index.gallery.model import gallery_model_meta

    start = time.perf_counter()
    if chunk_size < 1:
        raise NearsightError(f"--chunk-size must be at least 1, got {chunk_size}")
    if batch_size < 1:
        raise NearsightError(f"--batch-size must be at least 1, got {batch_size}")
    if workers < 0:
        raise NearsightError(f"--workers must be 0 or more, got {workers}")
    out = Path(os.path.abspath(Path(out).expanduser()))
    paths = [Path(os.path.abspath(Path(path).expanduser())) for path in paths]
    rows = [dict(row) for row in fields] if fields is not None else [{} for _ in paths]
    if len(rows) != len(paths):
        raise NearsightError(f"{len(rows)} field rows for {len(paths)} images")
    rank, world = _process_group()
    folder = out.with_name(f".{out.name}.chunks")
    names = [f"part-{j:06d}" for j in range(-(-len(paths) // chunk_size))]
    manifest = {
        "model_sha256": embedder.model_sha256,
        "chunk_size": chunk_size,
        "images": hashlib.sha256("\n".join(map(str, paths)).encode()).hexdigest(),
        "fields": hashlib.sha256(json.dumps(rows, sort_keys=True).encode()).hexdigest(),
    }
    if embedder.spec.foreign:  # the same file run with other --mean/--std gives other vectors
        manifest["spec"] = embedder.spec.to_json()
    if rank == 0:
        _prepare(folder, manifest)
    _barrier(world)

    done = set(finished_chunks(folder))
    mine = [j for j in range(len(names)) if j % world == rank]
    reused = sum(names[j] in done for j in mine)
    unreadable: list[str] = []
    try:
        for j in mine:
            if names[j] not in done:
                first = j * chunk_size
                unreadable += _embed_chunk(
                    embedder, paths[first : first + chunk_size], rows[first : first + chunk_size],
                    folder / names[j], batch_size, workers,
                )  # fmt: skip
    except OSError as error:  # a full disk: no half-written chunks left to resume from
        shutil.rmtree(folder, ignore_errors=True)
        reason = getattr(error, "strerror", None) or str(error)
        raise OSError(f"cannot write gallery {out}: {reason}") from None
    except NearsightError:  # bad input (a model whose output is wrong): nothing to resume
        if not finished_chunks(folder):
            shutil.rmtree(folder, ignore_errors=True)
        raise
    _barrier(world)
    counts = {"out": out, "rank": rank, "world": world, "chunks": len(mine)}
    counts |= {"embedded": len(mine) - reused, "reused": reused, "unreadable": unreadable}
    if rank != 0:
        return BuildReport(**counts)

    from nearsight.index.gallery.core import Gallery
    from nearsight.index.gallery.keys import duplicate_note
    from nearsight.index.gallery.write import build_gallery as write_gallery

    vectors, items = _read_all(folder, names, dict(meta_types or {}))
    note = duplicate_note([row.get("sha256") for row in items], [row["path"] for row in items], {})
    if note:
        print(f"nearsight: {note}", file=sys.stderr)
    if not items:
        raise NearsightError(f"none of the {len(paths)} images could be read")
    skipped = len(paths) - len(items)
    gallery_meta = {
        **(meta or {}),
        **gallery_model_meta(embedder, model_path),
        "skipped": skipped,
    }
    write_gallery(
        out,
        vectors,
        items,
        model_sha256=embedder.model_sha256,
        index_type=index_type,
        meta=gallery_meta,
        max_index_memory=max_index_memory,
        embeddings=embeddings,
        neighbour_graph=neighbour_graph,
        vector_source=folder,
    )
    with Gallery.open(out) as gallery:
        built_type = gallery.index_type
        kept = "vector_source" in gallery.meta
    if not kept:  # else they are the exact vectors of a PQ gallery without embeddings.npy
        shutil.rmtree(folder, ignore_errors=True)
    return BuildReport(
        **counts,
        items=len(items),
        skipped=skipped,
        index_type=built_type,
        dim=int(embedder.dim),
        kept_chunks=folder if kept else None,
        seconds=time.perf_counter() - start,
    )


def import_gallery(
    vectors: np.ndarray,
    rows: Sequence[dict[str, Any]],
    out: str | os.PathLike[str],
    *,
    embedder: Embedder | None = None,
    model_path: str | os.PathLike[str] | None = None,
    meta: Mapping[str, Any] | None = None,
    index_type: str = "auto",
    max_index_memory: str | int | None = None,
    embeddings: str = "auto",
    neighbour_graph: bool = False,
    vector_source: str | os.PathLike[str] | None = None,
) -> BuildReport:
    """Write the gallery ``out`` from vectors embedded elsewhere (row i of ``vectors`` is
    ``rows[i]``). ``embedder``: the model they came from (checked to embed in their dim; its
    path and spec go in the meta), or None: a gallery searched by id or vector only."""
    from nearsight.index.gallery.core import Gallery
    from nearsight.index.gallery.model import gallery_model_meta
    from nearsight.index.gallery.write import build_gallery as write_gallery

    start = time.perf_counter()
    out = Path(os.path.abspath(Path(out).expanduser()))
    if len(rows) != len(vectors):
        raise NearsightError(f"{len(rows)} rows but {len(vectors)} vectors")
    gallery_meta = dict(meta or {})
    if embedder is not None:
        if embedder.dim != vectors.shape[1]:
            raise NearsightError(
                f"{model_path or embedder.path} embeds in dim {embedder.dim} but the vectors "
                f"have dim {vectors.shape[1]}"
            )
        gallery_meta.update(gallery_model_meta(embedder, model_path))
    write_gallery(
        out,
        vectors,
        rows,
        model_sha256=embedder.model_sha256 if embedder is not None else "",
        index_type=index_type,
        meta=gallery_meta,
        max_index_memory=max_index_memory,
        embeddings=embeddings,
        neighbour_graph=neighbour_graph,
        vector_source=vector_source,
    )
    with Gallery.open(out) as gallery:
        built_type = gallery.index_type
    return BuildReport(
        out=out, rank=0, world=1, chunks=0, embedded=0, reused=0, items=len(rows),
        index_type=built_type, dim=int(vectors.shape[1]), seconds=time.perf_counter() - start,
    )  # fmt: skip


def _process_group() -> tuple[int, int]:
    """(rank, world size): from torchrun's environment, with a gloo process group for the
    barriers; (0, 1) when run alone."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    if world > 1:
        import torch.distributed as dist  # only under torchrun: the serving path stays torch-free

        if not dist.is_initialized():
            dist.init_process_group("gloo")
    return rank, world


def _barrier(world: int) -> None:
    if world > 1:
        import torch.distributed as dist

        dist.barrier()


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


def embed_and_describe(
    embedder: Embedder, paths: Sequence[Path], batch_size: int, workers: int
) -> tuple[np.ndarray, list[int], list[dict[str, Any]], list[str]]:
    """(vectors of the readable images, their positions in ``paths``, their sha256/width/height,
    error lines); the errors are also listed on stderr."""
    import numpy as np

    from nearsight.index.embed import embed_files
    from nearsight.index.images import describe_image_file

    result = embed_files(embedder, paths, batch_size=batch_size, workers=workers)
    report_unreadable(result.errors)
    kept = [int(i) for i in np.flatnonzero(result.ok)]
    # hashing releases the GIL: threads overlap the file reads
    with ThreadPoolExecutor(max_workers=max(1, min(8, workers or 1))) as pool:
        described = list(pool.map(describe_image_file, [paths[i] for i in kept]))
    return result.embeddings, kept, described, list(result.errors)


def report_unreadable(errors: Sequence[str]) -> None:
    for line in errors[:MAX_LISTED_ERRORS]:
        print(f"nearsight: skipped: {line}", file=sys.stderr)
    if len(errors) > MAX_LISTED_ERRORS:
        print(
            f"nearsight: skipped {len(errors) - MAX_LISTED_ERRORS} more unreadable images",
            file=sys.stderr,
        )


def _embed_chunk(
    embedder: Embedder,
    paths: Sequence[Path],
    fields: Sequence[Mapping[str, Any]],
    stem: Path,
    batch_size: int,
    workers: int,
) -> list[str]:
    """Embed one chunk (unreadable images are listed and left out) and write it; its errors."""
    from nearsight.index.chunks import write_chunk

    vectors, kept, described, errors = embed_and_describe(embedder, paths, batch_size, workers)
    rows = [
        {"path": str(paths[i]), **fields[i], **info}
        for i, info in zip(kept, described, strict=True)
    ]
    write_chunk(stem.parent, stem.name, vectors, rows)
    return errors


def _read_all(
    folder: Path, names: list[str], meta_types: dict[str, str]
) -> tuple[np.ndarray, list[dict[str, Any]]]:
    """Every chunk's vectors (as written: no renormalisation) and rows, in chunk order."""
    import numpy as np

    from nearsight.index.chunks import read_meta

    parts, items = [], []
    for name in names:
        if not (folder / f"{name}.csv").is_file():
            raise NearsightError(f"chunk {folder / name} is missing: a process did not finish")
        part = np.load(folder / f"{name}.npy", allow_pickle=False)
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
