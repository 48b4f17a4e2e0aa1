"""A shop whose products have several photos each, imported as galleries of every index type:
for the tests of pages and grouped searches."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np

PHOTO_SHOP_INDEX_TYPES = ("flat", "ivf", "hnsw", "ivfpq", "opq")
PHOTO_SHOP_ITEMS, PHOTO_SHOP_DIM, PHOTO_SHOP_PRODUCTS = 400, 8, 90
PHOTO_SHOP_SHOPS = ("north", "süd", "west end")


def make_photo_shop(root: Path, model: Path, index_types=PHOTO_SHOP_INDEX_TYPES) -> dict:
    """``PHOTO_SHOP_PRODUCTS`` products with 1 to 8 photos each (a photo's vector near its
    product's), some photos without a SKU, one byte-identical duplicate, imported with
    ``model`` (8-d) as a gallery of each index type recording ``sku`` as its group column:
    {"vectors", "rows" (the CSV's cells), "galleries" (type -> folder), "root"}."""
    from nearsight.app.cli import main

    items, dim, products = PHOTO_SHOP_ITEMS, PHOTO_SHOP_DIM, PHOTO_SHOP_PRODUCTS
    rng = np.random.default_rng(7)
    sizes = rng.integers(1, 9, products)
    product = np.repeat(np.arange(products), sizes)[:items]
    product = np.concatenate([product, rng.integers(0, products, items - len(product))])
    centres = rng.normal(size=(products, dim))
    vectors = centres[product] + 0.6 * rng.normal(size=(items, dim))
    vectors[5] = vectors[4]  # a byte-identical duplicate
    vectors = (vectors / np.linalg.norm(vectors, axis=1, keepdims=True)).astype(np.float32)
    rows = [
        {
            "path": f"/shop/{i}.jpg",
            "sku": "" if rng.random() < 0.05 else f"P{product[i]:03d}",
            "price": str(round(float(rng.uniform(1, 20)), 2)),
            "shop": PHOTO_SHOP_SHOPS[int(rng.integers(len(PHOTO_SHOP_SHOPS)))],
        }
        for i in range(items)
    ]
    np.save(root / "vectors.npy", vectors)
    with open(root / "meta.csv", "w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, ["path", "sku", "price", "shop"])
        writer.writeheader()
        writer.writerows(rows)
    galleries = {}
    for index_type in index_types:
        out = root / index_type
        code = main(["index", "import", "--vectors", str(root / "vectors.npy"), "--meta",
                     str(root / "meta.csv"), "--out", str(out), "--model", str(model),
                     "--index-type", index_type, "--meta-types", "sku=str",
                     "--group-column", "sku"])  # fmt: skip
        assert code == 0
        galleries[index_type] = out
    return {"vectors": vectors, "rows": rows, "galleries": galleries, "root": root}
