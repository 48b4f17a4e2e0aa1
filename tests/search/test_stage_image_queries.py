"""A layer3 (stage) re-ranker re-ranks image queries on every route: Python, the CLI (one
image and --queries), REST and the page give the ids of a reference that computes the query's
stage features with StageFeaturizer and re-ranks with them; a vector query, and a gallery
whose store predates the stage model, are refused in one line."""

from __future__ import annotations

import json
import re
import shutil

import numpy as np
import pytest
from helpers import assert_one_line_error, run, server_settings

from nearsight.core.errors import NearsightError

K = 6


def reference_ids(staged, image_path) -> list[int]:
    """The re-ranked ids of a query image, computed without the search's query path: the
    image decoded and preprocessed as a query, embedded and featurised by StageFeaturizer (the
    graph built here with the onnx package), the base search's candidates re-ranked by the
    pipeline with those features."""
    import nearsight
    from nearsight.search.rerank.pipeline import rerank
    from nearsight.search.rerank.sources import OpenGallerySource
    from nearsight.search.rerank.spec import parse_rerank
    from nearsight.search.rerank.stage_features import StageFeaturizer

    spec = parse_rerank(staged["spec"])
    depth = int(spec.params["depth"])
    with nearsight.open_gallery(staged["gallery"]) as searcher:
        query = searcher._read(image_path)
        images = searcher.embedder.preprocess(query.image)[None]
        embedding, features = StageFeaturizer(staged["model"], "layer3").run(images)
        gallery = searcher.gallery
        _, found = gallery.search(embedding, max(K, depth))
        keys, _ = rerank(
            spec, OpenGallerySource(gallery), embedding, found[:, :depth], None, features
        )
    return [int(i) for i in [*keys[0], *found[0, depth:K]] if i >= 0]


def test_an_image_query_reranks_with_its_stage_features(staged):
    import nearsight

    expected = reference_ids(staged, staged["query"])
    with nearsight.open_gallery(staged["gallery"]) as searcher:
        found = searcher.search(staged["query"], k=K, rerank=staged["spec"])
        assert [n.id for n in found] == expected
        plain = [n.id for n in searcher.search(staged["query"], k=K, rerank="none")]
        assert set(expected) == set(plain) and expected[4:] == plain[4:]
        many = searcher.search_many(staged["queries"][:3], k=K, rerank=staged["spec"])
        assert [n.id for n in many[0]] == expected
        assert [[n.id for n in r] for r in many[1:]] == [
            reference_ids(staged, path) for path in staged["queries"][1:3]
        ]
        # an item's own file is searched as that item: its stored features
        item = searcher.gallery.items([3])[0]
        twin = searcher.search(item["path"], k=K, rerank=staged["spec"])
        as_item = searcher.search_item(3, K, rerank=staged["spec"])
        assert [n.id for n in twin] == [n.id for n in as_item]


def test_the_cli_gives_the_ids_python_does(staged, capsys, tmp_path):
    expected = reference_ids(staged, staged["query"])
    code, out, err = run(capsys, "search", "--gallery", staged["gallery"], staged["query"],
                         "--k", K, "--rerank", staged["spec"], "--json")  # fmt: skip
    assert code == 0, err
    assert [row["id"] for row in json.loads(out)] == expected
    folder = tmp_path / "queries"
    folder.mkdir()
    for path in staged["queries"][:3]:
        shutil.copy(path, folder / path.name)
    answers = tmp_path / "answers.jsonl"
    code, _, err = run(capsys, "search", "--gallery", staged["gallery"], "--queries", folder,
                       "--out", answers, "--k", K, "--rerank", staged["spec"])  # fmt: skip
    assert code == 0, err
    lines = [json.loads(line) for line in answers.read_text().splitlines()]
    by_name = {line["query"].rsplit("/", 1)[-1]: [n["id"] for n in line["neighbours"]]
               for line in lines}  # fmt: skip
    for path in staged["queries"][:3]:
        assert by_name[path.name] == reference_ids(staged, path)


