"""``--rerank pairwise:model=FILE`` end to end on a tiny gallery: `rerank train`, then eval,
search and Python through the one route; a re-ranker of another model is refused in one line;
a remote request cannot name a file."""

from __future__ import annotations

import json
import shutil

import pytest
from helpers import assert_one_line_error, free_port, run, server_settings

from nearsight.core.errors import NearsightError
from nearsight.search.rerank.spec import parse_rerank, request_rerank

pytest.importorskip("torch")


def reversing_reranker(model, out, side_dim: int = 0):
    """A re-ranker file for ``model`` whose scores are minus the cosine: it reverses each
    list's first ``depth`` candidates, so a re-ranked answer is known without it."""
    import torch

    from nearsight.core.digest import file_sha256
    from nearsight.training.pairwise import PairScorer, export_scorer

    scorer = PairScorer(8, side_dim=side_dim)
    with torch.no_grad():
        scorer.alpha.fill_(-10.0)
    export_scorer(scorer, out, file_sha256(model), {"side_stage": "layer3"} if side_dim else {})
    return out


def leave_one_out_recall(gallery_folder, reorder) -> float:
    """The oracle of eval --rerank: every item queries the others, its 4 nearest by cosine
    (ties by id) are put in ``reorder(query id, candidate ids)``'s order, and Recall@1 is the
    share whose first is of its class."""
    import numpy as np

    from nearsight.index.gallery.core import Gallery

    with Gallery.open(gallery_folder) as gallery:
        rows = gallery.all_items()
        ids = np.asarray([row["id"] for row in rows])
        labels = np.asarray([row["label"] for row in rows])
        vectors = gallery.vectors_of(ids)
    sims = vectors @ vectors.T
    np.fill_diagonal(sims, -np.inf)
    hits = []
    for query in range(len(ids)):
        order = np.argsort(-sims[query], kind="stable")[:4]
        first = reorder(ids[query], ids[order])[0]
        hits.append(labels[ids == first][0] == labels[query])
    return float(np.mean(hits))


def scored_order(reranker, vectors_of, side_of=None):
    """``reorder`` for :func:`leave_one_out_recall` by the file's own scores."""
    import numpy as np

    def reorder(query, candidates):
        side = None if side_of is None else (side_of([query]), side_of(candidates)[None])
        scores = reranker.scores(vectors_of([query]), vectors_of(candidates)[None], side)[0]
        return candidates[np.argsort(-scores, kind="stable")]

    return reorder


def serve_refused(capsys, monkeypatch, *argv) -> tuple[int, str, str]:
    """``nearsight serve *argv`` in this process, where it must refuse at start (before any
    server): were it to start one, the test fails at once instead of serving. The process's
    exit status and stderr are ``main``'s (tests/app/test_reliability_cli.py refuses serve
    flags the same way)."""
    from nearsight.app import server_app

    def launched(*args, **kwargs):
        raise AssertionError("serve started a server instead of refusing at start")

    monkeypatch.setattr(server_app, "launch_app", launched)
    return run(capsys, "serve", *argv, "--port", free_port())


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
    from nearsight.core.digest import file_sha256
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
    from nearsight.index.gallery.core import Gallery
    from nearsight.search.rerank.pairwise import load_reranker

    with Gallery.open(trained["gallery"]) as opened:
        by_file = scored_order(load_reranker(trained["reranker"]), opened.vectors_of)
        expected = leave_one_out_recall(trained["gallery"], by_file)
    assert json.loads(out)["recall@1"] == pytest.approx(expected, abs=1e-9)
    # a file whose order is known: the 4 nearest reversed
    reverse = reversing_reranker(trained["model"], trained["reranker"].with_name("rev.onnx"))
    reverse_spec = f"pairwise:model={reverse},depth=4"
    code, out, err = run(capsys, "eval", "--gallery", trained["gallery"], "--rerank",
                         reverse_spec, "--json")  # fmt: skip
    assert code == 0, err
    reversed_recall = leave_one_out_recall(trained["gallery"], lambda q, c: c[::-1])
    assert json.loads(out)["recall@1"] == pytest.approx(reversed_recall, abs=1e-9)
    for used in (spec, reverse_spec):
        code, out, err = run(capsys, "search", "--gallery", trained["gallery"], "--id", "3",
                             "--k", "6", "--rerank", used, "--json")  # fmt: skip
        assert code == 0, err
        found = [row["id"] for row in json.loads(out)]
        with nearsight.open_gallery(trained["gallery"]) as gallery:
            python = [n.id for n in gallery.search_item(3, k=6, rerank=used)]
            plain = [n.id for n in gallery.search_item(3, k=6, rerank="none")]
            reorder = by_file if used == spec else (lambda q, c: c[::-1])
            import numpy as np

            # a search by item re-ranks the index's first 4 (the item among them), then puts
            # the item first; the rest keeps the index's order
            head = [int(i) for i in reorder(3, np.asarray(plain[:4])) if i != 3]
            assert python == found == [3, *head, *plain[4:]], (used, plain)
    assert found != plain  # the reversing file did re-order


