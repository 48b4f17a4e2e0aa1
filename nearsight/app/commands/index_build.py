"""``nearsight index build``: the command line over ``nearsight.index.gallery.build``, which
embeds in finished chunks (resumable), one shard per torchrun process, then merges."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from nearsight.index.gallery.build import DEFAULT_CHUNK_SIZE  # noqa: F401  (the option's default)

if TYPE_CHECKING:
    from nearsight.index.gallery.build import BuildReport


def run_build(args: argparse.Namespace) -> int:
    print(build_from_args(args).summary())
    return 0


def build_from_args(args: argparse.Namespace) -> BuildReport:
    """The parsed ``index build`` options as one typed ``build_gallery`` call."""
    from nearsight.app.commands.catalog_options import catalog_settings
    from nearsight.app.commands.index import _absolute, _build_sources, _check_batching, _check_out
    from nearsight.app.commands.model_options import load_index_model
    from nearsight.core.errors import NearsightError
    from nearsight.index.gallery.build import build_gallery

    _check_batching(args)
    if args.chunk_size < 1:
        raise NearsightError(f"--chunk-size must be at least 1, got {args.chunk_size}")
    out = _absolute(args.out)
    _check_out(out)
    paths, fields, source_meta = _build_sources(args)
    # column types (kept through the chunks) and the key column, checked before embedding
    settings = catalog_settings(args, fields)
    return build_gallery(
        load_index_model(args),
        paths,
        out,
        fields=fields,
        meta={**source_meta, **settings},
        meta_types=settings["meta_types"],
        model_path=args.model,
        index_type=args.index_type,
        chunk_size=args.chunk_size,
        batch_size=args.batch_size,
        workers=args.workers,
        max_index_memory=args.max_index_memory,
        embeddings=args.embeddings,
        neighbour_graph=args.neighbour_graph,
    )