def test_rest_and_the_page_give_the_ids_python_does(staged):
    import httpx

    from nearsight.app.page.layout import build_app
    from nearsight.app.server_app import launch_app, stop_app
    from nearsight.search.rerank.spec import parse_rerank

    expected = reference_ids(staged, staged["query"])
    demo = build_app([staged["gallery"]], device="cpu", analyse=False,
                     rerank=parse_rerank(staged["spec"]))  # fmt: skip
    url = launch_app(demo, server_settings())
    try:
        endpoint = url.rstrip("/") + "/api/search"
        with open(staged["query"], "rb") as handle:
            answer = httpx.post(endpoint, data={"k": str(K)}, files={"image": handle},
                                timeout=60)  # fmt: skip
        assert answer.status_code == 200, answer.text
        assert [n["id"] for n in answer.json()["neighbours"]] == expected
        page = demo.nearsight
        vector = page.views[page.names[0]].vector(3).tolist()
        refused = httpx.post(endpoint, json={"vector": vector, "k": K}, timeout=60)
        assert refused.status_code == 400, refused.text
        assert "a vector query has no image" in refused.json()["error"]
        found = json.loads(page.api_search(str(staged["query"]), K, None))
        assert [row["id"] for row in found] == expected
        grid, _, _ = page.upload_grid(page.names[0], str(staged["query"]), K, None, "", True)
        cells = re.findall(r'class="ns-cell" data-rank="\d+" data-id="(\d+)"', grid)
        assert [int(i) for i in cells] == expected  # the page's upload, re-rank box on
    finally:
        stop_app(demo)


def test_a_vector_query_is_refused_in_one_line(staged, capsys, tmp_path):
    import nearsight

    with nearsight.open_gallery(staged["gallery"]) as searcher:
        vector = searcher.vector(3)
        with pytest.raises(NearsightError, match="a vector query has no image") as error:
            searcher.search_vector(vector, k=3, rerank=staged["spec"])
        assert "\n" not in str(error.value)
    np.save(tmp_path / "q.npy", vector)
    code, _, err = run(capsys, "search", "--gallery", staged["gallery"], "--vector",
                       tmp_path / "q.npy", "--rerank", staged["spec"])  # fmt: skip
    assert_one_line_error(code, err, "a vector query has no image", "layer3")


def test_a_store_without_its_stage_model_asks_for_rerank_features_again(staged, capsys,
                                                                       tmp_path):  # fmt: skip
    from nearsight.search.rerank.stage_store import META, MODEL

    gallery = tmp_path / "gallery"
    shutil.copytree(staged["gallery"], gallery)
    meta = json.loads((gallery / META).read_text())
    for key in ("stage_model", "stage_model_sha256"):  # as an older nearsight wrote it
        meta.pop(key)
    (gallery / MODEL).unlink()
    (gallery / META).write_text(json.dumps(meta))
    search = ["search", "--gallery", gallery, "--k", K, "--rerank", staged["spec"]]
    code, _, err = run(capsys, *search, staged["query"])
    assert_one_line_error(code, err, f"rerank features --gallery {gallery} --stage layer3",
                          "again")  # fmt: skip
    code, out, err = run(capsys, *search, "--id", "3", "--json")  # item searches still run
    assert code == 0, err
    # a stage model that is not the recorded one is refused too
    code, _, err = run(capsys, "rerank", "features", "--gallery", gallery, "--stage", "layer3")
    assert code == 0, err
    (gallery / MODEL).write_bytes((gallery / MODEL).read_bytes() + b"\0")
    code, _, err = run(capsys, *search, staged["query"])
    assert_one_line_error(code, err, "not the stage model", "again")


def test_the_store_gives_back_its_float16_rows_exactly(tmp_path):
    """side_of's float16 -> float32 table gives what astype gives, for every kind of half
    (zero, subnormal, the largest), in the order asked, repeats included."""
    from nearsight.search.rerank.stage_store import open_stage_store, write_stage_store

    rng = np.random.default_rng(0)
    features = np.abs(rng.normal(size=(50, 24))).astype(np.float32)
    features[0, :3] = [0.0, 6e-8, 65504.0]  # zero, a subnormal half, the largest half
    ids = rng.permutation(np.arange(100, 150))
    write_stage_store(tmp_path, "layer3", "0" * 64, ids, features)
    store = open_stage_store(tmp_path)
    wanted = np.array([ids[0], ids[7], ids[0], ids[49]])
    rows = [int(np.flatnonzero(ids == i)[0]) for i in wanted]
    expected = features[rows].astype(np.float16).astype(np.float32)
    got = store.side_of(wanted)
    assert got.dtype == np.float32 and np.array_equal(got, expected)
    assert got[0, 1] > 0  # the subnormal survives
    with pytest.raises(NearsightError, match="stores no layer3 features for item 7"):
        store.side_of(np.array([ids[1], 7]))
