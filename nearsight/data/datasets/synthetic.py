"""A deterministic synthetic fine-grained dataset, written as an image folder dataset.

Each class is a combination of three attributes: a shape (7), a two-colour pattern (6) and a
colour pair (10). Class ``c`` has shape ``c % 7``, pattern ``c % 6`` and colours ``c % 10``, so
classes 0..209 are all different, neighbouring classes differ in everything, and many pairs
differ in a single attribute (``c`` and ``c + 42`` share shape and pattern; ``c`` and ``c + 30``
share pattern and colours): fine-grained, like birds that differ by the colour of one feather.
The train classes (the first half) and test classes (the rest) are disjoint, but every attribute
value occurs in both halves, so a network that learns the attributes can retrieve unseen
combinations, while an untrained one is misled by what varies per image: pose (rotation,
position, aspect), scale, the object's colour shade, the background (colour, gradient, clutter
of other shapes in the same colours, occluding lines) and noise.

Every image is a pure function of (seed, class, index), so the files are byte-identical for the
same seed whatever the order they are made in, and PNGs carry no timestamp or metadata.
"""

from __future__ import annotations

import json
import math
import os
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

from nearsight.core.atomic import atomic_dir
from nearsight.core.errors import NearsightError

SHAPES = ("circle", "triangle", "square", "pentagon", "star", "cross", "crescent")
PATTERNS = ("halves", "stripes", "dots", "checker", "rings", "grid")
COLOURS = {
    "red": (215, 40, 45),
    "orange": (245, 135, 25),
    "yellow": (240, 215, 45),
    "green": (45, 165, 65),
    "teal": (25, 160, 165),
    "blue": (45, 80, 215),
    "purple": (135, 55, 185),
    "pink": (240, 115, 180),
    "white": (245, 245, 245),
    "black": (30, 30, 30),
}
PALETTES = (
    ("red", "blue"),
    ("red", "yellow"),
    ("blue", "yellow"),
    ("green", "purple"),
    ("orange", "teal"),
    ("pink", "green"),
    ("blue", "orange"),
    ("purple", "yellow"),
    ("teal", "red"),
    ("black", "white"),
)
MAX_CLASSES = math.lcm(len(SHAPES), len(PATTERNS), len(PALETTES))  # 210
MARKER_FILE = "synthetic.json"
_PARALLEL_FROM = 400  # images; below this a process pool costs more than it saves


@dataclass(frozen=True)
class SynthSummary:
    images: int
    classes: int
    train_classes: int
    test_classes: int


@dataclass(frozen=True)
class SynthClass:
    index: int
    shape: str
    pattern: str
    colours: tuple[str, str]

    @classmethod
    def of(cls, index: int) -> SynthClass:
        return cls(
            index,
            SHAPES[index % len(SHAPES)],
            PATTERNS[index % len(PATTERNS)],
            PALETTES[index % len(PALETTES)],
        )

    def name(self, digits: int = 3) -> str:
        return f"c{self.index:0{digits}d}_{self.shape}_{self.pattern}_{'-'.join(self.colours)}"


def write_synthetic(
    out: str | os.PathLike[str],
    classes: int = 100,
    per_class: int = 24,
    size: int = 96,
    seed: int = 0,
) -> SynthSummary:
    """Write ``classes`` x ``per_class`` PNG images of ``size`` pixels to ``out``: the first half
    of the classes (rounded up) to ``out/train/<class>/``, the rest to ``out/test/<class>/``, plus
    ``synthetic.json`` (the settings and each class's attributes). The folder appears complete or
    not at all; an existing synthetic dataset there is replaced, any other folder is refused."""
    _check_arguments(classes, per_class, size, seed)
    final = Path(out).expanduser()
    _check_out(final)

    digits = max(3, len(str(classes - 1)))
    name_digits = max(3, len(str(per_class - 1)))
    n_train = classes - classes // 2
    definitions = [SynthClass.of(index) for index in range(classes)]
    names = [definition.name(digits) for definition in definitions]

    with atomic_dir(final) as tmp:
        jobs = []
        for index, name in enumerate(names):
            folder = tmp / ("train" if index < n_train else "test") / name
            folder.mkdir(parents=True)
            jobs.append((str(folder), seed, index, per_class, size, name_digits))
        if classes * per_class >= _PARALLEL_FROM and (os.cpu_count() or 1) > 1:
            workers = min(os.cpu_count() or 1, 8)
            with ProcessPoolExecutor(max_workers=workers) as pool:
                list(pool.map(_write_class, jobs))
        else:
            for job in jobs:
                _write_class(job)
        manifest = {
            "generator": "nearsight synthetic v1",
            "classes": classes,
            "per_class": per_class,
            "size": size,
            "seed": seed,
            "train": names[:n_train],
            "test": names[n_train:],
            "attributes": {
                name: {"shape": d.shape, "pattern": d.pattern, "colours": list(d.colours)}
                for name, d in zip(names, definitions, strict=True)
            },
        }
        (tmp / MARKER_FILE).write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")
    return SynthSummary(classes * per_class, classes, n_train, classes - n_train)


