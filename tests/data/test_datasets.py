"""Dataset readers on tiny trees written in each official layout."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from scipy.io import savemat

from nearsight.core.errors import NearsightError
from nearsight.data.datasets import DATASETS, DatasetLayoutError, load_dataset
from nearsight.data.images import ImageLoadError, load_image


def _image(path: Path, shade: int = 0) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (8, 6), (shade % 256, 40, 90)).save(path)


def _assert_layout_error(error: pytest.ExceptionInfo, *fragments: str) -> None:
    message = str(error.value)
    assert isinstance(error.value, DatasetLayoutError)
    assert "\n" not in message
    for fragment in fragments:
        assert fragment in message, message


def _assert_disjoint(dataset: str, root: Path) -> None:
    train = set(load_dataset(dataset, root, "train").labels)
    test = set(load_dataset(dataset, root, "test").labels)
    assert train and test and not train & test
    assert set(load_dataset(dataset, root, "all").labels) == train | test


# --- CUB-200-2011 -----------------------------------------------------------------------------

CUB_CLASSES = {1: "001.Black_footed_Albatross", 2: "002.Laysan_Albatross", 101: "101.White_Pelican",
               102: "102.Western_Wood_Pewee"}  # fmt: skip


def make_cub(folder: Path) -> Path:
    """Classes 1, 2 (train) and 101, 102 (test); 3, 2, 2, 3 images."""
    per_class = {1: 3, 2: 2, 101: 2, 102: 3}
    images, labels = [], []
    image_id = 0
    for class_id, count in per_class.items():
        for index in range(count):
            image_id += 1
            relative = f"{CUB_CLASSES[class_id]}/{CUB_CLASSES[class_id][4:]}_{index:04d}.jpg"
            _image(folder / "images" / relative, image_id)
            images.append(f"{image_id} {relative}")
            labels.append(f"{image_id} {class_id}")
    (folder / "images.txt").write_text("\n".join(images) + "\n")
    (folder / "image_class_labels.txt").write_text("\n".join(labels) + "\n")
    (folder / "classes.txt").write_text(
        "".join(f"{class_id} {name}\n" for class_id, name in CUB_CLASSES.items())
    )
    return folder


def test_cub_splits_labels_and_names(tmp_path):
    root = make_cub(tmp_path / "CUB_200_2011")
    train = load_dataset("cub", root, "train")
    test = load_dataset("cub", root, "test")
    every = load_dataset("cub", root, "all")
    assert (len(train), len(test), len(every)) == (5, 5, 10)
    assert train.class_counts() == {1: 3, 2: 2}
    assert test.class_counts() == {101: 2, 102: 3}
    assert train.class_names == {1: "Black_footed_Albatross", 2: "Laysan_Albatross"}
    assert test.num_classes == 2 and every.num_classes == 4
    first = train.samples[0]
    assert first.path == root / "images/001.Black_footed_Albatross/Black_footed_Albatross_0000.jpg"
    assert load_image(first.path).size == (8, 6)
    assert train.labels == sorted(train.labels)  # sorted by (label, path)
    assert train.name == "cub" and train.split == "train" and train.root == root
    _assert_disjoint("cub", root)


def test_cub_root_may_be_the_parent_folder(tmp_path):
    make_cub(tmp_path / "CUB_200_2011")
    (tmp_path / "attributes").mkdir()  # the official tarball has other folders beside it
    dataset = load_dataset("cub", tmp_path, "test")
    assert dataset.root == tmp_path / "CUB_200_2011"
    assert len(dataset) == 5


@pytest.mark.parametrize("missing", ["image_class_labels.txt", "classes.txt", "images.txt"])
def test_cub_missing_list_file_is_named(tmp_path, missing):
    root = make_cub(tmp_path / "CUB_200_2011")
    (root / missing).unlink()
    with pytest.raises(DatasetLayoutError) as error:
        load_dataset("cub", tmp_path)
    _assert_layout_error(error, "not a CUB-200-2011 folder", str(root), f"has no {missing}")


def test_cub_missing_images_folder_and_bad_lines(tmp_path):
    root = make_cub(tmp_path)
    (root / "images").rename(root / "pictures")
    with pytest.raises(DatasetLayoutError) as error:
        load_dataset("cub", root)
    _assert_layout_error(error, str(root), "has no images/")

    (root / "pictures").rename(root / "images")
    (root / "image_class_labels.txt").write_text("1 1\n2 two\n")
    with pytest.raises(DatasetLayoutError) as error:
        load_dataset("cub", root)
    _assert_layout_error(error, "image_class_labels.txt line 2")


def test_cub_empty_folder_names_the_first_marker(tmp_path):
    with pytest.raises(DatasetLayoutError) as error:
        load_dataset("cub", tmp_path)
    _assert_layout_error(error, f"{tmp_path} has no images.txt", "or one of its sub-folders")
    with pytest.raises(DatasetLayoutError) as error:
        load_dataset("cub", tmp_path / "absent")
    _assert_layout_error(error, "does not exist")


def test_a_listed_image_that_is_missing_fails_when_loaded(tmp_path):
    root = make_cub(tmp_path)
    sample = load_dataset("cub", root, "test").samples[0]
    sample.path.unlink()
    dataset = load_dataset("cub", root, "test")  # reading the lists does not open every image
    assert sample in dataset.samples
    with pytest.raises(ImageLoadError, match="no such file"):
        load_image(sample.path)


# --- CARS196 ----------------------------------------------------------------------------------


def make_cars(folder: Path, per_class: dict[int, int] | None = None) -> Path:
    """Classes 1, 2 (train) and 99, 100 (test) in the official cars_annos.mat layout."""
    per_class = per_class or {1: 2, 2: 3, 99: 3, 100: 2}
    fields = ["relative_im_path", "bbox_x1", "bbox_y1", "bbox_x2", "bbox_y2", "class", "test"]
    records = []
    for class_id, count in per_class.items():
        for _ in range(count):
            number = len(records) + 1
            relative = f"car_ims/{number:06d}.jpg"
            _image(folder / relative, number)
            test_flag = number % 2  # the file's own per-image split, which must be ignored
            records.append(
                (np.array([relative]), np.array([[3]], np.uint8), np.array([[4]], np.uint8),
                 np.array([[60]], np.uint16), np.array([[40]], np.uint16),
                 np.array([[class_id]], np.uint8), np.array([[test_flag]], np.uint8))
            )  # fmt: skip
    annotations = np.zeros((1, len(records)), dtype=[(name, "O") for name in fields])
    for index, record in enumerate(records):
        annotations[0, index] = record
    class_names = np.empty((1, 196), dtype=object)
    for index in range(196):
        class_names[0, index] = np.array([f"Make{index + 1} Model Sedan 2012"])
    savemat(folder / "cars_annos.mat", {"annotations": annotations, "class_names": class_names})
    return folder


def test_cars_splits_ignore_the_test_flag(tmp_path):
    root = make_cars(tmp_path / "cars")
    train = load_dataset("cars", root, "train")
    test = load_dataset("cars", root, "test")
    assert train.class_counts() == {1: 2, 2: 3}
    assert test.class_counts() == {99: 3, 100: 2}
    assert len(load_dataset("cars", root, "all")) == 10
    assert test.class_names == {99: "Make99 Model Sedan 2012", 100: "Make100 Model Sedan 2012"}
    assert train.samples[0].path == root / "car_ims" / "000001.jpg"
    assert load_image(test.samples[-1].path).size == (8, 6)
    _assert_disjoint("cars", root)


def test_cars_root_as_parent_and_a_single_annotation(tmp_path):
    make_cars(tmp_path / "stanford_cars", {1: 1, 150: 1})
    assert len(load_dataset("cars", tmp_path, "test")) == 1
    assert load_dataset("cars", tmp_path, "train").samples[0].class_name == "Make1 Model Sedan 2012"


def test_cars_broken_trees(tmp_path):
    root = make_cars(tmp_path / "cars")
    (root / "car_ims").rename(root / "images")
    with pytest.raises(DatasetLayoutError) as error:
        load_dataset("cars", tmp_path)
    _assert_layout_error(error, "not a CARS196 folder", str(root), "has no car_ims/")

    (root / "cars_annos.mat").write_bytes(b"this is not a MATLAB file" * 10)
    (root / "images").rename(root / "car_ims")
    with pytest.raises(DatasetLayoutError) as error:
        load_dataset("cars", root)
    _assert_layout_error(error, "cannot read", "cars_annos.mat")

    savemat(root / "cars_annos.mat", {"annotations": np.zeros((1, 2))})
    with pytest.raises(DatasetLayoutError) as error:
        load_dataset("cars", root)
    _assert_layout_error(error, "no 'class_names'")

    (root / "cars_annos.mat").unlink()
    with pytest.raises(DatasetLayoutError) as error:
        load_dataset("cars", tmp_path)
    _assert_layout_error(error, f"{tmp_path} has no cars_annos.mat")


# --- Stanford Online Products -----------------------------------------------------------------

SOP_HEADER = "image_id class_id super_class_id path\n"


def make_sop(folder: Path) -> Path:
    """Train classes 1 (bicycle, 2 images) and 2 (cabinet, 3); test classes 3 and 4."""
    rows = {
        "Ebay_train.txt": [(1, 1, "bicycle_final"), (1, 1, "bicycle_final"), (2, 2, "cabinet_final"),
                           (2, 2, "cabinet_final"), (2, 2, "cabinet_final")],
        "Ebay_test.txt": [(3, 1, "bicycle_final"), (3, 1, "bicycle_final"), (4, 3, "chair_final"),
                          (4, 3, "chair_final")],
    }  # fmt: skip
    image_id = 0
    for file_name, entries in rows.items():
        lines = [SOP_HEADER]
        for class_id, super_id, super_folder in entries:
            image_id += 1
            relative = f"{super_folder}/{100000 + class_id}_{image_id}.JPG"
            _image(folder / relative, image_id)
            lines.append(f"{image_id} {class_id} {super_id} {relative}\n")
        (folder / file_name).write_text("".join(lines))
    return folder


def test_sop_splits_and_class_names(tmp_path):
    root = make_sop(tmp_path / "Stanford_Online_Products")
    train = load_dataset("sop", root, "train")
    test = load_dataset("sop", tmp_path, "test")  # root as parent
    assert train.class_counts() == {1: 2, 2: 3}
    assert test.class_counts() == {3: 2, 4: 2}
    assert train.class_names == {1: "bicycle/1", 2: "cabinet/2"}
    assert test.class_names == {3: "bicycle/3", 4: "chair/4"}
    assert test.samples[0].path == root / "bicycle_final" / "100003_6.JPG"
    assert load_image(test.samples[0].path).size == (8, 6)
    _assert_disjoint("sop", root)


def test_sop_broken_trees(tmp_path):
    root = make_sop(tmp_path)
    (root / "Ebay_test.txt").unlink()
    with pytest.raises(DatasetLayoutError) as error:
        load_dataset("sop", root, "train")
    _assert_layout_error(error, "not a Stanford Online Products folder", "has no Ebay_test.txt")

    (root / "Ebay_test.txt").write_text("id class super path\n1 3 1 bicycle_final/x.JPG\n")
    with pytest.raises(DatasetLayoutError) as error:
        load_dataset("sop", root, "test")
    _assert_layout_error(error, "Ebay_test.txt line 1", "image_id class_id super_class_id path")

    (root / "Ebay_test.txt").write_text(SOP_HEADER + "1 three 1 bicycle_final/x.JPG\n")
    with pytest.raises(DatasetLayoutError) as error:
        load_dataset("sop", root, "test")
    _assert_layout_error(error, "Ebay_test.txt line 2")


# --- image folder -----------------------------------------------------------------------------


def test_folder_without_splits_uses_class_disjoint_halves(tmp_path):
    for name, count in {"cat": 2, "ant": 3, "dog": 2, "bee": 1, "eel": 2}.items():
        for index in range(count):
            _image(tmp_path / name / f"{index}.png", index)
    _image(tmp_path / "dog" / "nested" / "deep.JPG")  # found anywhere under the class folder
    _image(tmp_path / "dog" / ".hidden.png")  # hidden: skipped
    _image(tmp_path / ".cache" / "x.png")  # hidden class folder: skipped
    (tmp_path / "dog" / "notes.txt").write_text("not an image")
    (tmp_path / "empty_class").mkdir()  # no images: not a class
    _image(tmp_path / "loose.png")  # not in a class folder: ignored

    train = load_dataset("folder", tmp_path, "train")
    test = load_dataset("folder", tmp_path, "test")
    # sorted classes: ant bee cat dog eel -> labels 0..4; the first 3 (half, rounded up) train
    assert train.class_names == {0: "ant", 1: "bee", 2: "cat"}
    assert test.class_names == {3: "dog", 4: "eel"}
    assert train.class_counts() == {0: 3, 1: 1, 2: 2}
    assert test.class_counts() == {3: 3, 4: 2}
    assert [p.name for p in test.paths[:3]] == ["0.png", "1.png", "deep.JPG"]
    _assert_disjoint("folder", tmp_path)


def test_folder_with_train_and_test_folders(tmp_path):
    for split, names in {"train": ["b", "d"], "test": ["a", "c"]}.items():
        for name in names:
            for index in range(2):
                _image(tmp_path / split / name / f"{index:03d}.png")
    train = load_dataset("folder", tmp_path, "train")
    test = load_dataset("folder", tmp_path, "test")
    assert train.class_names == {1: "b", 3: "d"}  # labels index all four names: a b c d
    assert test.class_names == {0: "a", 2: "c"}
    assert len(load_dataset("folder", tmp_path, "all")) == 8
    _assert_disjoint("folder", tmp_path)


def test_folder_errors(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(DatasetLayoutError) as error:
        load_dataset("folder", tmp_path)
    _assert_layout_error(error, "not an image folder dataset", "no class sub-folders with images")
    with pytest.raises(DatasetLayoutError) as error:
        load_dataset("folder", tmp_path / "missing")
    _assert_layout_error(error, "does not exist")
    _image(tmp_path / "only" / "a.png")
    with pytest.raises(DatasetLayoutError) as error:  # one class: nothing left for test
        load_dataset("folder", tmp_path, "test")
    _assert_layout_error(error, "test split", "has no images")


# --- CSV manifest -----------------------------------------------------------------------------


def test_csv_with_split_column(tmp_path):
    for index in range(4):
        _image(tmp_path / "imgs" / f"{index}.png")
    manifest = tmp_path / "manifest.csv"
    manifest.write_text(
        "path,label,split\nimgs/0.png,zebra,train\nimgs/1.png,zebra,train\n"
        "imgs/2.png,ape,test\nimgs/3.png, ape ,TEST\n"
    )
    train = load_dataset("csv", manifest, "train")
    test = load_dataset("csv", tmp_path, "test")  # a folder with exactly one .csv
    assert train.class_names == {1: "zebra"} and test.class_names == {0: "ape"}
    assert test.paths == [tmp_path / "imgs" / "2.png", tmp_path / "imgs" / "3.png"]
    assert len(load_dataset("csv", manifest, "all")) == 4


def test_csv_without_split_column_uses_halves(tmp_path):
    rows = ["path,label"] + [f"{name}{i}.jpg,{name}" for name in "dcba" for i in range(2)]
    (tmp_path / "list.csv").write_text("\n".join(rows) + "\n")
    assert load_dataset("csv", tmp_path, "train").class_names == {0: "a", 1: "b"}
    assert load_dataset("csv", tmp_path, "test").class_names == {2: "c", 3: "d"}
    _assert_disjoint("csv", tmp_path)


def test_csv_errors(tmp_path):
    with pytest.raises(DatasetLayoutError) as error:
        load_dataset("csv", tmp_path)
    _assert_layout_error(error, "no .csv file")
    (tmp_path / "a.csv").write_text("file,label\nx.png,a\n")
    with pytest.raises(DatasetLayoutError) as error:
        load_dataset("csv", tmp_path)
    _assert_layout_error(error, "a.csv", "no 'path' column")
    (tmp_path / "a.csv").write_text("path,label,split\nx.png,a,val\n")
    with pytest.raises(DatasetLayoutError) as error:
        load_dataset("csv", tmp_path)
    _assert_layout_error(error, "line 2", "train or test")
    (tmp_path / "b.csv").write_text("path,label\n")
    with pytest.raises(DatasetLayoutError) as error:
        load_dataset("csv", tmp_path)
    _assert_layout_error(error, "2 .csv files")


# --- the dispatcher ---------------------------------------------------------------------------


def test_unknown_dataset_or_split(tmp_path):
    with pytest.raises(NearsightError, match="unknown dataset 'imagenet'.*cub, cars, sop"):
        load_dataset("imagenet", tmp_path)
    with pytest.raises(NearsightError, match="unknown split 'val'.*train, test, all"):
        load_dataset("folder", tmp_path, "val")
    assert DATASETS == ("cub", "cars", "sop", "folder", "csv")
