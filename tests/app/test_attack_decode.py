"""Holding under attack, against a real server on 127.0.0.1: untrusted images. Tag bombs on
every decode path (REST, the page, `nearsight search`, `index build`), a JPEG of thousands of
scans, pasted images and images inside queue payloads, all decoded in the decode box under
its memory and time limits."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
from helpers import disk_mb, jpeg_scan_bomb, process_mb, serve_process, tag_bomb

# -- tag bombs: untrusted images are decoded in the decode box (nearsight/data/decode_box.py) --

# 1x1 images whose EXIF/TIFF tags all point at one region: 220 tags x 4 MB ask ~880 MB of
# copies (a TIFF's twice: Image.open and getexif read its IFD); a JPEG's EXIF segment holds
# 64 KB, so its 5,400 tags ask ~350 MB, and three of them are sent at once.
BOMBS = {"tiff": (220, 4_000_000), "png": (220, 4_000_000), "webp": (220, 4_000_000),
         "jpeg": (5400, 0)}  # fmt: skip
GROWTH_LIMIT_MB = 800


def _bomb_files(folder) -> dict:
    folder.mkdir(exist_ok=True)
    files = {}
    for kind, (tags, region) in BOMBS.items():
        files[kind] = folder / f"bomb.{kind}"
        files[kind].write_bytes(tag_bomb(kind, tags, region))
    return files


def _search_upload(url: str, path, *, waits: int = 0) -> httpx.Response:
    """POST ``path`` to /api/search; with ``waits``, a 429 (the client owes decode time for
    its failed images, nearsight/app/serve/decode_shares.py) is retried after its Retry-After,
    up to ``waits`` times, as a client that honours it does."""
    files = {"image": (path.name, path.read_bytes(), "application/octet-stream")}
    while True:
        answer = httpx.post(f"{url}/api/search", files=files, data={"k": "3"}, timeout=300)
        if answer.status_code != 429 or waits == 0:
            return answer
        waits -= 1
        time.sleep(float(answer.headers["Retry-After"]))


def _page_search(client, path, waits: int = 3):
    """The page's /search with ``path``: its neighbours, or its one-line error; a refusal
    for owed decode time ("wait N s") is retried after N s, up to ``waits`` times."""
    from gradio_client import handle_file
    from gradio_client.exceptions import AppError

    while True:
        try:
            return json.loads(client.predict(handle_file(str(path)), 3, api_name="/search"))
        except AppError as error:
            owed = re.search(r"wait (\d+) s before the next upload", str(error))
            if owed is None or waits == 0:
                return str(error)
            waits -= 1
            time.sleep(float(owed.group(1)))


@pytest.mark.slow
def test_tag_bombs_through_rest_and_the_page_leave_the_server_under_800_mb(onnx_gallery,
                                                                            tmp_path):  # fmt: skip
    """Each bomb through REST and through the page's /search (gradio_client), the JPEG three at
    once: each is answered (decoded in the box within its limit, or refused in one line), the
    server's peak resident memory stays within 800 MB of its idle size, and it goes on
    serving (before: a TIFF alone added ~1.8 GB, three JPEGs ~1 GB). The test client honours
    a refusal for decode time its failed bombs owe (429, Retry-After): where the failures
    took long, on a slow machine, the next bomb waits, and is then decoded."""
    from gradio_client import Client

    bombs = _bomb_files(tmp_path / "bombs")
    args = ["--gallery", onnx_gallery.gallery, "--concurrency", "3"]
    with serve_process(args) as (url, server):
        first = _search_upload(url, onnx_gallery.query)
        assert first.status_code == 200, first.text
        idle = process_mb(server.pid)
        answers = {}
        for kind in ("tiff", "png", "webp"):
            answers[kind] = _search_upload(url, bombs[kind], waits=3)
        jpegs: list[httpx.Response] = []

        def upload_jpeg() -> None:
            jpegs.append(_search_upload(url, bombs["jpeg"], waits=3))

        threads = [threading.Thread(target=upload_jpeg) for _ in range(3)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        rest_peak = process_mb(server.pid, "VmHWM")
        client = Client(url, verbose=False)
        page = {}
        for kind, path in bombs.items():
            page[kind] = _page_search(client, path)
        last = _search_upload(url, onnx_gallery.query)
        peak = process_mb(server.pid, "VmHWM")
    print(f"idle {idle:.0f} MB, peak after REST {rest_peak:.0f} MB, after the page {peak:.0f} MB")
    assert peak - idle < GROWTH_LIMIT_MB
    for kind, answer in [*answers.items(), *(("jpeg", a) for a in jpegs)]:
        assert answer.status_code in (200, 415), (kind, answer.text)
        if answer.status_code == 415:
            detail = answer.json()["error"]
            assert "\n" not in detail and "limit of" in detail, detail
    assert answers["tiff"].status_code == 415  # ~1.8 GB of copies: past the worker's limit
    for kind, answer in page.items():
        assert isinstance(answer, list) or "limit of" in answer, (kind, answer)
    assert last.status_code == 200 and last.json() == first.json()


@pytest.mark.slow
def test_the_64535_tag_file_is_refused_without_growing_the_server(onnx_gallery, tmp_path):
    """A 9.8 MB TIFF whose 64,535 tags each point at the same 9 MB (~550 GiB of copies asked
    for), on a server with --decode-memory-mb 300: refused in one line, the server's peak grows by less than 100 MB (the upload's own
    bytes, a few times over), and the next search is answered."""
    path = tmp_path / "bomb.tif"
    path.write_bytes(tag_bomb("tiff", 64535, 9_000_000))
    args = ["--gallery", onnx_gallery.gallery, "--decode-memory-mb", "300"]
    with serve_process(args) as (url, server):
        assert _search_upload(url, onnx_gallery.query).status_code == 200
        idle = process_mb(server.pid, "VmHWM")
        answer = _search_upload(url, path)
        peak = process_mb(server.pid, "VmHWM")
        after = _search_upload(url, onnx_gallery.query)
    assert answer.status_code == 415, answer.text
    assert "bomb.tif" in answer.json()["error"] and "limit of 300 MB" in answer.json()["error"]
    assert peak - idle < 100, (idle, peak)
    assert after.status_code == 200


_CLI_PEAK = """
import sys
from nearsight.app.cli import main
code = main(sys.argv[1:])
for line in open("/proc/self/status"):
    if line.startswith("VmHWM:"):
        print(int(line.split()[1]) // 1024)
sys.exit(code)
"""


def _cli_peak(args: list) -> tuple[int, str, int]:
    """``nearsight ARGS`` in a process of its own: exit code, stderr, peak resident MB (its own,
    not its decode workers')."""
    run = subprocess.run([sys.executable, "-c", _CLI_PEAK, *map(str, args)], capture_output=True,
                         text=True, timeout=600)  # fmt: skip
    return run.returncode, run.stderr, int(run.stdout.split()[-1])


@pytest.mark.slow
def test_tag_bombs_given_to_nearsight_search_stay_under_800_mb(onnx_gallery, tmp_path):
    """`nearsight search BOMB.tif`: exit 2 and one line naming the file and the limit; `search
    --queries` over every bomb and a normal image: the refused ones hold their error line, the
    normal one its neighbours. The CLI's own peak stays within 800 MB of a normal search's
    (before: the TIFF added ~1.8 GB to it)."""
    bombs = _bomb_files(tmp_path / "bombs")
    base = ["search", "--gallery", onnx_gallery.gallery, "--k", "3"]
    code, _, normal_peak = _cli_peak([*base, onnx_gallery.query])
    assert code == 0
    code, err, peak = _cli_peak([*base, bombs["tiff"]])
    print(f"normal {normal_peak} MB, bomb {peak} MB")
    assert peak - normal_peak < GROWTH_LIMIT_MB
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("nearsight: error: cannot read image")
    assert "bomb.tiff" in lines[0] and "MB of memory" in lines[0]
    shutil.copy(onnx_gallery.query, tmp_path / "bombs" / "normal.jpg")
    out = tmp_path / "found.jsonl"
    code, err, batch_peak = _cli_peak([*base, "--queries", tmp_path / "bombs", "--out", out])
    assert code == 0, err
    entries = {Path(e["query"]).name: e for e in map(json.loads, out.read_text().splitlines())}
    assert "neighbours" in entries["normal.jpg"] and "error" in entries["bomb.tiff"]
    print(f"batch {batch_peak} MB")
    assert batch_peak - normal_peak < GROWTH_LIMIT_MB


@pytest.fixture(scope="module")
def reranking_server(onnx_gallery, tmp_path_factory):
    """(url, secret folder): `nearsight serve` in a process of its own re-ranking by a
    pairwise re-ranker trained here into a folder whose name must not leak, decodes cut at
    --decode-timeout 2; shared by the scans and the re-ranker tests (neither changes it)."""
    from nearsight.app.cli import main
    from nearsight.data.datasets.synthetic import write_synthetic

    root = tmp_path_factory.mktemp("reranking-server")
    write_synthetic(root / "d", classes=8, per_class=4, size=32, seed=3)
    secret = root / "secret-folder"
    secret.mkdir()
    assert main(["rerank", "train", "--model", str(onnx_gallery.model), "--dataset", "folder",
                 "--root", str(root / "d"), "--out", str(secret / "reranker.onnx"),
                 "--depth", "4", "--epochs", "1"]) == 0  # fmt: skip
    args = ["--gallery", onnx_gallery.gallery, "--no-access-log", "--decode-timeout", "2",
            "--rerank", f"pairwise:model={secret / 'reranker.onnx'},depth=4"]  # fmt: skip
    with serve_process(args) as (url, _):
        yield url, secret


@pytest.mark.slow
def test_a_jpeg_of_thousands_of_scans_is_refused_before_decoding(reranking_server, onnx_gallery,
                                                                 tmp_path):  # fmt: skip
    """A ~500 KB progressive JPEG whose flat AC scan repeats 6,000 times (about a minute of one
    core's CPU to decode: before, a request thread of the server spent it, then a decode
    worker for the whole --decode-timeout): the upload is answered 415 from its scan count,
    and a search sent meanwhile is answered."""
    path = tmp_path / "scans.jpg"
    path.write_bytes(jpeg_scan_bomb(6000, 6000))
    url = reranking_server[0]
    assert _search_upload(url, onnx_gallery.query).status_code == 200
    answers: list = []

    def bomb() -> None:
        start = time.monotonic()
        answers.append((_search_upload(url, path), time.monotonic() - start))

    thread = threading.Thread(target=bomb)
    thread.start()
    time.sleep(0.5)
    meanwhile = _search_upload(url, onnx_gallery.query)
    thread.join()
    ((answer, seconds),) = answers
    assert answer.status_code == 415, answer.text
    assert "scans; an encoder writes at most" in answer.json()["error"]
    assert seconds < 20
    assert meanwhile.status_code == 200


def test_a_pasted_image_reaches_the_handlers_as_bytes_not_decoded(onnx_gallery):
    """A data: URL pasted into the page's query image: the input hands the handler its bytes
    (before, Gradio decoded it with Pillow in the server), and the handler decodes them in the
    box; a bomb pasted this way is refused in one line."""
    import base64

    import gradio as gr
    from gradio.data_classes import FileData

    from nearsight.app.page.handlers import Page
    from nearsight.app.page.layout import query_image_input
    from nearsight.models.loading import load_embedder

    data = onnx_gallery.query.read_bytes()
    url = "data:image/png;base64," + base64.b64encode(data).decode()
    value = query_image_input().preprocess(FileData(path="pasted.png", url=url))
    assert value == data
    embedder = load_embedder(onnx_gallery.model)
    query = Page.read_upload(value, embedder)
    assert min(query.image.size) == embedder.resize
    with pytest.raises(Exception, match="limit of") as refused:
        Page.read_upload(tag_bomb("tiff", 220, 4_000_000), embedder)
    assert "pasted image" in str(refused.value)
    with pytest.raises(gr.Error):
        query_image_input().preprocess(FileData(path="x.png", url="data:image/png;base64,@@"))


@pytest.mark.slow
def test_index_build_skips_and_names_a_bomb_and_trusts_on_request(onnx_gallery, tmp_path,
                                                                  capsys):  # fmt: skip
    """`index build --images` over gallery files and a 64,535-tag TIFF: the TIFF is skipped
    and named on stderr, the others are built with their catalog sizes; --trusted-images
    decodes in process and stores the same vectors."""
    from nearsight.app.cli import main
    from nearsight.index.gallery.core import Gallery

    bomb = tmp_path / "bomb.tif"
    bomb.write_bytes(tag_bomb("tiff", 64535, 9_000_000))
    good = sorted(onnx_gallery.data.rglob("*.png"))[:3]
    common = ["index", "build", "--model", str(onnx_gallery.model), "--index-type", "flat",
              "--workers", "1"]  # fmt: skip
    assert main([*common, "--out", str(tmp_path / "g"), "--images", *map(str, [good[0], bomb,
                 *good[1:]])]) == 0  # fmt: skip
    err = capsys.readouterr().err
    assert f"nearsight: skipped: cannot read image {bomb}" in err and "MB of memory" in err
    assert main([*common, "--out", str(tmp_path / "t"), "--trusted-images",
                 "--images", *map(str, good)]) == 0  # fmt: skip
    with Gallery.open(tmp_path / "g") as boxed, Gallery.open(tmp_path / "t") as trusted:
        rows = boxed.all_items()
        assert [(r["width"], r["height"]) for r in rows] == [(32, 32)] * 3
        assert rows == trusted.all_items()
        ids = [row["id"] for row in rows]
        np.testing.assert_array_equal(boxed.vectors_of(ids), trusted.vectors_of(ids))
    # --trusted-images held for that command only: what runs next in this process is boxed
    from nearsight.data import decode_box

    assert not decode_box.trusted()


@pytest.mark.slow
def test_the_servers_reranker_file_is_named_not_its_path(reranking_server):
    """serve --rerank pairwise:model=/abs/path/reranker.onnx: the REST answer's ``rerank`` and
    the page's config name the file only (before: the server's absolute path), and a client
    that sends the spec it was shown back is served with the server's file."""
    url, secret = reranking_server
    answer = httpx.post(f"{url}/api/search", data={"id": "2", "k": "3"}, timeout=60)
    echoed = httpx.post(f"{url}/api/search", timeout=60,
                        data={"id": "2", "k": "3", "rerank": answer.json()["rerank"]})  # fmt: skip
    shown = [httpx.get(f"{url}{path}", timeout=60).text
             for path in ("/config", "/api/galleries", "/api/health")]  # fmt: skip
    assert answer.status_code == 200, answer.text
    assert answer.json()["rerank"] == "pairwise:model=reranker.onnx,depth=4"
    assert echoed.status_code == 200 and echoed.json() == answer.json(), echoed.text
    for text in [answer.text, *shown]:
        assert "secret-folder" not in text and str(secret.parent) not in text
    assert "pairwise:model=reranker.onnx" in shown[0]  # the page's re-rank toggle says which


def _page_upload_search(url: str, dependency: dict, file: dict, session: str) -> tuple[int, dict]:
    """The page's search of an uploaded query (search_grid) with ``file`` as its image: the
    join's status and the completed message (empty when the join was refused)."""
    joined = httpx.post(f"{url}/gradio_api/queue/join", timeout=60, json={
        "data": ["gallery", file, 3, "-1", "", False], "fn_index": dependency["id"],
        "trigger_id": dependency["targets"][0][0], "session_hash": session, "event_data": None,
    })  # fmt: skip
    if joined.status_code != 200:
        return joined.status_code, {"detail": joined.json().get("detail")}
    params = {"session_hash": session}
    with httpx.stream("GET", f"{url}/gradio_api/queue/data", params=params, timeout=60) as stream:
        for line in stream.iter_lines():
            message = json.loads(line[5:]) if line.startswith("data:") else {}
            if message.get("msg") == "process_completed":
                return 200, message
    return 200, {}


def _data_url(data: bytes) -> dict:
    import base64

    url = "data:image/png;base64," + base64.b64encode(data).decode()
    return {"path": None, "url": url, "meta": {"_type": "gradio.FileData"}}


@pytest.mark.slow
def test_images_in_queue_payloads_are_held_as_uploads(onnx_gallery, tmp_path):
    """data: URLs in the page's queue payloads (what a pasted image can be sent as): a real
    image is searched; 40 sessions each sending a 7 MB one (9.3 MB as text) leave the server within 150 MB of
    its size before (before: each session's state kept its ~9.3 MB text, +370 MB) and the
    upload folder within the disk budget; a tag bomb is refused in one line by the decode
    box; a non-image and a URL for the server to fetch are refused at the join, in one line
    (before: the URL was downloaded into Gradio's cache)."""
    folder = tmp_path / "gradio"
    image = onnx_gallery.query.read_bytes()
    tail = os.urandom(7_000_000)
    args = ["--gallery", onnx_gallery.gallery, "--no-access-log", "--max-upload-mb", "10"]
    with serve_process(args, env={"GRADIO_TEMP_DIR": str(folder)}) as (url, server):
        config = httpx.get(f"{url}/config", timeout=60).json()
        dependency = next(d for d in config["dependencies"] if d.get("api_name") == "search_grid")
        status, first = _page_upload_search(url, dependency, _data_url(image), "warm")
        assert status == 200 and first.get("success"), first
        assert 'data-query-kind="upload"' in first["output"]["data"][0]
        before = process_mb(server.pid)
        disk = []
        for n in range(40):
            big = image + bytes([n]) + tail  # a PNG, then bytes its decoder never reads
            status, answer = _page_upload_search(url, dependency, _data_url(big), f"s{n}")
            assert status == 200 and answer.get("success"), answer
            disk.append(disk_mb(folder))
        after = process_mb(server.pid)
        bomb = _page_upload_search(url, dependency, _data_url(tag_bomb("tiff", 220, 4_000_000)),
                                   "bomb")[1]  # fmt: skip
        text = _page_upload_search(url, dependency, _data_url(b"not an image" * 100), "text")
        fetch = _page_upload_search(url, dependency, {"path": "https://example.com/q.png",
                                    "meta": {"_type": "gradio.FileData"}}, "fetch")  # fmt: skip
    print(f"server {before:.0f} MB, after 40 pasted images {after:.0f} MB; disk peak "
          f"{max(disk):.1f} MB")  # fmt: skip
    assert after - before < 150, (before, after)
    assert max(disk) < 60, disk
    assert not bomb.get("success") and "limit of" in bomb["output"]["error"], bomb
    assert "\n" not in bomb["output"]["error"]
    assert text[0] == 400 and "not an image" in text[1]["detail"], text
    assert fetch[0] == 400 and "upload route" in fetch[1]["detail"], fetch