def render(seed: int, class_index: int, image_index: int, size: int) -> Image.Image:
    """Image ``image_index`` of class ``class_index``: depends on nothing else."""
    rng = np.random.default_rng([seed, class_index, image_index])
    definition = SynthClass.of(class_index)
    canvas = _background(rng, size)
    _paste_object(canvas, rng, definition, size)
    draw = ImageDraw.Draw(canvas)
    for _ in range(int(rng.integers(0, 3))):  # thin occluding lines
        points = [tuple(float(v) for v in rng.uniform(0, size, 2)) for _ in range(2)]
        draw.line(points, fill=_random_colour(rng), width=max(1, size // 48))
    pixels = np.asarray(canvas, dtype=np.float32)
    noise = rng.standard_normal(pixels.shape, dtype=np.float32)
    pixels += noise * np.float32(rng.uniform(2.0, 9.0)) + np.float32(0.5)
    return Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8))


def _write_class(job: tuple[str, int, int, int, int, int]) -> None:
    folder, seed, class_index, per_class, size, digits = job
    for image_index in range(per_class):
        image = render(seed, class_index, image_index, size)
        # No pnginfo, no timestamps: the bytes depend only on the pixels. The noise makes the
        # images nearly incompressible, so the fastest zlib level costs little space.
        path = os.path.join(folder, f"{image_index:0{digits}d}.png")
        image.save(path, format="PNG", compress_level=1)


