"""A clustered catalog imported with the CLI, searched with filters through the Python API.

    python bench/filtered_catalog.py [--items 300000] [--dim 64] [--categories 300]
                                     [--types hnsw ivfpq] [--queries 200] [--json FILE]
                                     [--workdir DIR] [--keep DIR]

--items unit vectors in --categories clusters (a catalog whose categories follow the
embedding's structure, as a shop's do), written as a .npy and a .csv (``label``, ``path``, a
``category`` number and a ``position``: the items' coordinate along one random direction,
a price-like column that follows the geometry smoothly), imported per --types with
``nearsight index import --index-type TYPE``. Each held-out query (a new point of a random
cluster) is searched with ``open_gallery(...).search_vector(v, k=10, filters=...)`` under
three filters, each away from the query:

- ``group``: about 10% of the categories, a run of category numbers (``category>=A``,
  ``category<B``) that does not hold the query's own category; category numbers are drawn at
  random, so the group is categories scattered over the space, none of them the query's;
- ``band``: 5% of the items by ``position``, the band furthest from the query's own
  position (``position>=LO``, ``position<HI``);
- ``far``: one category (``category=C``, 1/--categories of the items), drawn among the
  half of the categories whose centres lie furthest from the query;
- ``and``: two text columns drawn independently of the geometry (``kw``, 10 values of 10%,
  and ``kw2``, values of 10-40%), both at once: 1-4% of the items, as in Qdrant's filtered
  benchmark.

Reported per type and filter: recall@10 against a float64 brute force over the allowed items
(found here from the .csv's columns, not through the catalog), the allowed share, and the p50,
p95 and p99 of one whole search_vector call (the filter parsed, typed and evaluated from the
gallery's payload index, nearsight/index/gallery/payload.py, then the route:
nearsight.index.ann.filtered) as shipped, and as an exact search over the allowed items
(``exact``, filtered.FORCE, the peer in the same run; ``route_vs_exact``: the ratio of their
p50s), with ``eval_p50_ms`` and ``eval_max_ms``, the filter's evaluation alone
(Searcher.filtered): the rest is the search. The ways are timed in turns, query by query, in every order in turn, so that a
machine whose speed drifts moves them alike. Each query's filters are its own: every search is
the first search of its filter, as on a shop's page where each click makes a new filter. --keep DIR keeps the imported galleries in DIR and reuses them on the next run of the
same sizes. One FAISS thread unless --threads. A script, not a test.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import itertools
import json
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import faiss
import numpy as np

from nearsight.index.ann import filtered
from nearsight.search.searcher import open_gallery

FILTERS = ("group", "band", "far", "and")
KW2_SHARES = (0.1, 0.2, 0.3, 0.4)  # kw2=b0..b3; kw: 10 values of 10%
GROUP_SHARE = 0.10
BAND_SHARE = 0.05
CLI = "import sys; from nearsight.app.cli import main; sys.exit(main())"


def catalog(items: int, dim: int, categories: int, queries: int, seed: int) -> dict:
    """Vectors, categories and positions of the items, and held-out queries with theirs:
    categories centred ``spread`` apart in a 16-d latent space mapped into ``dim`` dims, plus
    isotropic noise (bench/index_scale.py's embedding_like, with its categories kept)."""
    rng = np.random.default_rng(seed)
    latent, spread = 16, 2.0
    centres = rng.standard_normal((categories, latent)).astype(np.float32) * np.float32(spread)
    mixing = rng.standard_normal((latent, dim)).astype(np.float32) / np.float32(latent**0.5)
    noise = np.float32(0.1 * (1 + spread**2) ** 0.5 / dim**0.5)

    def draw(count: int) -> tuple[np.ndarray, np.ndarray]:
        label = rng.integers(0, categories, count)
        points = centres[label] + rng.standard_normal((count, latent)).astype(np.float32)
        out = points @ mixing + rng.standard_normal((count, dim)).astype(np.float32) * noise
        return (out / np.linalg.norm(out, axis=1, keepdims=True)).astype(np.float32), label

    vectors, category = draw(items)
    query_vectors, query_category = draw(queries)
    kw = rng.integers(0, 10, items)
    kw2 = np.searchsorted(np.cumsum(KW2_SHARES)[:-1], rng.random(items), side="right")
    direction = rng.standard_normal(dim).astype(np.float32)
    mapped = centres @ mixing
    mapped /= np.linalg.norm(mapped, axis=1, keepdims=True)
    return {
        "vectors": vectors,
        "category": category,
        "position": np.round((vectors @ direction).astype(np.float64), 5),
        "queries": query_vectors,
        "query_category": query_category,
        "query_position": np.round((query_vectors @ direction).astype(np.float64), 5),
        "kw": kw,
        "kw2": kw2,
        "centres": mapped,
    }


def write_files(data: dict, folder: Path) -> tuple[Path, Path]:
    vectors, meta = folder / "vectors.npy", folder / "meta.csv"
    np.save(vectors, data["vectors"])
    with open(meta, "w", newline="") as handle:
        out = csv.writer(handle)
        out.writerow(["path", "label", "category", "position", "kw", "kw2"])
        for i, (category, position, kw, kw2) in enumerate(
            zip(data["category"].tolist(), data["position"].tolist(), data["kw"].tolist(),
                data["kw2"].tolist(), strict=True)
        ):  # fmt: skip
            out.writerow([f"/catalog/{i}.jpg", category, category, repr(position), f"a{kw}",
                          f"b{kw2}"])  # fmt: skip
    return vectors, meta


def query_filters(data: dict, categories: int, seed: int) -> list[dict[str, tuple]]:
    """Per query, name -> (filter strings, allowed mask over the items)."""
    rng = np.random.default_rng(seed)
    category, position = data["category"], data["position"]
    order = np.sort(position)
    width = max(1, round(categories * GROUP_SHARE))
    out = []
    for q, own in enumerate(data["query_category"].tolist()):
        start = (own + 1 + int(rng.integers(0, categories - width))) % categories
        if start + width > categories:  # a run that wraps round: take the one just after own
            start = own + 1 if own + 1 + width <= categories else own - width
        group = (f"category>={start}", f"category<{start + width}")
        # the 5% band of positions furthest from the query's: at one end of the order
        rank = np.searchsorted(order, data["query_position"][q]) / len(order)
        band = round(BAND_SHARE * len(order))
        low_end = rank > 0.5
        lo = float(order[0] if low_end else order[len(order) - band])
        hi = float(order[band]) if low_end else np.inf
        band_filters = (f"position>={lo!r}",) + ((f"position<{hi!r}",) if low_end else ())
        sims = data["centres"] @ data["queries"][q]
        far = int(rng.choice(np.argsort(sims)[: categories // 2]))
        kw, kw2 = int(rng.integers(0, 10)), int(rng.choice([0, 1, 3]))  # 1%, 2%, 4%
        out.append({
            "group": (group, (category >= start) & (category < start + width)),
            "band": (band_filters, (position >= lo) & (position < hi)),
            "far": ((f"category={far}",), category == far),
            "and": ((f"kw=a{kw}", f"kw2=b{kw2}"), (data["kw"] == kw) & (data["kw2"] == kw2)),
        })  # fmt: skip
    return out


def truth(query: np.ndarray, vectors: np.ndarray, allowed: np.ndarray, k: int) -> np.ndarray:
    """The k allowed ids of the top float64 inner products, ties by the lower id."""
    ids = np.flatnonzero(allowed)
    scores = vectors[ids].astype(np.float64) @ query.astype(np.float64)
    return ids[np.argsort(-scores, kind="stable")[:k]]


@contextlib.contextmanager
def forced(way: str | None) -> Iterator[None]:
    filtered.FORCE = way
    try:
        yield
    finally:
        filtered.FORCE = None


def evaluation_ms(searcher, per_query: list, name: str) -> tuple[float, float]:  # noqa: ANN001
    """(p50, max) ms of the filter's part of a search alone: checked, typed and evaluated from
    the payload index (Searcher.filtered), which search_vector does before the route."""
    times = []
    for filters in per_query:
        begin = time.perf_counter()
        searcher.filtered(list(filters[name][0]))
        times.append(time.perf_counter() - begin)
    return round(float(np.median(times) * 1000), 3), round(float(np.max(times) * 1000), 3)


def run_type(index_type: str, files: tuple[Path, Path], data: dict, per_query: list,
             args: argparse.Namespace, folder: Path) -> dict:  # fmt: skip
    out = (args.keep or folder) / f"gallery-{index_type}"
    start = time.perf_counter()
    if not (out / "catalog.db").is_file():
        subprocess.run([sys.executable, "-c", CLI, "index", "import", "--vectors", str(files[0]),
                        "--meta", str(files[1]), "--out", str(out), "--index-type", index_type],
                       check=True, stdout=subprocess.DEVNULL)  # fmt: skip
    built = time.perf_counter() - start
    rows: dict = {}
    searcher = open_gallery(out)
    ways = {"route": None, "exact": "exact"}
    orders = list(itertools.permutations(ways))
    try:
        for name in FILTERS:
            tally = {way: {"hits": 0, "times": [], "exact": 0, "notes": set()} for way in ways}
            shares = []
            for q, query in enumerate(data["queries"]):
                strings, allowed = per_query[q][name]
                want = set(truth(query, data["vectors"], allowed, args.k).tolist())
                shares.append(float(allowed.mean()))
                for way in orders[q % len(orders)]:  # in turns: the VM's drift moves all alike
                    with forced(ways[way]):
                        begin = time.perf_counter()
                        results = searcher.search_vector(query, k=args.k, filters=list(strings))
                        tally[way]["times"].append(time.perf_counter() - begin)
                    found = [hit.id for hit in results]
                    assert allowed[found].all(), (name, strings)  # the filter held
                    tally[way]["hits"] += len(set(found) & want)
                    tally[way]["exact"] += searcher.gallery._filters.last.get("exact", 0)
                    tally[way]["notes"].update(results.notes)
            row: dict = {}
            eval_p50, eval_max = evaluation_ms(searcher, per_query, name)
            for way in ways:
                times = np.asarray(tally[way]["times"]) * 1000
                row[way] = {
                    "recall": round(tally[way]["hits"] / (args.k * len(data["queries"])), 4),
                    "p50_ms": round(float(np.median(times)), 3),
                    "p95_ms": round(float(np.percentile(times, 95)), 3),
                    "p99_ms": round(float(np.percentile(times, 99)), 3),
                    "eval_p50_ms": eval_p50,
                    "eval_max_ms": eval_max,
                    "went_exact": tally[way]["exact"],
                    "notes": sorted(tally[way]["notes"]),
                }
            row["allowed_share"] = round(float(np.mean(shares)), 4)
            row["route_vs_exact"] = round(row["route"]["p50_ms"] / row["exact"]["p50_ms"], 2)
            rows[name] = row
            print(index_type, name, json.dumps(row), file=sys.stderr, flush=True)
        meta = {key: searcher.gallery.meta.get(key)
                for key in ("nlist", "nprobe", "ef_search", "filter_route")}  # fmt: skip
    finally:
        searcher.close()
    return {"build_s": round(built, 1), "meta": meta, "filters": rows}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--items", type=int, default=300_000)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--categories", type=int, default=300)
    parser.add_argument("--types", nargs="+", default=["hnsw", "ivfpq"])
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--workdir", type=Path)
    parser.add_argument("--keep", type=Path, help="keep (and reuse) the galleries here")
    args = parser.parse_args(argv)
    faiss.omp_set_num_threads(args.threads)
    data = catalog(args.items, args.dim, args.categories, args.queries, seed=0)
    per_query = query_filters(data, args.categories, seed=1)
    if args.workdir is not None:
        args.workdir.mkdir(parents=True, exist_ok=True)
    folder = Path(tempfile.mkdtemp(prefix="filtered-catalog-", dir=args.workdir))
    results: dict = {"items": args.items, "dim": args.dim, "categories": args.categories,
                     "queries": args.queries, "k": args.k, "threads": args.threads,
                     "types": {}}  # fmt: skip
    if args.keep is not None:
        args.keep = args.keep / f"{args.items}-{args.dim}-{args.categories}"
        args.keep.mkdir(parents=True, exist_ok=True)
    try:
        files = write_files(data, folder)
        for index_type in args.types:
            results["types"][index_type] = run_type(index_type, files, data, per_query, args,
                                                    folder)  # fmt: skip
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    results["loadavg"] = Path("/proc/loadavg").read_text().split()[:3]
    text = json.dumps(results, indent=1)
    if args.json:
        args.json.write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
