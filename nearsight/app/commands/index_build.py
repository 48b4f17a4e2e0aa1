"""``nearsight index build``: embed in finished chunks, one shard per process, then merge.

The image list (in the dataset's order) is cut into chunks of ``--chunk-size`` images; chunk j
is embedded by process ``j mod WORLD_SIZE`` (torchrun sets RANK and WORLD_SIZE; alone, the one
process does all of them). Each chunk is written to ``.OUT.chunks/`` beside the gallery as a
finished pair (nearsight/index/chunks.py: ``part-J.npy`` + ``part-J.csv``, the public format). Process 0
then waits for every chunk (a gloo barrier under torchrun), reads them in order and writes the
gallery; the chunk folder is deleted once the gallery is in place. A build killed part way and
started again (same model, images and chunk size: ``manifest.json`` says so) reuses the chunks
that are finished. The gallery does not depend on the number of processes: the same chunks in
the same order, ids 0..N-1.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

DEFAULT_CHUNK_SIZE = 4096


def run_build(args: argparse.Namespace) -> int:
    from nearsight.app.commands.catalog_options import catalog_settings
    from nearsight.app.commands.index import (
        _absolute,
        _build_sources,
        _check_batching,
        _check_out,
    )
    from nearsight.app.commands.model_options import load_index_model
    from nearsight.core.errors import NearsightError

    start = time.perf_counter()
    _check_batching(args)
    if args.chunk_size < 1:
        raise NearsightError(f"--chunk-size must be at least 1, got {args.chunk_size}")
    rank, world = _process_group()
    out = _absolute(args.out)
    _check_out(out)
    paths, fields, source_meta = _build_sources(args)
    # column types (kept through the chunks) and the key column, checked before embedding
    settings = catalog_settings(args, fields)
    embedder = load_index_model(args)
    folder = out.with_name(f".{out.name}.chunks")
    names = [f"part-{j:06d}" for j in range(-(-len(paths) // args.chunk_size))]
    manifest = {
        "model_sha256": embedder.model_sha256,
        "chunk_size": args.chunk_size,
        "images": hashlib.sha256("\n".join(map(str, paths)).encode()).hexdigest(),
        "fields": hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest(),
    }
    if embedder.spec.foreign:  # the same file run with other --mean/--std gives other vectors
        manifest["spec"] = embedder.spec.to_json()
    if rank == 0:
        _prepare(folder, manifest)
    _barrier(world)

    from nearsight.index.chunks import finished_chunks

    done = set(finished_chunks(folder))
    mine = [j for j in range(len(names)) if j % world == rank]
    reused = sum(names[j] in done for j in mine)
    try:
        for j in mine:
            if names[j] not in done:
                _embed_chunk(embedder, paths, fields, j, names[j], folder, args)
    except OSError as error:  # a full disk: no half-written chunks left to resume from
        shutil.rmtree(folder, ignore_errors=True)
        reason = getattr(error, "strerror", None) or str(error)
        raise OSError(f"cannot write gallery {out}: {reason}") from None
    except NearsightError:  # bad input (a model whose output is wrong): nothing to resume
        if not finished_chunks(folder):
            shutil.rmtree(folder, ignore_errors=True)
        raise
    _barrier(world)
    if rank != 0:
        print(f"rank {rank}: embedded {len(mine) - reused} chunks, reused {reused}")
        return 0

    from nearsight.index.gallery.core import Gallery, build_gallery
    from nearsight.index.gallery.keys import duplicate_note
    from nearsight.models.spec import SPEC_KEY

    vectors, items = _read_all(folder, names, settings["meta_types"])
    note = duplicate_note([row.get("sha256") for row in items], [row["path"] for row in items], {})
    if note:
        print(f"nearsight: {note}", file=sys.stderr)
    if not items:
        raise NearsightError(f"none of the {len(paths)} images could be read")
    skipped = len(paths) - len(items)
    meta = {
        **source_meta,
        "model": str(_absolute(args.model)),
        SPEC_KEY: embedder.spec.to_dict(),
        "skipped": skipped,
        **settings,
    }
    build_gallery(
        out,
        vectors,
        items,
        model_sha256=embedder.model_sha256,
        index_type=args.index_type,
        meta=meta,
        max_index_memory=args.max_index_memory,
        embeddings=args.embeddings,
        neighbour_graph=args.neighbour_graph,
        vector_source=folder,
    )
    with Gallery.open(out) as gallery:
        index_type = gallery.index_type
        kept_chunks = "vector_source" in gallery.meta
    if not kept_chunks:  # else they are the exact vectors of a PQ gallery without embeddings.npy
        shutil.rmtree(folder, ignore_errors=True)
    shards = f", {world} processes" if world > 1 else ""
    reuse = f", {reused} chunks reused" if reused else ""
    note = f", {skipped} unreadable skipped" if skipped else ""
    note += f", chunks kept in {folder} (its exact vectors)" if kept_chunks else ""
    print(
        f"built gallery {out}: {len(items)} items{note}, {index_type} index, dim "
        f"{embedder.dim}{shards}{reuse}, in {time.perf_counter() - start:.1f}s"
    )
    return 0


def _process_group() -> tuple[int, int]:
    """(rank, world size): from torchrun's environment, with a gloo process group for the
    barriers; (0, 1) when run alone."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    if world > 1:
        import torch.distributed as dist

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


def _embed_chunk(
    embedder: Any,
    paths: list[Path],
    fields: list[dict[str, Any]],
    number: int,
    name: str,
    folder: Path,
    args: argparse.Namespace,
) -> None:
    """Embed chunk ``number`` (unreadable images are listed and left out) and write it."""
    from nearsight.app.commands.index import _describe, _embed_files
    from nearsight.index.chunks import write_chunk

    first = number * args.chunk_size
    chunk_paths = paths[first : first + args.chunk_size]
    vectors, kept, _ = _embed_files(embedder, chunk_paths, args)
    kept_paths = [chunk_paths[i] for i in kept]
    described = _describe(kept_paths, args.workers)
    rows = [
        {"path": str(path), **fields[first + i], **info}
        for path, i, info in zip(kept_paths, kept, described, strict=True)
    ]
    write_chunk(folder, name, vectors, rows)


def _read_all(
    folder: Path, names: list[str], meta_types: dict[str, str]
) -> tuple[Any, list[dict[str, Any]]]:
    """Every chunk's vectors (as written: no renormalisation) and rows, in chunk order."""
    import numpy as np

    from nearsight.core.errors import NearsightError
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