def _check_arguments(classes: int, per_class: int, size: int, seed: int) -> None:
    for label, value, low in (
        ("classes", classes, 2),
        ("per-class", per_class, 2),
        ("size", size, 16),
        ("seed", seed, 0),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise NearsightError(f"--{label} must be an integer >= {low}, got {value!r}")
    if classes > MAX_CLASSES:
        raise NearsightError(
            f"--classes must be at most {MAX_CLASSES} (the number of distinct "
            f"shape x pattern x colour combinations), got {classes}"
        )


def _check_out(final: Path) -> None:
    """Refuse to replace anything that is not a previous synthetic dataset."""
    if not final.exists():
        return
    if not final.is_dir():
        raise NearsightError(f"cannot write the synthetic dataset to {final}: it is a file")
    if any(final.iterdir()) and not (final / MARKER_FILE).is_file():
        raise NearsightError(
            f"{final} already exists and is not a synthetic dataset (no {MARKER_FILE}): "
            "choose a new --out folder or remove it"
        )


# --- drawing ---------------------------------------------------------------------------------


def _random_colour(rng: np.random.Generator) -> tuple[int, int, int]:
    red, green, blue = (int(v) for v in rng.integers(0, 256, 3))
    return red, green, blue


def _jitter(rng: np.random.Generator, colour: tuple[int, int, int]) -> np.ndarray:
    """A shade of ``colour``: brightness and a little per-channel drift."""
    shade = np.asarray(colour, np.float32) * rng.uniform(0.8, 1.15) + rng.normal(0, 10, 3)
    return np.clip(shade, 0, 255)


def _background(rng: np.random.Generator, size: int) -> Image.Image:
    first, second = rng.integers(0, 256, (2, 3)).astype(np.float32)
    if rng.random() < 0.6:  # a linear gradient at a random angle
        angle = rng.uniform(0, 2 * np.pi)
        axis = np.linspace(-1.0, 1.0, size, dtype=np.float32)
        t = (np.cos(angle) * axis[None, :] + np.sin(angle) * axis[:, None]) * 0.5 + 0.5
        pixels = first + (second - first) * np.clip(t, 0, 1)[..., None]
    else:
        pixels = np.broadcast_to(first, (size, size, 3))
    canvas = Image.fromarray(pixels.astype(np.uint8))
    draw = ImageDraw.Draw(canvas)
    for _ in range(int(rng.integers(2, 9))):  # clutter: small shapes, some in class colours
        if rng.random() < 0.3:
            palette = PALETTES[int(rng.integers(len(PALETTES)))]
            colour = tuple(int(v) for v in _jitter(rng, COLOURS[palette[int(rng.integers(2))]]))
        else:
            colour = _random_colour(rng)
        centre = rng.uniform(0, size, 2)
        radius = rng.uniform(0.03, 0.14) * size
        box = [float(centre[0] - radius), float(centre[1] - radius)]
        box += [float(centre[0] + radius), float(centre[1] + radius)]
        kind = int(rng.integers(3))
        if kind == 0:
            draw.ellipse(box, fill=colour)
        elif kind == 1:
            draw.rectangle(box, fill=colour)
        else:
            draw.line(box, fill=colour, width=max(1, int(radius / 3)))
    return canvas


def _paste_object(
    canvas: Image.Image, rng: np.random.Generator, definition: SynthClass, size: int
) -> None:
    tile = max(8, int(size * rng.uniform(0.45, 0.75)))
    mask = _shape_mask(definition.shape, tile, rng)
    colour_a, colour_b = (_jitter(rng, COLOURS[name]) for name in definition.colours)
    second = _pattern(definition.pattern, tile, rng)
    rgb = np.where(second[..., None], colour_b, colour_a).astype(np.uint8)
    layer = Image.fromarray(rgb)
    angle = float(rng.uniform(0, 360))
    layer = layer.rotate(angle, resample=Image.Resampling.BILINEAR, expand=True)
    mask = mask.rotate(angle, resample=Image.Resampling.BILINEAR, expand=True)
    width, height = layer.size
    # Mostly inside the frame: the centre stays in the middle 70%.
    cx = rng.uniform(0.15, 0.85) * size
    cy = rng.uniform(0.15, 0.85) * size
    canvas.paste(layer, (int(cx - width / 2), int(cy - height / 2)), mask)


def _shape_mask(shape: str, tile: int, rng: np.random.Generator) -> Image.Image:
    mask = Image.new("L", (tile, tile), 0)
    draw = ImageDraw.Draw(mask)
    c = tile / 2
    r = tile / 2 * 0.95
    sx, sy = rng.uniform(0.85, 1.0, 2)  # a little squash, so shapes are not all perfect

    def polygon(points: list[tuple[float, float]]) -> None:
        draw.polygon([(c + x * r * sx, c + y * r * sy) for x, y in points], fill=255)

    def regular(n: int, radius: float = 1.0, phase: float = -np.pi / 2) -> list:
        return [
            (radius * np.cos(phase + 2 * np.pi * k / n), radius * np.sin(phase + 2 * np.pi * k / n))
            for k in range(n)
        ]

    if shape == "circle":
        draw.ellipse([c - r * sx, c - r * sy, c + r * sx, c + r * sy], fill=255)
    elif shape == "triangle":
        polygon(regular(3))
    elif shape == "square":
        polygon(regular(4, phase=np.pi / 4))
    elif shape == "pentagon":
        polygon(regular(5))
    elif shape == "star":
        outer, inner = regular(5), regular(5, 0.45, -np.pi / 2 + np.pi / 5)
        polygon([point for pair in zip(outer, inner, strict=True) for point in pair])
    elif shape == "cross":
        w = 0.36
        polygon(
            [(-w, -1), (w, -1), (w, -w), (1, -w), (1, w), (w, w), (w, 1), (-w, 1), (-w, w),
             (-1, w), (-1, -w), (-w, -w)]
        )  # fmt: skip
    elif shape == "crescent":
        draw.ellipse([c - r * sx, c - r * sy, c + r * sx, c + r * sy], fill=255)
        shift = r * 0.55
        draw.ellipse([c - r + shift, c - r * 0.95, c + r + shift, c + r * 0.95], fill=0)
    else:  # pragma: no cover - SHAPES and this function change together
        raise ValueError(shape)
    return mask


def _pattern(pattern: str, tile: int, rng: np.random.Generator) -> np.ndarray:
    """Boolean map: True where the pattern's second colour goes."""
    period = tile * rng.uniform(0.18, 0.28)
    angle = rng.uniform(0, np.pi)
    axis = np.arange(tile, dtype=np.float32) - tile / 2
    x, y = axis[None, :], axis[:, None]
    u = np.cos(angle) * x + np.sin(angle) * y
    v = -np.sin(angle) * x + np.cos(angle) * y
    offset = rng.uniform(0, period, 2)
    if pattern == "halves":
        return np.broadcast_to(u > 0, (tile, tile))
    if pattern == "stripes":
        return ((u + offset[0]) / period) % 1.0 < 0.5
    if pattern == "dots":
        du = ((u + offset[0]) % period) - period / 2
        dv = ((v + offset[1]) % period) - period / 2
        return du * du + dv * dv < (0.3 * period) ** 2
    if pattern == "checker":
        cells = np.floor((u + offset[0]) / period) + np.floor((v + offset[1]) / period)
        return cells % 2 == 0
    if pattern == "rings":
        return (np.sqrt(x * x + y * y) / (period * 0.8)) % 1.0 < 0.5
    if pattern == "grid":
        line = 0.22 * period
        return ((u + offset[0]) % period < line) | ((v + offset[1]) % period < line)
    raise ValueError(pattern)  # pragma: no cover
