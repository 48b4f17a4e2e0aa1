"""Suspected labels (issue 53): how high ``nearsight inspect labels`` ranks labels flipped at
random, against a plain k-nearest-neighbour vote over the same embeddings.

    python bench/inspect_labels.py [--seeds 0 1 2 3 4 5] [--flip 0.05] [--json FILE]

Data: unit vectors around one random direction per class (60 classes of 5 to 59 items, 64-d,
spreads varying by class so that leave-one-out Recall@1 is about 0.7, the issue's "model of
Recall@1 0.72"); 5% of the labels moved to another class drawn uniformly. Precision at N (N =
the number flipped): the share of flipped items among the first N ranked. The plain vote
ranks by the share of the k nearest others that carry the item's label (k = 10, 20, 50).

A script, not a test (tests/search/test_inspect_labels.py asserts the comparison).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from nearsight.search.inspect.items import exact_neighbours
from nearsight.search.inspect.labels import score_labels


def clustered(seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(60, 64))
    centres /= np.linalg.norm(centres, axis=1, keepdims=True)
    vectors, labels = [], []
    for label in range(60):
        count = int(rng.integers(5, 60))
        scale = rng.uniform(0.6, 1.4) * 1.8 / 8
        vectors.append(centres[label] + scale * rng.normal(size=(count, 64)))
        labels += [label] * count
    stacked = np.concatenate(vectors).astype(np.float32)
    return stacked / np.linalg.norm(stacked, axis=1, keepdims=True), np.asarray(labels)


def precision(order: np.ndarray, flipped: np.ndarray) -> float:
    return float(np.isin(order[: len(flipped)], flipped).mean())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4, 5])
    parser.add_argument("--flip", type=float, default=0.05)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    rows = []
    for seed in args.seeds:
        vectors, labels = clustered(seed)
        _, top = exact_neighbours(vectors, vectors, 1, leave_one_out=True)
        recall = float((labels[top[:, 0]] == labels).mean())
        rng = np.random.default_rng(100 + seed)
        flipped = rng.choice(len(labels), round(args.flip * len(labels)), replace=False)
        noisy = labels.copy()
        noisy[flipped] = (labels[flipped] + rng.integers(1, 60, len(flipped))) % 60
        row = {"seed": seed, "items": len(labels), "flipped": len(flipped), "recall@1": recall}
        scores = score_labels(vectors, noisy)
        row["confident learning"] = precision(np.argsort(scores.quality, kind="stable"), flipped)
        for k in (10, 20, 50):
            _, found = exact_neighbours(vectors, vectors, k, leave_one_out=True)
            agreement = (noisy[found] == noisy[:, None]).mean(axis=1)
            row[f"vote k={k}"] = precision(np.argsort(agreement, kind="stable"), flipped)
        rows.append(row)
        print(
            json.dumps({key: round(v, 3) if isinstance(v, float) else v for key, v in row.items()})
        )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
