"""``--rerank pairwise:model=FILE`` end to end on a tiny gallery: `rerank train`, then eval,
search and Python through the one route; a re-ranker of another model is refused in one line;
a remote request cannot name a file."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest
from helpers import assert_one_line_error, cli_argv, free_port, run, server_settings

from nearsight.core.errors import NearsightError
from nearsight.search.rerank.spec import parse_rerank, request_rerank

pytest.importorskip("torch")


@pytest.fixture(scope="module")
def trained(onnx_gallery, tmp_path_factory):
    """8 synthetic classes (4 train, 4 test), a gallery of the test split with the session's
    ONNX model, and a re-ranker trained for that model on the train split."""
    from nearsight.app.cli import main
    from nearsight.data.datasets.synthetic import write_synthetic

    root = tmp_path_factory.mktemp("pairwise")
    data = root / "data"
    write_synthetic(data, classes=8, per_class=4, size=32, seed=3)
    gallery = root / "gallery"
    build = ["index", "build", "--model", str(onnx_gallery.model), "--dataset", "folder"]
    assert main([*build, "--root", str(data), "--split", "test", "--out", str(gallery)]) == 0
    out = root / "reranker.onnx"
    argv = ["rerank", "train", "--model", str(onnx_gallery.model), "--dataset", "folder"]
    argv += ["--root", str(data), "--out", str(out), "--depth", "4", "--epochs", "2", "--json"]
    assert main(argv) == 0
    yield {"data": data, "gallery": gallery, "reranker": out, "model": onnx_gallery.model}
    shutil.rmtree(root, ignore_errors=True)


def test_rerank_train_reports_and_records_the_model(trained, capsys):
    from nearsight.models.embedder import file_sha256
    from nearsight.search.rerank.pairwise import load_reranker

    opened = load_reranker(trained["reranker"])
    assert opened.model_sha256 == file_sha256(trained["model"])
    assert opened.meta["depth"] == "4" and opened.meta["dataset"] == "folder"
    # the train split's classes only: the folder loader puts classes 0-3 in train
    classes = opened.meta["fit_classes"].split(",") + opened.meta["held_out_classes"].split(",")
    assert sorted(map(int, classes)) == [0, 1, 2, 3]


def test_eval_search_and_python_rerank_with_it(trained, capsys):
    import nearsight

    spec = f"pairwise:model={trained['reranker']},depth=4"
    code, out, err = run(
        capsys, "eval", "--gallery", trained["gallery"], "--rerank", spec, "--json"
    )
    assert code == 0, err
    assert 0 <= json.loads(out)["recall@1"] <= 1
    code, out, err = run(capsys, "search", "--gallery", trained["gallery"], "--id", "3",
                         "--k", "6", "--rerank", spec, "--json")  # fmt: skip
    assert code == 0, err
    found = json.loads(out)
    assert found[0]["id"] == 3 and len(found) == 6  # the item itself first, as always
    with nearsight.open_gallery(trained["gallery"]) as gallery:
        python = gallery.search_item(3, k=6, rerank=spec)
        assert [n.id for n in python] == [row["id"] for row in found]
        plain = gallery.search_item(3, k=6, rerank="none")
        # re-ordered within the first 4 others at most; the rest is the index's order
        assert {n.id for n in python} == {n.id for n in plain}
        assert [n.id for n in python][5:] == [n.id for n in plain][5:]


def test_a_reranker_of_another_model_is_refused_in_one_line(trained, tmp_path, capsys):
    from nearsight.training.pairwise import PairScorer, export_scorer

    other = tmp_path / "other.onnx"
    export_scorer(PairScorer(8), other, "f" * 64)
    spec = f"pairwise:model={other}"
    for argv in (
        ["eval", "--gallery", trained["gallery"], "--rerank", spec],
        ["search", "--gallery", trained["gallery"], "--id", "0", "--rerank", spec],
    ):
        code, _, err = run(capsys, *argv)
        assert_one_line_error(code, err, "trained for model ffffffffffff", "rerank train")
    serve = cli_argv("serve", "--gallery", trained["gallery"], "--rerank", spec,
                     "--port", free_port())  # fmt: skip
    done = subprocess.run(serve, capture_output=True, text=True, timeout=180)  # refused at start
    assert_one_line_error(done.returncode, done.stderr, "trained for model ffffffffffff")
    import nearsight

    with nearsight.open_gallery(trained["gallery"]) as gallery:
        with pytest.raises(NearsightError, match="trained for model"):
            gallery.search_item(0, k=3, rerank=spec)
        with pytest.raises(NearsightError, match="trained for model"):
            gallery.rerank_override = parse_rerank(spec)  # serve --rerank, at start


def test_a_stage_reranker_runs_on_a_gallery_that_stores_its_features(trained, capsys):
    """rerank train --stage layer3 writes a format-2 file of the same model; a gallery without
    stored layer3 features refuses it in one line (eval, search, serve at start); rerank
    features stores them, and then eval and searches by item id re-rank with it."""
    import nearsight
    from nearsight.search.rerank.pairwise import load_reranker

    out = trained["reranker"].with_name("staged.onnx")
    code, _, err = run(capsys, "rerank", "train", "--model", trained["model"], "--dataset",
                       "folder", "--root", trained["data"], "--out", out, "--depth", "4",
                       "--epochs", "2", "--stage", "layer3", "--json")  # fmt: skip
    assert code == 0, err
    opened = load_reranker(out)
    assert (opened.meta["format"], opened.side_stage, opened.side_dim) == ("2", "layer3", 256)
    spec = f"pairwise:model={out},depth=4"
    gallery = trained["gallery"]
    evaluate = ["eval", "--gallery", gallery, "--rerank", spec, "--json"]
    by_id = ["search", "--gallery", gallery, "--id", "3", "--k", "6", "--rerank", spec, "--json"]
    for argv in (evaluate, by_id):
        code, _, err = run(capsys, *argv)
        assert_one_line_error(code, err, "stores none", "rerank features --gallery")
    serve = cli_argv("serve", "--gallery", gallery, "--rerank", spec, "--port", free_port())
    done = subprocess.run(serve, capture_output=True, text=True, timeout=180)  # refused at start
    assert_one_line_error(done.returncode, done.stderr, "stores none")

    code, out_text, err = run(capsys, "rerank", "features", "--gallery", gallery, "--stage",
                              "layer3")  # fmt: skip
    assert code == 0, err
    assert "stored layer3 features of 16 items (256-d" in out_text
    code, out_text, err = run(capsys, *evaluate)
    assert code == 0, err
    assert 0 <= json.loads(out_text)["recall@1"] <= 1
    code, out_text, err = run(capsys, *by_id)
    assert code == 0, err
    found = [row["id"] for row in json.loads(out_text)]
    with nearsight.open_gallery(gallery) as opened_gallery:
        assert [n.id for n in opened_gallery.search_item(3, k=6, rerank=spec)] == found
        plain = [n.id for n in opened_gallery.search_item(3, k=6, rerank="none")]
        assert found[0] == 3 and set(found) == set(plain) and found[5:] == plain[5:]
        # a vector query has no image, so no stage features: refused in one line
        vector = opened_gallery.gallery.vectors_of([3])[0]
        with pytest.raises(NearsightError, match="a vector query has no image"):
            opened_gallery.search_vector(vector, k=3, rerank=spec)
    # a different stage stored: refused, naming the fix
    code, _, err = run(capsys, "rerank", "features", "--gallery", gallery, "--stage", "layer2")
    assert code == 0, err
    code, _, err = run(capsys, *by_id)
    assert_one_line_error(code, err, "stores none", "--stage layer3")


def test_files_that_are_not_rerankers_are_refused(trained, tmp_path, capsys):
    missing = tmp_path / "nothing.onnx"
    code, _, err = run(capsys, "search", "--gallery", trained["gallery"], "--id", "0",
                       "--rerank", f"pairwise:model={missing}")  # fmt: skip
    assert_one_line_error(code, err, "nothing.onnx")
    code, _, err = run(capsys, "search", "--gallery", trained["gallery"], "--id", "0",
                       "--rerank", f"pairwise:model={trained['model']}")  # fmt: skip
    assert_one_line_error(code, err, "not a nearsight pairwise re-ranker")
    with pytest.raises(SystemExit) as stopped:  # argparse: usage and one error line
        run(capsys, "search", "--gallery", trained["gallery"], "--id", "0", "--rerank", "pairwise")
    assert stopped.value.code == 2 and "pairwise:model=FILE" in capsys.readouterr().err


def test_rerank_train_refuses_bad_input_in_one_line(trained, tmp_path, capsys):
    base = ["rerank", "train", "--model", trained["model"], "--dataset", "folder",
            "--root", trained["data"]]  # fmt: skip
    code, _, err = run(capsys, *base, "--out", tmp_path / "r.txt")
    assert_one_line_error(code, err, ".onnx")
    code, _, err = run(capsys, *base, "--out", tmp_path / "r.onnx", "--depth", "1")
    assert_one_line_error(code, err, "--depth")
    code, _, err = run(capsys, *base, "--out", tmp_path / "none" / "r.onnx")
    assert_one_line_error(code, err, "does not exist")
    assert not (tmp_path / "r.onnx").exists()


def test_a_request_uses_only_the_servers_reranker():
    served = parse_rerank("pairwise:model=/srv/r.onnx,depth=20")
    assert request_rerank("pairwise", served).params == {"model": "/srv/r.onnx", "depth": 20}
    assert request_rerank("pairwise:depth=8", served).params["depth"] == 8
    assert request_rerank("pairwise:model=/srv/r.onnx", served).params["model"] == "/srv/r.onnx"
    with pytest.raises(ValueError, match="only the server's"):
        request_rerank("pairwise:model=/etc/passwd", served)
    with pytest.raises(ValueError, match="no pairwise re-ranker"):
        request_rerank("pairwise", parse_rerank("aqe"))
    assert request_rerank("aqe:k=3", served).method == "aqe"


def test_the_spec_reads_and_writes_the_model_path():
    spec = parse_rerank("pairwise:model=/a/b c.onnx,depth=30")
    assert spec.params == {"model": "/a/b c.onnx", "depth": 30}
    assert parse_rerank(str(spec)) == spec
    with pytest.raises(ValueError, match="out of range"):
        parse_rerank("pairwise:model=x.onnx,depth=100000")


def test_rest_reranks_with_the_servers_file_and_refuses_a_named_one(trained, tmp_path):
    import httpx

    from nearsight.app.page.layout import build_app
    from nearsight.app.server_app import launch_app, stop_app

    spec = parse_rerank(f"pairwise:model={trained['reranker']},depth=4")
    demo = build_app([trained["gallery"]], device="cpu", analyse=False, rerank=spec)
    url = launch_app(demo, server_settings())
    try:
        endpoint = url.rstrip("/") + "/api/search"
        answer = httpx.post(endpoint, data={"id": "2", "k": "5"}, timeout=60)
        assert answer.status_code == 200, answer.text
        assert answer.json()["rerank"].startswith("pairwise:")
        answer = httpx.post(endpoint, data={"id": "2", "rerank": "pairwise:depth=3"}, timeout=60)
        assert answer.status_code == 200 and answer.json()["rerank"].endswith("depth=3")
        named = httpx.post(endpoint, data={"id": "2", "rerank": "pairwise:model=/etc/hostname"},
                           timeout=60)  # fmt: skip
        assert named.status_code == 422 and "only the server's" in named.text
    finally:
        stop_app(demo)
