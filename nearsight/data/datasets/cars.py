"""Stanford Cars / CARS196 (Krause et al., 2013) in its official layout.

``cars_annos.mat`` (MATLAB: a 1xN struct array ``annotations`` with fields ``relative_im_path``,
``bbox_x1``, ``bbox_y1``, ``bbox_x2``, ``bbox_y2``, ``class``, ``test``, and a 1x196 cell
``class_names``) beside ``car_ims/``. The metric learning split (Song et al., 2016): classes
1-98 train, 99-196 test; the file's own ``test`` flag (a per-image split) is ignored, as in the
papers. Bounding boxes are not used: the papers train and test on whole images.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from nearsight.data.datasets.base import (
    DatasetLayoutError,
    DatasetSplit,
    Sample,
    find_root,
    make_split,
    require_dir,
)

TITLE = "CARS196"
MARKERS = ("cars_annos.mat",)
EXPECTED = "cars_annos.mat and car_ims/"
TRAIN_CLASSES = range(1, 99)


def load_cars(root: Path, split: str) -> DatasetSplit:
    folder = find_root(root, MARKERS, TITLE, EXPECTED)
    require_dir(folder / "car_ims", TITLE, EXPECTED)
    mat_path = folder / "cars_annos.mat"
    annotations, names = _read_mat(mat_path)

    samples = []
    for number, record in enumerate(annotations, start=1):
        try:
            relative = str(_scalar(record["relative_im_path"]))
            label = int(_scalar(record["class"]))
        except (ValueError, TypeError, IndexError) as error:
            raise DatasetLayoutError(
                f"{mat_path}: annotation {number} is malformed ({error})"
            ) from None
        if not 1 <= label <= len(names):
            raise DatasetLayoutError(
                f"{mat_path}: annotation {number} has class {label}, "
                f"outside 1..{len(names)} of class_names"
            )
        in_train = label in TRAIN_CLASSES
        if split == "all" or (split == "train") == in_train:
            part = "train" if in_train else "test"
            samples.append(Sample(folder / relative, label, names[label - 1], split=part))
    return make_split("cars", folder, split, samples)


def _read_mat(mat_path: Path) -> tuple[np.ndarray, list[str]]:
    from scipy.io import loadmat  # scipy is slow to import; only CARS needs it

    try:
        mat = loadmat(mat_path)
    except Exception as error:  # scipy raises ValueError, TypeError, OSError, MatReadError...
        reason = " ".join(str(error).split()) or type(error).__name__
        raise DatasetLayoutError(f"cannot read {mat_path} as a MATLAB file: {reason}") from None
    for key in ("annotations", "class_names"):
        if key not in mat:
            raise DatasetLayoutError(f"{mat_path} has no '{key}' variable (not cars_annos.mat?)")
    annotations = np.asarray(mat["annotations"]).ravel()
    fields = annotations.dtype.names or ()
    for field in ("relative_im_path", "class"):
        if field not in fields:
            raise DatasetLayoutError(
                f"{mat_path}: 'annotations' has no field '{field}' (fields: {', '.join(fields)})"
            )
    try:
        names = [str(_scalar(cell)) for cell in np.asarray(mat["class_names"]).ravel()]
    except (ValueError, TypeError, IndexError) as error:
        raise DatasetLayoutError(f"{mat_path}: 'class_names' is malformed ({error})") from None
    return annotations, names


def _scalar(value):
    """MATLAB values come back wrapped in arrays (``array(['x'])``, ``array([[3]])``)."""
    while isinstance(value, np.ndarray):
        if value.size != 1:
            raise ValueError(f"expected one value, got an array of shape {value.shape}")
        value = value.ravel()[0]
    return value.item() if isinstance(value, np.generic) else value