def test_a_reranker_of_another_model_is_refused_in_one_line(trained, tmp_path, capsys, monkeypatch):
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
    code, _, err = serve_refused(capsys, monkeypatch, "--gallery", trained["gallery"],
                                 "--rerank", spec)  # fmt: skip
    assert_one_line_error(code, err, "trained for model ffffffffffff")
    import nearsight

    with nearsight.open_gallery(trained["gallery"]) as gallery:
        with pytest.raises(NearsightError, match="trained for model"):
            gallery.search_item(0, k=3, rerank=spec)
        with pytest.raises(NearsightError, match="trained for model"):
            gallery.rerank_override = parse_rerank(spec)  # serve --rerank, at start


def test_a_stage_reranker_runs_on_a_gallery_that_stores_its_features(trained, capsys, monkeypatch):
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
    code, _, err = serve_refused(capsys, monkeypatch, "--gallery", gallery, "--rerank", spec)
    assert_one_line_error(code, err, "stores none")

    code, out_text, err = run(capsys, "rerank", "features", "--gallery", gallery, "--stage",
                              "layer3")  # fmt: skip
    assert code == 0, err
    assert "stored layer3 features of 16 items (256-d" in out_text
    code, out_text, err = run(capsys, *evaluate)
    assert code == 0, err
    from nearsight.index.gallery.core import Gallery
    from nearsight.search.rerank.stage_store import open_stage_store

    store = open_stage_store(gallery)
    with Gallery.open(gallery) as opened_store:
        by_file = scored_order(opened, opened_store.vectors_of, store.side_of)
        expected = leave_one_out_recall(gallery, by_file)
    assert json.loads(out_text)["recall@1"] == pytest.approx(expected, abs=1e-9)
    code, out_text, err = run(capsys, *by_id)
    assert code == 0, err
    found = [row["id"] for row in json.loads(out_text)]
    reverse = reversing_reranker(trained["model"], out.with_name("rev3.onnx"), side_dim=256)
    with nearsight.open_gallery(gallery) as opened_gallery:
        assert [n.id for n in opened_gallery.search_item(3, k=6, rerank=spec)] == found
        plain = [n.id for n in opened_gallery.search_item(3, k=6, rerank="none")]
        import numpy as np

        head = [int(i) for i in by_file(3, np.asarray(plain[:4])) if i != 3]
        assert found == [3, *head, *plain[4:]]
        # a stage file whose order is known: the first 4 reversed, the item put first
        turned = opened_gallery.search_item(3, k=6, rerank=f"pairwise:model={reverse},depth=4")
        assert [n.id for n in turned] == [3, *plain[3:0:-1], *plain[4:]]
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
