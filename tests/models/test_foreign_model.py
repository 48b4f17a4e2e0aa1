"""A model exported elsewhere (issue 23 item 4): a torchvision network exported to ONNX here,
without nearsight's metadata, indexes a gallery with --input-size/--mean/--std; the gallery
records how to run it, so search, eval, the Python API and a REST query on a real server need
no further flags."""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path

import httpx
import numpy as np
import pytest
from helpers import FAST, assert_one_line_error, run, running_page
from PIL import Image

import nearsight
from nearsight.index.gallery.core import Gallery
from nearsight.models import preprocess

SIZE, DIM = 32, 16
MEAN, STD = (0.5, 0.4, 0.3), (0.25, 0.2, 0.3)


def export_torchvision(
    path: Path, *, fixed_batch: bool = False, any_size: bool = False, seed: int = 0
) -> Path:
    """A random resnet18 whose classifier is a 16-d (unnormalised) embedding, exported by
    torch.onnx itself: input ``pixel_values``, outputs ``logits`` [N, 2] then ``features``."""
    import torch
    import torchvision

    class Tower(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = torchvision.models.resnet18(num_classes=DIM)
            self.head = torch.nn.Linear(DIM, 2)

        def forward(self, pixel_values):
            features = self.net(pixel_values)
            return self.head(features), features

    torch.manual_seed(seed)
    model = Tower().eval()
    dynamic = None if fixed_batch else {"pixel_values": {0: "n"}, "features": {0: "n"}}
    if any_size:
        dynamic = {"pixel_values": {0: "n", 2: "h", 3: "w"}, "features": {0: "n"}}
    with warnings.catch_warnings():  # the TorchScript exporter's deprecation notes
        warnings.simplefilter("ignore", DeprecationWarning)
        torch.onnx.export(
            model,
            (torch.zeros(1, 3, SIZE, SIZE),),
            str(path),
            input_names=["pixel_values"],
            output_names=["logits", "features"],
            dynamic_axes=dynamic,
            dynamo=False,
        )
    return path


def torch_reference(model_path: Path, images: list[Path]) -> np.ndarray:
    """What the model gives for ``images`` run by hand: test transform, (x - mean) / std, the
    ``features`` output, unit length."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(model_path), providers=["CPUExecutionProvider"])
    transform = preprocess.test_transform(SIZE)
    batch = np.stack([transform(Image.open(path).convert("RGB")) for path in images])
    mean = np.asarray(MEAN, np.float32).reshape(1, 3, 1, 1)
    std = np.asarray(STD, np.float32).reshape(1, 3, 1, 1)
    rows = [
        session.run(["features"], {"pixel_values": (one[None] - mean) / std})[0][0]
        for one in batch  # one at a time: the same graph, whatever its batch axis
    ]
    vectors = np.asarray(rows, np.float32)
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


FLAGS = ["--input-size", SIZE, "--mean", *MEAN, "--std", *STD, "--output", "features"]


@pytest.fixture(scope="module")
def foreign(tmp_path_factory):
    from nearsight.app.cli import main
    from nearsight.data.datasets.synthetic import write_synthetic

    root = tmp_path_factory.mktemp("foreign")
    data = root / "data"
    write_synthetic(data, classes=4, per_class=3, size=SIZE)
    model = export_torchvision(root / "tower.onnx")
    gallery = root / "gallery"
    argv = ["index", "build", "--model", model, "--dataset", "folder", "--root", data]
    argv += ["--split", "all", "--out", gallery, *FAST, *FLAGS]
    assert main([str(arg) for arg in argv]) == 0
    yield {"root": root, "data": data, "model": model, "gallery": gallery}
    shutil.rmtree(root, ignore_errors=True)


def test_build_stores_the_spec_and_unit_vectors_of_the_model(foreign):
    with Gallery.open(foreign["gallery"]) as gallery:
        spec = gallery.meta["model_spec"]
        items = gallery.all_items()
        vectors = np.asarray(gallery.embeddings)
    assert spec["input_name"] == "pixel_values" and spec["output_name"] == "features"
    assert spec["mean"] == pytest.approx(MEAN) and spec["std"] == pytest.approx(STD)
    assert (spec["dim"], spec["image_size"], spec["arch"]) == (DIM, SIZE, "onnx")
    assert len(items) == 12 and vectors.shape == (12, DIM)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    expected = torch_reference(foreign["model"], [Path(item["path"]) for item in items])
    np.testing.assert_allclose(vectors, expected, atol=1e-4)


def test_search_eval_and_python_need_no_flags(foreign, capsys):
    query = sorted(foreign["data"].rglob("*.png"))[5]
    code, out, err = run(capsys, "search", "--gallery", foreign["gallery"], query, "--json")
    assert code == 0, err
    hits = json.loads(out)
    assert Path(hits[0]["path"]) == query and hits[0]["distance"] == pytest.approx(0, abs=1e-3)
    code, out, err = run(capsys, "eval", "--gallery", foreign["gallery"], "--json")
    assert code == 0, err
    assert json.loads(out)["queries"] == 12
    with nearsight.open_gallery(foreign["gallery"]) as gallery:
        same = gallery.search(query, k=3)
    assert [hit["id"] for hit in same] == [hit["id"] for hit in hits[:3]]


def test_index_add_embeds_with_the_recorded_spec(foreign, tmp_path, capsys):
    import shutil

    gallery = tmp_path / "gallery"
    shutil.copytree(foreign["gallery"], gallery)
    image = sorted(foreign["data"].rglob("*.png"))[0]
    code, _, err = run(capsys, "index", "add", "--gallery", gallery, image, "--workers", "0")
    assert code == 0, err
    with Gallery.open(gallery) as opened:
        vectors = np.asarray(opened.embeddings)
    np.testing.assert_allclose(
        vectors[-1], torch_reference(foreign["model"], [image])[0], atol=1e-4
    )


def test_rest_query_on_a_real_server(foreign):
    query = sorted(foreign["data"].rglob("*.png"))[7]
    with running_page([foreign["gallery"]]) as (url, _), open(query, "rb") as handle:
        answer = httpx.post(
            f"{url.rstrip('/')}/api/search", files={"image": handle}, data={"k": "3"}, timeout=60
        )
    assert answer.status_code == 200, answer.text
    first = answer.json()["neighbours"][0]
    assert first["distance"] == pytest.approx(0, abs=1e-3)
    with Gallery.open(foreign["gallery"]) as gallery:
        own = next(item for item in gallery.all_items() if Path(item["path"]) == query)
    assert first["id"] == own["id"]


def test_import_with_a_spec_file_and_a_fixed_batch_graph(foreign, tmp_path, capsys):
    """`index import --model-spec` of vectors made elsewhere; the graph here takes batches of
    exactly one image, so image search runs it image by image."""
    model = export_torchvision(tmp_path / "fixed.onnx", fixed_batch=True)
    images = sorted(foreign["data"].rglob("*.png"))
    vectors = torch_reference(model, images)
    np.save(tmp_path / "vectors.npy", vectors)
    rows = ["path,label"] + [f"{path},{number % 4}" for number, path in enumerate(images)]
    (tmp_path / "meta.csv").write_text("\n".join(rows) + "\n")
    spec = {"input_size": SIZE, "mean": list(MEAN), "std": list(STD), "output": "features"}
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    out = tmp_path / "imported"
    code, _, err = run(capsys, "index", "import", "--vectors", tmp_path / "vectors.npy",
                       "--meta", tmp_path / "meta.csv", "--model", model,
                       "--model-spec", tmp_path / "spec.json", "--out", out)  # fmt: skip
    assert code == 0, err
    with nearsight.open_gallery(out) as gallery:
        hits = gallery.search_many(images[:4], k=1)
    assert [Path(hit[0]["path"]) for hit in hits] == images[:4]
    assert all(hit[0]["distance"] == pytest.approx(0, abs=1e-3) for hit in hits)


@pytest.mark.parametrize(
    ("extra", "fragments"),
    [
        ([], ("not a nearsight model", "--input-size")),
        (["--input-size", "32", "--output", "nope"], ("no output 'nope'", "features")),
        (["--input-size", "32", "--std", "0", "1", "1"], ("std must be positive",)),
    ],
)
def test_bad_descriptions_are_one_line_errors(foreign, tmp_path, capsys, extra, fragments):
    out = tmp_path / "gallery"
    code, _, err = run(capsys, "index", "build", "--model", foreign["model"], "--images",
                       sorted(foreign["data"].rglob("*.png"))[0], "--out", out, *FAST, *extra)  # fmt: skip
    assert_one_line_error(code, err, *fragments)
    assert not out.exists()


def test_spec_file_typo_gets_a_suggestion(foreign, tmp_path, capsys):
    (tmp_path / "spec.yaml").write_text("input_size: 32\nmaen: [0.5, 0.5, 0.5]\n")
    code, _, err = run(capsys, "index", "build", "--model", foreign["model"], "--images",
                       sorted(foreign["data"].rglob("*.png"))[0], "--out", tmp_path / "g",
                       "--model-spec", tmp_path / "spec.yaml", *FAST)  # fmt: skip
    assert_one_line_error(code, err, "unknown key 'maen'", "did you mean 'mean'")


def test_a_nearsight_model_refuses_the_foreign_flags(onnx_gallery, tmp_path, capsys):
    code, _, err = run(capsys, "index", "build", "--model", onnx_gallery.model, "--images",
                       onnx_gallery.query, "--out", tmp_path / "g", "--input-size", "32", *FAST)  # fmt: skip
    assert_one_line_error(code, err, "describes itself")


def test_import_without_the_model_refuses_its_description(tmp_path, capsys):
    np.save(tmp_path / "vectors.npy", np.eye(2, dtype=np.float32))
    (tmp_path / "meta.csv").write_text("label\n0\n1\n")
    code, _, err = run(capsys, "index", "import", "--vectors", tmp_path / "vectors.npy",
                       "--meta", tmp_path / "meta.csv", "--input-size", "32",
                       "--out", tmp_path / "g")  # fmt: skip
    assert_one_line_error(code, err, "give it too")
    assert not (tmp_path / "g").exists()


def test_the_page_summary_describes_the_model(foreign):
    from nearsight.app.page.tables import spec_line
    from nearsight.models.spec import spec_from_gallery_meta

    with Gallery.open(foreign["gallery"]) as gallery:
        line = spec_line(spec_from_gallery_meta(gallery.meta))
    assert "exported elsewhere" in line and "mean 0.5 0.4 0.3" in line
    assert "output features" in line and "pooling" not in line


def test_a_resumed_build_does_not_reuse_chunks_of_another_description(foreign, tmp_path,
                                                                      monkeypatch, capsys):  # fmt: skip
    """Chunks embedded with one --mean/--std are not reused by a build with others."""
    import shutil

    from nearsight.index.gallery import build

    out = tmp_path / "gallery"
    argv = ["index", "build", "--model", foreign["model"], "--dataset", "folder", "--root",
            foreign["data"], "--split", "all", "--out", out, *FAST]  # fmt: skip
    with monkeypatch.context() as patch:  # the first build leaves its chunks, as a killed one
        patch.setattr(build.shutil, "rmtree", lambda *args, **kwargs: None)
        code, _, err = run(capsys, *argv, "--input-size", SIZE, "--output", "features")
    assert code == 0, err
    assert (tmp_path / ".gallery.chunks").is_dir()
    code, out_text, err = run(capsys, *argv, *FLAGS)
    assert code == 0, err
    assert "reused" not in out_text
    with Gallery.open(out) as gallery:
        items = gallery.all_items()
        vectors = np.asarray(gallery.embeddings)
    expected = torch_reference(foreign["model"], [Path(item["path"]) for item in items])
    np.testing.assert_allclose(vectors, expected, atol=1e-4)
    shutil.rmtree(tmp_path / ".gallery.chunks", ignore_errors=True)


def test_foreign_specs_round_trip_and_own_specs_keep_their_fields():
    from nearsight.core.errors import NearsightError
    from nearsight.models.spec import ModelSpec

    own = ModelSpec(arch="resnet18", dim=8, image_size=32)
    assert not own.foreign and "mean" not in own.to_dict() and "input_name" not in own.to_dict()
    spec = ModelSpec(arch="onnx", dim=16, image_size=32, input_name="x", output_name="y",
                     mean=[0.5, 0.4, 0.3], std=(0.25, 0.2, 0.3))  # fmt: skip
    assert spec.foreign and spec.mean == MEAN
    assert ModelSpec.from_json(spec.to_json()) == spec
    for bad in ({"mean": (0.5, 0.5)}, {"std": (1, 0, 1)}, {"output_name": ""}, {"mean": "abc"}):
        with pytest.raises(NearsightError, match="model spec"):
            ModelSpec.from_dict({**spec.to_dict(), **bad})
    with pytest.raises(NearsightError, match="needs input_name"):
        ModelSpec(output_name="y")
    # nearsight's own models may carry their in-graph statistics (timm trunks), both or neither
    with pytest.raises(NearsightError, match="std must be 3 numbers"):
        ModelSpec(mean=(0.5, 0.5, 0.5))
    assert not ModelSpec(mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5)).foreign


def test_the_input_size_comes_from_the_graph_when_it_fixes_one(foreign, tmp_path, capsys):
    image = sorted(foreign["data"].rglob("*.png"))[0]
    out = tmp_path / "gallery"
    code, _, err = run(capsys, "index", "build", "--model", foreign["model"], "--images", image,
                       "--out", out, "--mean", *MEAN, "--std", *STD, "--output", "features",
                       *FAST)  # fmt: skip
    assert code == 0, err
    with Gallery.open(out) as gallery:
        assert gallery.meta["model_spec"]["image_size"] == SIZE
        vector = np.asarray(gallery.embeddings)[0]
    np.testing.assert_allclose(vector, torch_reference(foreign["model"], [image])[0], atol=1e-4)
    any_size = export_torchvision(tmp_path / "any.onnx", any_size=True)
    code, _, err = run(capsys, "index", "build", "--model", any_size, "--images", image,
                       "--out", tmp_path / "g2", "--mean", *MEAN, *FAST)  # fmt: skip
    assert_one_line_error(code, err, "takes images of any size", "give its --input-size")
    code, _, err = run(capsys, "index", "build", "--model", any_size, "--images", image,
                       "--out", tmp_path / "g2", "--input-size", SIZE, *FAST)  # fmt: skip
    assert code == 0, err


def onnx_graph(path: Path, nodes: list, output_shape: list, *, batch: int | str = "n",
               initializers: tuple = ()) -> Path:  # fmt: skip
    """A small ONNX graph from ``x`` [batch, 3, SIZE, SIZE] to ``y`` (declared ``output_shape``)."""
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        nodes,
        "probe",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 3, SIZE, SIZE])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, output_shape)],
        initializer=list(initializers),
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def _shape(name: str, values: list[int]):
    from onnx import numpy_helper

    return numpy_helper.from_array(np.asarray(values, np.int64), name)


def test_foreign_models_out_of_bounds_are_refused_before_any_file(foreign, tmp_path, capsys):
    """Issue 33: a model whose embedding is wider than 65,536 values (a 60M-value one took
    11.6 GB and left 10.8 GB on disk), one whose output loses the batch dimension (a
    traceback), one fixed to a batch of 100,000 and one that answers one row for any batch are
    one line and exit 2, with nothing written."""
    from onnx import helper

    mean = helper.make_node("ReduceMean", ["x"], ["m"], keepdims=1)  # [N, 1, 1, 1]
    flat = helper.make_node("Reshape", ["m", "flat"], ["f"])  # [N, 1]
    wide = onnx_graph(tmp_path / "wide.onnx",
                      [mean, flat, helper.make_node("Expand", ["f", "wide"], ["y"])],
                      ["n", 100_000], initializers=(_shape("flat", [-1, 1]),
                                                    _shape("wide", [1, 100_000])))  # fmt: skip
    squeezed = onnx_graph(tmp_path / "squeezed.onnx",
                          [helper.make_node("Reshape", ["x", "all"], ["y"])], ["k"],
                          initializers=(_shape("all", [-1]),))  # fmt: skip
    fixed = onnx_graph(tmp_path / "fixed.onnx", [mean, helper.make_node("Reshape", ["m", "flat"], ["y"])],
                       [100_000, 1], batch=100_000, initializers=(_shape("flat", [-1, 1]),))  # fmt: skip
    one_row = onnx_graph(tmp_path / "one_row.onnx",
                         [helper.make_node("Reshape", ["x", "row"], ["y"])], [1, "k"],
                         initializers=(_shape("row", [1, -1]),))  # fmt: skip
    image = sorted(foreign["data"].rglob("*.png"))[0]
    cases = {wide: ("100,000 values per image", "65,536"),
             squeezed: ("no batch dimension",), fixed: ("100,000 images", "256"),
             one_row: ("is [1, 6144] for a batch of 2", "loses the batch dimension")}  # fmt: skip
    for model, fragments in cases.items():
        out = tmp_path / f"gallery-{model.stem}"
        code, _, err = run(capsys, "index", "build", "--model", model, "--images", image,
                           "--out", out, "--input-size", SIZE, *FAST)  # fmt: skip
        assert_one_line_error(code, err, *fragments)
        assert not out.exists() and not out.with_name(f".{out.name}.chunks").exists()
