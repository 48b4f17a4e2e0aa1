"""Data for the inspection tests (nearsight/search/inspect/): clustered unit vectors with known
classes, their labels flipped at random, galleries imported from them, and image folders with
planted copies (byte-identical, or resized and recompressed)."""

from __future__ import annotations

import csv
import shutil
from pathlib import Path

import numpy as np


def clustered_vectors(
    seed: int,
    classes: int = 60,
    per_class: tuple[int, int] = (5, 60),
    dim: int = 64,
    spread: float = 1.8,
) -> tuple[np.ndarray, np.ndarray]:
    """Unit vectors around one random direction per class, classes of random sizes in
    ``per_class`` and random spreads (0.6 to 1.4 times ``spread``): (vectors [N, dim] float32,
    labels [N]). The default spread gives a leave-one-out Recall@1 near 0.7."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(classes, dim))
    centres /= np.linalg.norm(centres, axis=1, keepdims=True)
    vectors, labels = [], []
    for label in range(classes):
        count = int(rng.integers(*per_class))
        scale = rng.uniform(0.6, 1.4) * spread / np.sqrt(dim)
        vectors.append(centres[label] + scale * rng.normal(size=(count, dim)))
        labels += [label] * count
    stacked = np.concatenate(vectors).astype(np.float32)
    stacked /= np.linalg.norm(stacked, axis=1, keepdims=True)
    return stacked, np.asarray(labels, dtype=np.int64)


def flip_labels(labels: np.ndarray, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``labels`` with ``fraction`` of them changed to another class drawn uniformly: (new
    labels, positions flipped)."""
    rng = np.random.default_rng(seed)
    classes = int(labels.max()) + 1
    flipped = rng.choice(len(labels), int(round(fraction * len(labels))), replace=False)
    noisy = labels.copy()
    noisy[flipped] = (labels[flipped] + rng.integers(1, classes, len(flipped))) % classes
    return noisy, flipped


def top1_correct(vectors: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """Brute force: whether each row's nearest other row has its label."""
    inner = vectors @ vectors.T
    np.fill_diagonal(inner, -np.inf)
    return labels[inner.argmax(axis=1)] == labels


def import_vectors(
    root: Path,
    name: str,
    vectors: np.ndarray,
    labels: np.ndarray,
    keys: list[str] | None = None,
    paths: list[str] | None = None,
) -> Path:
    """A gallery ``root/name`` imported from ``vectors`` (``index import``), its rows
    labelled ``labels`` (class names ``class-L``), keyed by ``keys`` when given."""
    from nearsight.app.cli import main

    root.mkdir(parents=True, exist_ok=True)
    np.save(root / f"{name}.npy", vectors)
    with open(root / f"{name}.csv", "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["path", "label", "class_name"] + (["key"] if keys else []))
        for row, label in enumerate(labels):
            path = paths[row] if paths else f"item-{row:05d}.png"
            extra = [keys[row]] if keys else []
            writer.writerow([path, int(label), f"class-{int(label)}", *extra])
    out = root / name
    argv = ["index", "import", "--vectors", root / f"{name}.npy", "--meta", root / f"{name}.csv"]
    assert main([str(arg) for arg in [*argv, "--out", out, "--index-type", "flat"]]) == 0
    return out


def plant_copies(
    sources: list[Path], folder: Path, identical: int, resized: int, seed: int
) -> list[tuple[Path, Path]]:
    """Copies of the first ``identical + resized`` of ``sources`` written into ``folder`` (in
    the source's class sub-folder): ``identical`` byte for byte, then ``resized`` scaled by 5 to
    15% and saved as JPEG (quality 70 to 90). Returns (source, copy) pairs."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    pairs = []
    for number, source in enumerate(sources[: identical + resized]):
        target_folder = folder / source.parent.name
        target_folder.mkdir(parents=True, exist_ok=True)
        if number < identical:
            copy = target_folder / f"copy-{number:03d}{source.suffix}"
            shutil.copyfile(source, copy)
        else:
            image = Image.open(source).convert("RGB")
            factor = rng.uniform(0.85, 0.95) if number % 2 else rng.uniform(1.05, 1.15)
            size = (round(image.width * factor), round(image.height * factor))
            copy = target_folder / f"copy-{number:03d}.jpg"
            image.resize(size, Image.Resampling.BICUBIC).save(
                copy, quality=int(rng.integers(70, 91))
            )
        pairs.append((source, copy))
    return pairs
