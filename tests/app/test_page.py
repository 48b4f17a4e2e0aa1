"""The Gradio page of `nearsight serve` (nearsight/app/page/layout.py): the real server on 127.0.0.1, queried
through gradio_client and plain HTTP, over a tiny gallery (synthetic images, a random tiny
network: its top-1 is often wrong, which the failure list needs)."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch
from gradio_client import Client, handle_file
from gradio_client.exceptions import AppError
from helpers import TinyGallery, free_port, running_page, started, stop_process
from PIL import Image

from nearsight.app.cli import main
from nearsight.app.page.layout import build_app
from nearsight.app.page.view import GalleryView
from nearsight.index.gallery.core import Gallery
from nearsight.models.checkpoint import save_checkpoint
from nearsight.models.embedding import EmbeddingConfig, build_embedding_net
from nearsight.models.loading import load_embedder
from nearsight.search.analysis import Failure, confused_pairs, pair_distance_histogram
from nearsight.search.evaluate import evaluate_gallery
from nearsight.search.neighbour import FIELDS
from nearsight.search.served import gallery_names


@pytest.fixture(scope="module")
def tiny(tiny_once):
    """The session's tiny gallery (helpers.make_tiny_gallery): this module only reads it
    (and writes new files beside it)."""
    return tiny_once


MAX_UPLOAD_MB = 0.25  # small, so that the oversized upload in the test is small too


@pytest.fixture(scope="module")
def test_split_gallery(tiny) -> Path:
    """A second gallery: the test split only (classes 3-5)."""
    out = tiny.root / "gallery-test"
    argv = ["index", "build", "--model", str(tiny.model), "--dataset", "folder"]
    argv += ["--root", str(tiny.data), "--split", "test", "--out", str(out), "--workers", "0"]
    assert main(argv) == 0
    return out


@pytest.fixture(scope="module")
def server(tiny, test_split_gallery):
    """(url, demo): the page over both galleries, served on 127.0.0.1 for the whole module."""
    with running_page([tiny.gallery, test_split_gallery], max_upload_mb=MAX_UPLOAD_MB) as served:
        yield served


@pytest.fixture(scope="module")
def client(server):
    return Client(server[0], verbose=False)


def reference_neighbours(tiny: TinyGallery, image_path: str | Path, k: int):
    """(ids, distances) straight from the gallery and the embedder, no server."""
    embedder = load_embedder(tiny.model, device="cpu")
    with Gallery.open(tiny.gallery) as gallery:
        from nearsight.data.images import load_image

        distances, ids = gallery.search(embedder.embed_images([load_image(image_path)]), k)
    return ids[0].tolist(), distances[0].tolist()


def cells(html: str) -> list[dict[str, str]]:
    """data-* attributes of each grid cell of a result HTML."""
    found = []
    for tag in re.findall(r'<figure class="ns-cell"[^>]*>', html):
        found.append(dict(re.findall(r'data-([a-z-]+)="([^"]*)"', tag)))
    return found


# -- the /search API through gradio_client ------------------------------------------------------


def test_search_api_returns_the_k_nearest_as_json(tiny, client):
    item = tiny.items[5]
    rows = json.loads(client.predict(handle_file(item["path"]), api_name="/search"))
    assert len(rows) == 8  # the default k
    for row in rows:
        assert set(row) == set(FIELDS)
    distances = [row["distance"] for row in rows]
    assert distances == sorted(distances)
    # an uploaded gallery file is searched as that item: first, at distance exactly 0
    assert rows[0]["id"] == item["id"] and rows[0]["distance"] == 0.0
    assert item["path"].endswith("/" + rows[0]["path"]) and rows[0]["label"] == item["label"]
    ids, reference = reference_neighbours(tiny, item["path"], 8)
    assert [row["id"] for row in rows] == ids
    np.testing.assert_allclose(distances, reference, atol=1e-5)


def test_search_api_takes_k_and_the_gallery_name(tiny, client):
    path = tiny.items[0]["path"]
    rows = json.loads(client.predict(handle_file(path), 3, "gallery", api_name="/search"))
    assert [row["id"] for row in rows] == reference_neighbours(tiny, path, 3)[0]
    with pytest.raises(AppError, match="no gallery named 'nope'"):
        client.predict(handle_file(path), 3, "nope", api_name="/search")
    with pytest.raises(AppError, match="k must be a whole number from 1 to 64"):
        client.predict(handle_file(path), 0, "gallery", api_name="/search")


def test_each_gallery_is_searched_by_its_name(tiny, client, server):
    page = server[1].nearsight
    assert page.names == ["gallery", "gallery-test"]
    path = tiny.items[0]["path"]  # a train image: not in the test-split gallery
    rows = json.loads(client.predict(handle_file(path), 12, "gallery-test", api_name="/search"))
    test_rows = page.views["gallery-test"].rows()
    assert len(rows) == 12 and all("/data/test/" in test_rows[row["id"]]["path"] for row in rows)
    assert not any(row["path"].startswith("/") for row in rows)  # no server paths
    rows = json.loads(client.predict(handle_file(path), 1, api_name="/search"))
    assert path.endswith("/" + rows[0]["path"])  # the default gallery is the first one
    query_class, pick_class, header, *_ = page.gallery_changed("gallery-test")
    labels = [value for _, value in query_class["choices"]]
    assert labels == ["-1", "3", "4", "5"]
    assert [value for _, value in pick_class["choices"]] == labels
    assert "12 items (12 labelled), 3 classes" in header


def test_an_unlabelled_gallery_is_searchable_and_says_why_it_has_no_failure_list(tiny):
    out = tiny.root / "loose"
    images = [row["path"] for row in tiny.items[:3]]
    argv = ["index", "build", "--model", str(tiny.model), "--images", *images]
    assert main([*argv, "--out", str(out), "--workers", "0"]) == 0
    demo = build_app([out], device="cpu", analyse=False)
    page = demo.nearsight
    try:
        html, _, _ = page.item_grid("loose", 0, 8)
        assert [c["correct"] for c in cells(html)] == ["unknown", "unknown"]  # 3 items - 1
        failures, pairs, note, _, summary, metrics, plot = page.analysis_outputs("loose")
        assert failures.empty and pairs.empty and metrics.empty and plot.empty
        assert "the gallery has 0 labelled items" in note
        assert "leave-one-out evaluation: not available" in summary
        grid, _, _, item, query_image = page.random_item("loose", "-1", 8)
        # the item box shows the item (no key column: its id); the upload leaves the query box
        assert item in ("0", "1", "2") and len(cells(grid)) == 2 and query_image is None
    finally:
        page.close()


def test_gallery_names_are_unique():
    assert gallery_names(["/a/g", "/b/g", "/c/h"]) == ["a/g", "b/g", "h"]
    assert gallery_names(["/a/g", "/a/g/"]) == ["a/g", "a/g (2)"]


def test_a_non_image_upload_gets_a_clear_message_and_the_server_lives_on(tiny, client, server):
    """Refused by the upload route before it is stored (nearsight/app/serve/uploads.py), with
    a line naming the file; the server lives on."""
    url, _ = server
    text = tiny.root / "notes.png"  # an image name, text inside
    text.write_text("this is not an image")
    with pytest.raises(httpx.HTTPStatusError, match="415"):
        client.predict(handle_file(text), api_name="/search")
    answer = httpx.post(
        f"{url}gradio_api/upload", files={"files": ("notes.png", text.read_bytes())}, timeout=30
    )
    assert answer.status_code == 415
    assert answer.text.startswith("cannot read image notes.png: not an image")
    assert "Traceback" not in answer.text and str(tiny.root) not in answer.text  # no server paths
    empty = tiny.root / "empty.jpg"
    empty.write_bytes(b"")
    answer = httpx.post(f"{url}gradio_api/upload", files={"files": ("empty.jpg", b"")}, timeout=30)
    assert (
        answer.status_code == 415
        and "cannot read image empty.jpg: the file is empty" in answer.text
    )
    rows = json.loads(client.predict(handle_file(tiny.items[1]["path"]), api_name="/search"))
    assert rows[0]["id"] == tiny.items[1]["id"]


def test_an_oversized_upload_is_refused(tiny, server):
    url, _ = server
    big = tiny.root / "big.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (400, 400, 3), np.uint8)).save(big)
    assert big.stat().st_size > MAX_UPLOAD_MB * 1024 * 1024
    with open(big, "rb") as handle:
        response = httpx.post(f"{url}gradio_api/upload", files={"files": handle}, timeout=30)
    assert response.status_code == 413
    with pytest.raises(Exception, match="413|[Ff]ile size|too large"):
        Client(url, verbose=False).predict(handle_file(big), api_name="/search")


def test_no_file_outside_gradios_upload_cache_can_be_fetched(tiny, server):
    url, _ = server
    image = tiny.items[0]["path"]
    image_folder = Path(image).parent
    attempts = [
        "/etc/passwd",
        str(tiny.secret),
        str(tiny.link),  # a symlink inside a gallery image folder, pointing outside
        image,  # gallery images are shown as thumbnails, never served by path
        str(tiny.gallery / "catalog.db"),
        f"{image_folder}/../../../secret.txt",
        f"{image_folder}/%2e%2e/%2e%2e/%2e%2e/secret.txt",
        "../../../../../../etc/passwd",
        "%2e%2e/%2e%2e/%2e%2e/%2e%2e/etc/passwd",
    ]
    with httpx.Client(timeout=10) as http:
        for target in attempts:
            for route in ("gradio_api/file=", "gradio_api/file/", "file="):
                response = http.get(f"{url}{route}{target}")
                assert response.status_code >= 400, f"{route}{target} was served"
                assert b"top secret" not in response.content
                assert b"root:" not in response.content
                assert not response.content.startswith(b"\x89PNG")


# -- the page's handlers (what the browser test clicks), called directly -----------------------


def test_a_gallery_query_leaves_itself_out(tiny, server):
    page = server[1].nearsight
    view = page.view("gallery")
    item = tiny.items[9]
    html, _, state = page.item_grid("gallery", item["id"], 5)
    assert state == {"kind": "item", "id": item["id"]}
    found = cells(html)
    assert [c["rank"] for c in found] == ["1", "2", "3", "4", "5"]
    ids = [int(c["id"]) for c in found]
    assert item["id"] not in ids
    # the same order as searching the stored embedding one deeper and dropping the query
    vector = view.item_vector(item["id"])
    _, deeper = view.gallery.search(vector[None, :], 6)
    assert ids == [i for i in deeper[0].tolist() if i != item["id"]][:5]
    for cell in found:
        expected = "true" if int(cell["label"]) == item["label"] else "false"
        assert cell["correct"] == expected


def test_upload_colours_follow_the_known_class(tiny, server):
    page = server[1].nearsight
    # an image that is no gallery file: its class is unknown until the user gives one
    flipped = tiny.root / "flipped.png"
    Image.open(tiny.items[4]["path"]).transpose(Image.Transpose.FLIP_LEFT_RIGHT).save(flipped)
    html, _, _ = page.upload_grid("gallery", str(flipped), 6, "-1")
    assert len(cells(html)) == 6
    assert {c["correct"] for c in cells(html)} == {"unknown"}
    assert "#9ca3af" in html  # grey frames
    label = tiny.items[4]["label"]
    html, _, _ = page.upload_grid("gallery", str(flipped), 6, str(label))
    verdicts = [(int(c["label"]) == label, c["correct"]) for c in cells(html)]
    assert all((c == "true") == same for same, c in verdicts)
    # a byte-identical gallery file: its class is known without the dropdown
    html, _, _ = page.upload_grid("gallery", tiny.items[4]["path"], 6, "-1")
    assert f"identical to gallery item #{tiny.items[4]['id']}" in html
    first = cells(html)[0]
    assert first["id"] == str(tiny.items[4]["id"]) and first["correct"] == "true"


def test_item_ids_and_k_are_checked(server):
    from gradio import Error

    page = server[1].nearsight
    with pytest.raises(Error, match="has no item with id 999"):
        page.item_grid("gallery", 999, 8)
    with pytest.raises(Error, match="whole number"):
        page.item_grid("gallery", 1.5, 8)
    with pytest.raises(Error, match="k must be"):
        page.item_grid("gallery", 1, 65)


# -- the leave-one-out analysis -----------------------------------------------------------------


def test_failures_match_a_brute_force_leave_one_out(tiny, server):
    view = server[1].nearsight.view("gallery")
    analysis = view.analysis()
    vectors = np.asarray(view.gallery.embeddings, dtype=np.float64)
    labels = view.labels
    distances = np.sqrt(np.maximum(0, 2 - 2 * vectors @ vectors.T))
    np.fill_diagonal(distances, np.inf)
    nearest = distances.argmin(axis=1)
    wrong = np.flatnonzero(labels[nearest] != labels)
    assert 0 < len(wrong) < len(labels)  # a random net: some right, some wrong
    assert sorted(f.id for f in analysis.failures) == sorted(view.ids[wrong].tolist())
    for failure in analysis.failures:
        row = int(np.searchsorted(view.ids, failure.id))
        same = labels == labels[row]
        same[row] = False
        assert failure.top1_id == view.ids[nearest[row]]
        assert failure.top1_distance == pytest.approx(distances[row].min(), abs=1e-5)
        assert failure.positive_distance == pytest.approx(distances[row][same].min(), abs=1e-5)
        assert failure.margin > 0
    margins = [f.margin for f in analysis.failures]
    assert margins == sorted(margins, reverse=True)  # worst first
    assert analysis.metrics == evaluate_gallery(view.gallery)
    assert analysis.metrics["recall@1"] == pytest.approx(1 - len(wrong) / len(labels))
    pairs = {(a, b): n for a, b, n in analysis.confused_pairs}
    assert sum(pairs.values()) == len(wrong)


def test_a_failure_grid_shows_a_wrong_rank_1(server):
    page = server[1].nearsight
    failure = page.view("gallery").analysis().failures[0]
    html, _, _ = page.item_grid("gallery", failure.id, 8)
    first = cells(html)[0]
    assert first["rank"] == "1" and first["correct"] == "false"
    assert int(first["id"]) == failure.top1_id


def test_confused_pairs_are_unordered_and_counted():
    def failure(label, other):
        return Failure(
            id=0, label=label, top1_id=1, top1_label=other, top1_distance=0.1, positive_distance=0.2
        )

    found = confused_pairs([failure(1, 2), failure(2, 1), failure(3, 1), failure(2, 1)])
    assert found == [(1, 2, 3), (1, 3, 1)]


def test_pair_histogram_of_a_hand_made_gallery():
    # two classes on the unit circle: class 0 at 0 and 60 degrees, class 1 at 180 degrees
    angles = np.radians([0.0, 60.0, 180.0])
    vectors = np.stack([np.cos(angles), np.sin(angles)], axis=1).astype(np.float32)
    labels = np.array([0, 0, 1])
    edges, matching, non_matching, counts = pair_distance_histogram(vectors, labels, bins=4)
    assert counts == (1, 2)  # every pair: (0,1) matching; (0,2), (1,2) not
    # distances: 60 degrees apart -> 1.0; 120 -> sqrt(3); 180 -> 2.0
    assert edges[0] == pytest.approx(1.0 - (2.0 - 1.0) / 8)
    assert edges[-1] == pytest.approx(2.0)
    width = edges[1] - edges[0]
    assert matching.sum() * width == pytest.approx(1.0)
    assert non_matching.sum() * width == pytest.approx(1.0)
    assert np.digitize(1.0, edges) - 1 == int(np.argmax(matching))
    expected = np.zeros(4)
    for d in (np.sqrt(3.0), 2.0):
        expected[min(np.searchsorted(edges, d, side="right") - 1, 3)] += 0.5 / width
    np.testing.assert_allclose(non_matching, expected)


def test_pair_histogram_samples_each_kind_from_its_own_pairs():
    # 30 classes around orthogonal centres: same-class pairs lie near 0, the others near sqrt(2)
    rng = np.random.default_rng(1)
    labels = rng.integers(0, 30, 3000)
    vectors = np.eye(32, dtype=np.float32)[labels] + rng.normal(0, 0.02, (3000, 32))
    vectors = (vectors / np.linalg.norm(vectors, axis=1, keepdims=True)).astype(np.float32)
    edges, matching, non_matching, counts = pair_distance_histogram(
        vectors, labels, max_pairs=2000, bins=20
    )
    assert counts == (1000, 1000)  # a sample: the gallery has ~4.5M pairs
    centres = (edges[:-1] + edges[1:]) / 2
    assert centres[matching > 0].max() < 0.3
    assert centres[non_matching > 0].min() > 1.2


# -- nearsight serve ----------------------------------------------------------------------------


def test_serve_refuses_a_model_that_is_not_the_gallerys(tiny, capsys):
    torch.manual_seed(1)
    other = tiny.root / "other.pt"
    save_checkpoint(other, build_embedding_net(EmbeddingConfig(dim=16, image_size=32)))
    code = main(["serve", "--gallery", str(tiny.gallery), "--model", str(other), "--port", "0"])
    error = capsys.readouterr().err.strip()
    assert code == 2
    assert len(error.splitlines()) == 1
    assert "was built with model sha256" in error and "other.pt" in error
    assert main(["serve", "--gallery", str(tiny.root / "missing")]) == 2
    assert "no gallery at" in capsys.readouterr().err
    assert main(["serve", "--gallery", str(tiny.gallery), "--max-upload-mb", "0"]) == 2
    assert "--max-upload-mb must be positive" in capsys.readouterr().err
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        argv = ["serve", "--gallery", str(tiny.gallery), "--port", port, "--device", "cpu"]
        assert main(argv) == 2
    error = capsys.readouterr().err.strip()
    assert error == (
        f"nearsight: error: cannot serve on 127.0.0.1:{port}: the port is in use "
        "(choose another with --port)"
    )


def test_a_gallery_past_the_analysis_limit_is_not_analysed(tiny):
    with Gallery.open(tiny.gallery) as gallery:
        view = GalleryView("big", gallery, embedder=None, analysis_max_items=23)
        analysis = view.analysis()
    assert analysis.metrics is None and analysis.failures == []
    assert "24 labelled items, more than the page analyses (23" in analysis.error


@pytest.mark.slow
def test_nearsight_serve_prints_the_url_and_serves(onnx_gallery):
    """The process itself: its URL line, the page, /search, and a clean stop on SIGTERM (an
    ONNX gallery: the process imports no torch)."""
    port = free_port()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    gallery = str(onnx_gallery.gallery)
    command = [sys.executable, "-m", "nearsight.app.cli", "serve", "--gallery", gallery]
    with started(
        [*command, "--port", port, "--device", "cpu"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    ) as process:
        line = process.stdout.readline()
        assert f"http://127.0.0.1:{port}/" in line, line + process.stderr.read()
        response = httpx.get(f"http://127.0.0.1:{port}/", timeout=30)
        assert response.status_code == 200 and "nearsight" in response.text
        rows = json.loads(
            Client(f"http://127.0.0.1:{port}/", verbose=False).predict(
                handle_file(onnx_gallery.query), 2, api_name="/search"
            )
        )
        with Gallery.open(onnx_gallery.gallery) as opened:
            own = next(i for i in opened.all_items() if i["path"] == str(onnx_gallery.query))
        assert [row["id"] for row in rows][0] == own["id"]
        code = stop_process(process)
        err = process.stderr.read()
    assert code == 0 and "nearsight: stopped" in err, err  # SIGTERM closes it cleanly
