"""``nearsight data prepare``: a benchmark's official archive to the layout its reader reads.

For CUB-200-2011, CARS196 and Stanford Online Products: verify the archive's published MD5,
extract it safely (nearsight/data/datasets/extract.py: regular files and folders only,
never a link) into a temporary folder beside ``--out``, check the result with the dataset's own reader (every listed image present; images
that no list names reported as extra) and against the known shape, then rename the folder into
place. A failed check leaves nothing behind.

The known shape (image and class counts, per split) is checked by default only when the archive
is the official one (its MD5 matches): a subset or a re-packed copy passes with the listing
checks alone. ``expect_shape="on"`` checks it for any archive, ``"off"`` never.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from nearsight.core.errors import NearsightError, printable
from nearsight.data.datasets.archives import (
    ArchiveError,
    check_disk_space,
    check_members,
    download,
    list_members,
    md5sum,
)
from nearsight.data.datasets.base import DatasetSplit, is_image_file
from nearsight.data.datasets.extract import extract

EXPECT_SHAPE = ("auto", "on", "off")


@dataclass(frozen=True)
class OfficialFile:
    name: str
    md5: str
    url: str | None  # None: no official location is online any more


@dataclass(frozen=True)
class Benchmark:
    """What the official release of a benchmark looks like."""

    title: str
    archive: OfficialFile
    # split -> (images, classes); the metric learning split the readers apply
    shape: dict[str, tuple[int, int]]
    annotations: OfficialFile | None = None  # CARS196's labels come as a separate .mat file
    note: str = ""  # what to do when there is no download


# The MD5 sums are the ones published with the datasets' loaders in the public record:
# KevinMusgrave/powerful-benchmarker, src/powerful_benchmarker/datasets/cub200.py (CUB_200_2011.tgz),
# cars196.py (car_ims.tgz and cars_annos.mat) and stanford_online_products.py
# (Stanford_Online_Products.zip); the same CUB and SOP sums appear in the dataset code of
# pytorch-metric-learning before v2 and in several DML repositories. The URLs are the datasets'
# official hosts: Caltech DATA for CUB (the vision.caltech.edu address is retired), Stanford's
# CVGL server for SOP. CARS196's host (ai.stanford.edu/~jkrause/car196/) no longer serves it.
BENCHMARKS: dict[str, Benchmark] = {
    "cub": Benchmark(
        title="CUB-200-2011",
        archive=OfficialFile(
            "CUB_200_2011.tgz",
            "97eceeb196236b17998738112f37df78",
            "https://data.caltech.edu/records/65de6-vp158/files/CUB_200_2011.tgz",
        ),
        shape={"all": (11_788, 200), "train": (5_864, 100), "test": (5_924, 100)},
    ),
    "cars": Benchmark(
        title="CARS196",
        archive=OfficialFile("car_ims.tgz", "d5c8f0aa497503f355e17dc7886c3f14", None),
        annotations=OfficialFile("cars_annos.mat", "b407c6086d669747186bd1d764ff9dbc", None),
        shape={"all": (16_185, 196), "train": (8_054, 98), "test": (8_131, 98)},
        note="CARS196's original host (ai.stanford.edu/~jkrause/car196/) is gone: obtain "
        "car_ims.tgz and cars_annos.mat from a copy you trust (a colleague, an institutional "
        "mirror) and run `nearsight data prepare cars --archive car_ims.tgz --annotations "
        "cars_annos.mat --out DIR`; the MD5 check tells you whether they are the originals",
    ),
    "sop": Benchmark(
        title="Stanford Online Products",
        archive=OfficialFile(
            "Stanford_Online_Products.zip",
            "7f73d41a2f44250d4779881525aea32e",
            "ftp://cs.stanford.edu/cs/cvgl/Stanford_Online_Products.zip",
        ),
        shape={"all": (120_053, 22_634), "train": (59_551, 11_318), "test": (60_502, 11_316)},
    ),
}


@dataclass
class PrepareReport:
    name: str
    out: Path
    official: bool  # every MD5 matched the published one
    shape: dict[str, tuple[int, int]]
    extra: list[str] = field(default_factory=list)  # images that no list names
    warnings: list[str] = field(default_factory=list)

    def summary(self, seconds: float) -> str:
        spec = BENCHMARKS[self.name]
        images, classes = self.shape["all"]
        parts = ", ".join(
            f"{s} {self.shape[s][0]:,} in {self.shape[s][1]:,}" for s in ("train", "test")
        )
        origin = "the official archive" if self.official else "an unofficial archive"
        return (
            f"prepared {spec.title} from {origin} in {self.out} in {seconds:.1f}s: {images:,} "
            f"images of {classes:,} classes ({parts}); use --dataset {self.name} --root {self.out}"
        )


def fetch(name: str, archive: Path) -> Path:
    """``--download``: the official archive to ``archive`` (resumed, MD5-checked); kept when it
    is there already with the right MD5."""
    spec = _benchmark(name)
    if spec.archive.url is None:
        raise NearsightError(f"--download: {spec.note}")
    if archive.is_file() and md5sum(archive) == spec.archive.md5:
        return archive
    return download(spec.archive.url, archive, expected_md5=spec.archive.md5)


def prepare(
    name: str,
    archive: Path,
    out: Path,
    *,
    annotations: Path | None = None,
    strict: bool = False,
    expect_shape: str = "auto",
) -> PrepareReport:
    """Extract and check ``archive`` into ``out``; see the module docstring."""
    spec = _benchmark(name)
    if expect_shape not in EXPECT_SHAPE:
        raise NearsightError(f"--expect-shape must be one of {', '.join(EXPECT_SHAPE)}")
    out = Path(out).absolute()
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise NearsightError(f"--out {out} exists and is not empty: choose a new folder")
    if (annotations is None) != (spec.annotations is None):
        needed = (
            f"needs --annotations {spec.annotations.name}"
            if spec.annotations
            else "takes no --annotations"
        )
        raise NearsightError(f"{spec.title} {needed}")
    warnings: list[str] = []
    official = _verify(archive, spec.archive, strict, warnings)
    if spec.annotations is not None and annotations is not None:
        if not annotations.is_file():
            raise NearsightError(f"annotations not found: {annotations}")
        official = _verify(annotations, spec.annotations, strict, warnings) and official
    members = list_members(archive)
    check_members(archive, members)
    check_disk_space(out.parent, sum(member.size for member in members))
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.prepare-", dir=out.parent))
    try:
        extracted = extract(archive, staging, total=len(members))
        if (note := extracted.skipped_note()) is not None:
            _warn(warnings, note)
        if annotations is not None and spec.annotations is not None:
            shutil.copyfile(annotations, staging / spec.annotations.name)
        shape, extra = _check_layout(name, staging, spec)
        if expect_shape == "on" or (expect_shape == "auto" and official):
            _check_shape(spec, shape)
        if extra:
            _warn(
                warnings,
                f"{len(extra)} image(s) in the archive are in no list of {spec.title} and are "
                f"not used (first: {printable(extra[0])})",
            )
        if out.exists():
            out.rmdir()  # empty (checked above)
        os.replace(staging, out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return PrepareReport(name, out, official, shape, extra, warnings)


def _benchmark(name: str) -> Benchmark:
    if name not in BENCHMARKS:
        raise NearsightError(f"unknown benchmark {name!r} (choose one of: {', '.join(BENCHMARKS)})")
    return BENCHMARKS[name]


def _verify(path: Path, official: OfficialFile, strict: bool, warnings: list[str]) -> bool:
    """Whether ``path`` has the published MD5; a mismatch is an error when strict, else a
    warning that names the expected sum."""
    if not path.is_file():
        raise ArchiveError(f"archive not found: {path}")
    actual = md5sum(path, desc=f"md5 {path.name}")
    if actual == official.md5:
        return True
    message = f"{path} has MD5 {actual}, not the published {official.md5} of {official.name}"
    if strict:
        raise ArchiveError(f"{message} (--strict)")
    _warn(warnings, f"{message}: not the official file, so the known counts are not checked")
    return False


def _warn(warnings: list[str], line: str) -> None:
    """Say it now (extraction may take minutes) and keep it for the report."""
    warnings.append(line)
    print(f"nearsight: warning: {line}", file=sys.stderr, flush=True)


def _check_layout(
    name: str, folder: Path, spec: Benchmark
) -> tuple[dict[str, tuple[int, int]], list[str]]:
    """Load every split with the dataset's reader; refuse a listed image that is missing and
    return the shape and the images no list names."""
    from nearsight.data.datasets import load_dataset

    splits: dict[str, DatasetSplit] = {
        s: load_dataset(name, folder, s) for s in ("all", "train", "test")
    }
    every = splits["all"]
    listed = {sample.path for sample in every.samples}
    missing = sorted(path for path in listed if not path.is_file())
    if missing:
        first = str(missing[0].relative_to(every.root))
        raise NearsightError(
            f"{spec.title} archive is incomplete: {len(missing)} listed image(s) missing, "
            f"first {printable(first)}"
        )
    extra = []
    for parent, _, files in os.walk(every.root):
        for file_name in files:
            path = Path(parent) / file_name
            if is_image_file(file_name) and path not in listed:
                extra.append(str(path.relative_to(every.root)))
    shape = {s: (len(split), split.num_classes) for s, split in splits.items()}
    return shape, sorted(extra)


def _check_shape(spec: Benchmark, shape: dict[str, tuple[int, int]]) -> None:
    wrong = [
        f"{split} {have[0]:,} images in {have[1]:,} classes, expected {want[0]:,} in {want[1]:,}"
        for split, want in spec.shape.items()
        if (have := shape[split]) != want
    ]
    if wrong:
        raise NearsightError(
            f"{spec.title} does not have its known shape: {'; '.join(wrong)} "
            "(--expect-shape off to accept a subset)"
        )
