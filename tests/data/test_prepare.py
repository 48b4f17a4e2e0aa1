"""``nearsight data prepare``: tiny archives in each official layout, checked and extracted."""

from __future__ import annotations

import contextlib
import hashlib
import http.server
import io
import os
import tarfile
import threading
import zipfile
from pathlib import Path

import numpy as np
import pytest
from helpers import assert_one_line_error, run
from PIL import Image

from nearsight.core.errors import NearsightError
from nearsight.data.datasets import load_dataset
from nearsight.data.datasets.archives import ArchiveError, check_disk_space, download
from nearsight.data.datasets.prepare import BENCHMARKS


def jpeg(seed: int) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 255, (8, 8, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="JPEG")
    return buffer.getvalue()


def write_tar(path: Path, files: dict[str, bytes], links: dict[str, str] | None = None) -> Path:
    with tarfile.open(path, "w:gz") as handle:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            handle.addfile(info, io.BytesIO(data))
        for name, target in (links or {}).items():
            info = tarfile.TarInfo(name)
            hard = target.startswith("hard:")
            info.type = tarfile.LNKTYPE if hard else tarfile.SYMTYPE
            info.linkname = target.removeprefix("hard:")
            handle.addfile(info)
    return path


def write_zip(path: Path, files: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w") as handle:
        for name, data in files.items():
            handle.writestr(name, data)
    return path


def cub_files(skip_image: bool = False) -> dict[str, bytes]:
    """CUB_200_2011.tgz's layout: classes 1, 2 (train) and 101, 102 (test), 2 images each."""
    classes = {1: "001.Albatross", 2: "002.Auklet", 101: "101.Wren", 102: "102.Finch"}
    files, images, labels = {}, [], []
    number = 0
    for class_id, name in classes.items():
        for k in range(2):
            number += 1
            relative = f"{name}/{name}_{k}.jpg"
            images.append(f"{number} {relative}")
            labels.append(f"{number} {class_id}")
            files[f"CUB_200_2011/images/{relative}"] = jpeg(number)
    if skip_image:
        del files[f"CUB_200_2011/images/{classes[101]}/{classes[101]}_1.jpg"]
    text = {
        "images.txt": images,
        "image_class_labels.txt": labels,
        "classes.txt": [f"{i} {n}" for i, n in classes.items()],
    }
    for name, lines in text.items():
        files[f"CUB_200_2011/{name}"] = ("\n".join(lines) + "\n").encode()
    return files


def cars_archives(folder: Path) -> tuple[Path, Path]:
    """car_ims.tgz and cars_annos.mat: classes 1, 2 (train) and 99, 100 (test), 2 images each."""
    from scipy.io import savemat

    files, records = {}, []
    for number, class_id in enumerate([1, 1, 2, 2, 99, 99, 100, 100], start=1):
        relative = f"car_ims/{number:06d}.jpg"
        files[relative] = jpeg(number)
        records.append((relative, 1, 1, 8, 8, class_id, number % 2))
    dtype = [(n, "O") for n in ("relative_im_path", "bbox_x1", "bbox_y1", "bbox_x2", "bbox_y2")]
    dtype += [("class", "O"), ("test", "O")]
    annotations = np.array([records], dtype=dtype)
    names = np.empty((1, 196), dtype=object)
    names[0, :] = [f"Car {i}" for i in range(1, 197)]
    mat = folder / "cars_annos.mat"
    savemat(mat, {"annotations": annotations, "class_names": names})
    return write_tar(folder / "car_ims.tgz", files), mat


def sop_files() -> dict[str, bytes]:
    """Stanford_Online_Products.zip's layout: 2 train and 2 test products, 2 images each."""
    header = "image_id class_id super_class_id path"
    files, lists = {}, {"train": [header], "test": [header]}
    number = 0
    for split, class_ids in (("train", (1, 2)), ("test", (3, 4))):
        for class_id in class_ids:
            for k in range(2):
                number += 1
                relative = f"bicycle_final/{class_id}_{k}.JPG"
                files[f"Stanford_Online_Products/{relative}"] = jpeg(number)
                lists[split].append(f"{number} {class_id} 1 {relative}")
    for split, lines in lists.items():
        files[f"Stanford_Online_Products/Ebay_{split}.txt"] = ("\n".join(lines) + "\n").encode()
    return files


def archive_args(name: str, folder: Path) -> list[str]:
    if name == "cub":
        return ["--archive", write_tar(folder / "CUB_200_2011.tgz", cub_files())]
    if name == "cars":
        tgz, mat = cars_archives(folder)
        return ["--archive", tgz, "--annotations", mat]
    return ["--archive", write_zip(folder / "Stanford_Online_Products.zip", sop_files())]


@pytest.mark.parametrize("name", ["cub", "cars", "sop"])
def test_prepare_accepts_each_official_layout(name, tmp_path, capsys):
    out = tmp_path / "data"
    code, stdout, err = run(capsys, "data", "prepare", name, *archive_args(name, tmp_path),
                            "--out", out)  # fmt: skip
    assert code == 0, err
    assert "an unofficial archive" in stdout and "4 in 2" in stdout
    # not the published file: a warning naming the expected MD5, and no count check
    assert BENCHMARKS[name].archive.md5 in err and "warning" in err
    train, test = load_dataset(name, out, "train"), load_dataset(name, out, "test")
    assert (len(train), train.num_classes, len(test), test.num_classes) == (4, 2, 4, 2)
    assert all(path.is_file() for path in train.paths + test.paths)
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no staging


def test_strict_refuses_a_wrong_checksum(tmp_path, capsys):
    out = tmp_path / "data"
    args = archive_args("cub", tmp_path)
    code, _, err = run(capsys, "data", "prepare", "cub", *args, "--out", out, "--strict")
    assert_one_line_error(code, err, "97eceeb196236b17998738112f37df78", "--strict")
    assert not out.exists()


@pytest.mark.parametrize(
    "member", ["../escaped.txt", "CUB_200_2011/../../escaped.txt", "/tmp/nearsight-escaped.txt"]
)
@pytest.mark.parametrize("kind", ["tar", "zip"])
def test_a_member_outside_the_folder_refuses_the_archive(member, kind, tmp_path, capsys):
    files = {**cub_files(), member: b"written outside"}
    work = tmp_path / "work"
    work.mkdir()
    archive = (write_tar if kind == "tar" else write_zip)(tmp_path / f"cub.{kind}", files)
    out = work / "data"
    code, _, err = run(capsys, "data", "prepare", "cub", "--archive", archive, "--out", out)
    assert_one_line_error(code, err, repr(member), "outside the output folder")
    assert not out.exists() and list(work.iterdir()) == []
    assert not (tmp_path / "escaped.txt").exists()
    assert not Path("/tmp/nearsight-escaped.txt").exists()


@pytest.mark.parametrize("target", ["../../../secret", "hard:../secret", "/etc/passwd"])
def test_a_link_out_of_the_folder_refuses_the_archive(target, tmp_path, capsys):
    links = {"CUB_200_2011/images/leak.jpg": target}
    archive = write_tar(tmp_path / "cub.tgz", cub_files(), links)
    code, _, err = run(capsys, "data", "prepare", "cub", "--archive", archive,
                       "--out", tmp_path / "data")  # fmt: skip
    assert_one_line_error(code, err, "leak.jpg", "a link ")
    assert not (tmp_path / "data").exists()


def realpath_overflow_tar(path: Path, files: dict[str, bytes], out: Path) -> Path:
    """CUB's files plus the CVE-2025-4517 chain (as in CPython's test_realpath_limit_attack):
    16 links to folders with names long enough that the resolved path passes PATH_MAX, so
    ``os.path.realpath`` stops resolving and tarfile's ``data`` filter (Python < 3.11.13) and
    a lexical check both take ``escape`` for a folder inside, while it is ``out``'s parent.
    ``escape/newfile`` is then written there, and ``flaglink``, a hard link to
    ``escape/flag``, overwrites that file."""
    import os

    staging = len(str(out.parent)) + 1 + len(f".{out.name}.prepare-") + 8  # prepare's mkdtemp
    steps = "abcdefghijklmnop"
    component = "d" * ((os.pathconf(out.parent, "PC_PATH_MAX") - staging - 1) // 17)
    with tarfile.open(path, "w:gz") as handle:

        def add(name: str, kind: bytes = tarfile.REGTYPE, link: str = "", data: bytes = b""):
            info = tarfile.TarInfo(name)
            info.type, info.linkname, info.size, info.mode = kind, link, len(data), 0o777
            handle.addfile(info, io.BytesIO(data) if kind == tarfile.REGTYPE else None)

        for name, data in files.items():
            add(name, data=data)
        folder = ""
        for step in steps:
            add(os.path.join(folder, component), tarfile.DIRTYPE)
            add(os.path.join(folder, step), tarfile.SYMTYPE, component)
            folder = os.path.join(folder, component)
        last = os.path.join(*steps, "l" * 254)
        add(last, tarfile.SYMTYPE, os.path.join(*[".."] * len(steps)))
        add("escape", tarfile.SYMTYPE, os.path.join(last, ".."))
        add("flaglink", tarfile.LNKTYPE, "escape/flag")
        add("flaglink", data=b"overwritten")
        add("escape/newfile", data=b"written outside")
    return path


def test_a_link_chain_longer_than_path_max_writes_nothing_outside_out(tmp_path, capsys):
    """The CVE-2025-4517 class: on this Python (3.11.7) tarfile's own filter lets it through;
    nearsight creates no link at all, so both writes stay inside --out."""
    work = tmp_path / "a" / "b" / "c"
    work.mkdir(parents=True)
    out = work / "data"
    (work / "flag").write_text("mine")
    archive = realpath_overflow_tar(tmp_path / "CUB_200_2011.tgz", cub_files(), out)
    code, _, err = run(capsys, "data", "prepare", "cub", "--archive", archive, "--out", out)
    assert code == 0, err
    assert (work / "flag").read_text() == "mine"
    assert sorted(p.name for p in work.iterdir()) == ["data", "flag"]
    assert [p.name for p in tmp_path.rglob("newfile")] == ["newfile"]
    assert (out / "escape" / "newfile").read_bytes() == b"written outside"  # a plain folder
    assert (out / "flaglink").read_bytes() == b"overwritten"
    assert not any(path.is_symlink() for path in out.rglob("*"))
    assert "skipped 19 link or special member(s)" in err


def test_links_inside_the_folder_are_skipped_and_counted(tmp_path, capsys):
    links = {"CUB_200_2011/images/alias.jpg": "001.Albatross/001.Albatross_0.jpg",
             "CUB_200_2011/same.txt": "hard:CUB_200_2011/classes.txt"}  # fmt: skip
    archive = write_tar(tmp_path / "cub.tgz", cub_files(), links)
    out = tmp_path / "data"
    code, _, err = run(capsys, "data", "prepare", "cub", "--archive", archive, "--out", out)
    assert code == 0, err
    assert "skipped 2 link or special member(s)" in err and "alias.jpg" in err
    assert not (out / "CUB_200_2011" / "images" / "alias.jpg").exists()
    assert not (out / "CUB_200_2011" / "same.txt").exists()
    zipped = tmp_path / "sop.zip"
    with zipfile.ZipFile(zipped, "w") as handle:
        for name, data in sop_files().items():
            handle.writestr(name, data)
        link = zipfile.ZipInfo("Stanford_Online_Products/link")
        link.external_attr = 0o120777 << 16  # a symbolic link, as Info-ZIP stores one
        handle.writestr(link, "/etc/passwd")
    code, _, err = run(capsys, "data", "prepare", "sop", "--archive", zipped,
                       "--out", tmp_path / "sop")  # fmt: skip
    assert code == 0, err
    assert "skipped 1 link" in err
    assert not (tmp_path / "sop" / "Stanford_Online_Products" / "link").exists()


def test_a_newline_in_a_member_name_cannot_forge_a_line(tmp_path, capsys):
    forged = "CUB_200_2011/images/001.Albatross/x\nnearsight: archive verified.jpg"
    archive = write_tar(tmp_path / "cub.tgz", {**cub_files(), forged: jpeg(7)})
    code, _, err = run(capsys, "data", "prepare", "cub", "--archive", archive,
                       "--out", tmp_path / "data")  # fmt: skip
    assert code == 0, err
    assert not any(line.startswith("nearsight: archive verified") for line in err.splitlines())
    assert "x\\nnearsight: archive verified.jpg" in err  # shown escaped, on the warning's line


def test_a_missing_image_is_named_in_one_line(tmp_path, capsys):
    archive = write_tar(tmp_path / "cub.tgz", cub_files(skip_image=True))
    code, _, err = run(capsys, "data", "prepare", "cub", "--archive", archive,
                       "--out", tmp_path / "data")  # fmt: skip
    assert_one_line_error(code, err, "1 listed image(s) missing", "101.Wren/101.Wren_1.jpg")
    assert list(tmp_path.iterdir()) == [archive]  # the staging folder is gone too


def test_the_known_shape_is_checked_on_request(tmp_path, capsys):
    args = archive_args("sop", tmp_path)
    code, _, err = run(capsys, "data", "prepare", "sop", *args, "--out", tmp_path / "data",
                       "--expect-shape", "on")  # fmt: skip
    assert_one_line_error(
        code, err, "train 4 images in 2 classes, expected 59,551 in 11,318", "--expect-shape off"
    )


def test_extra_images_are_reported(tmp_path, capsys):
    files = {**cub_files(), "CUB_200_2011/images/001.Albatross/stray.jpg": jpeg(99)}
    archive = write_tar(tmp_path / "cub.tgz", files)
    code, _, err = run(capsys, "data", "prepare", "cub", "--archive", archive,
                       "--out", tmp_path / "data")  # fmt: skip
    assert code == 0
    assert "1 image(s) in the archive are in no list" in err and "stray.jpg" in err


def test_cars_needs_its_annotations_and_has_no_download(tmp_path, capsys):
    tgz, _ = cars_archives(tmp_path)
    code, _, err = run(capsys, "data", "prepare", "cars", "--archive", tgz,
                       "--out", tmp_path / "data")  # fmt: skip
    assert_one_line_error(code, err, "--annotations cars_annos.mat")
    code, _, err = run(capsys, "data", "prepare", "cars", "--archive", tmp_path / "x.tgz",
                       "--out", tmp_path / "data", "--download")  # fmt: skip
    assert_one_line_error(code, err, "is gone", "cars_annos.mat")


def test_a_corrupt_archive_and_a_full_disk_are_refused(tmp_path, capsys):
    bad = tmp_path / "CUB_200_2011.tgz"
    bad.write_bytes(b"not an archive at all")
    code, _, err = run(capsys, "data", "prepare", "cub", "--archive", bad,
                       "--out", tmp_path / "data")  # fmt: skip
    assert_one_line_error(code, err, "cannot read", str(bad))
    with pytest.raises(ArchiveError, match="not enough disk space"):
        check_disk_space(tmp_path, 1 << 62)


def test_an_existing_folder_is_not_overwritten(tmp_path, capsys):
    out = tmp_path / "data"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    code, _, err = run(capsys, "data", "prepare", "cub", *archive_args("cub", tmp_path),
                       "--out", out)  # fmt: skip
    assert_one_line_error(code, err, "not empty")
    assert (out / "keep.txt").read_text() == "mine"


class RangeServer:
    """A local HTTP server for one file that honours Range requests (as the datasets' hosts
    do), recording the Range header of each request."""

    def __init__(self, data: bytes):
        ranges = self.ranges = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 - the http.server API
                asked = self.headers.get("Range")
                ranges.append(asked)
                start = int(asked.removeprefix("bytes=").rstrip("-")) if asked else 0
                self.send_response(206 if asked else 200)
                self.send_header("Content-Length", str(len(data) - start))
                self.end_headers()
                self.wfile.write(data[start:])

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/archive.tgz"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def test_download_resumes_a_partial_file_and_checks_the_md5(tmp_path):
    data = np.random.default_rng(0).bytes(300_000)
    md5 = hashlib.md5(data).hexdigest()
    server = RangeServer(data)
    try:
        target = tmp_path / "archive.tgz"
        target.with_name("archive.tgz.part").write_bytes(data[:120_000])  # an interrupted fetch
        assert download(server.url, target, expected_md5=md5) == target
        assert target.read_bytes() == data and server.ranges == ["bytes=120000-"]
        assert not target.with_name("archive.tgz.part").exists()
        other = tmp_path / "other.tgz"
        with pytest.raises(NearsightError, match=f"expected {'0' * 32}"):
            download(server.url, other, expected_md5="0" * 32)
        assert not other.exists() and not other.with_name("other.tgz.part").exists()
    finally:
        server.close()


@pytest.mark.parametrize("kind", ["tar", "zip"])
def test_a_member_1500_folders_deep_is_one_line(kind, tmp_path, capsys):
    """A member 1,500 folders deep: one line and exit 2, nothing written (before: a
    RecursionError traceback from the folder writer)."""
    deep = "CUB_200_2011/" + "a/" * 1500 + "x.jpg"
    archive = (write_tar if kind == "tar" else write_zip)(
        tmp_path / f"cub.{kind}", {**cub_files(), deep: jpeg(3)}
    )
    out = tmp_path / "data"
    code, _, err = run(capsys, "data", "prepare", "cub", "--archive", archive, "--out", out)
    assert_one_line_error(code, err, "1501 folders deep", "at most 64")
    assert "Traceback" not in err and len(err) < 2000
    assert not out.exists()


def test_the_folder_writer_walks_any_depth_in_a_loop(tmp_path):
    """The writer itself makes a folder 1,500 deep (a loop from the deepest one open, not a
    recursion per level) and writes a file there."""
    from nearsight.data.datasets.extract import FolderWriter

    parts = ("a",) * 1500
    try:
        with FolderWriter(tmp_path) as writer:
            writer.write((*parts, "x.txt"), io.BytesIO(b"deep"), 4)
            writer.write((*parts[:3], "y.txt"), io.BytesIO(b"near"), 4)
        assert (tmp_path / "a" / "a" / "a" / "y.txt").read_bytes() == b"near"
        fds = _descend(tmp_path)  # the path is longer than PATH_MAX: through descriptors
        try:
            assert len(fds) == 1501 and os.stat("x.txt", dir_fd=fds[-1]).st_size == 4
        finally:
            for fd in fds:
                os.close(fd)
    finally:  # removed here, however deep: pytest's own clean-up recurses once per level
        _remove_deep(tmp_path)


def _descend(root: Path) -> list[int]:
    """Descriptors of ``root``, ``root/a``, ``root/a/a``, ... as deep as the folders go."""
    fds = [os.open(root, os.O_RDONLY | os.O_DIRECTORY)]
    while True:
        try:
            fds.append(os.open("a", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fds[-1]))
        except OSError:
            return fds


def _remove_deep(root: Path) -> None:
    fds = _descend(root)
    while len(fds) > 1:
        fd = fds.pop()
        for name in os.listdir(fd):
            with contextlib.suppress(OSError):
                os.unlink(name, dir_fd=fd)
        os.close(fd)
        os.rmdir("a", dir_fd=fds[-1])
    os.close(fds[0])
