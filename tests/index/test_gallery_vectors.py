"""Galleries without embeddings.npy (dropped past the memory budget): evaluation, search by id,
appends, removals and compaction read the vectors back from the index or the imported files."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest

from nearsight.app.cli import main
from nearsight.index.catalog.store import CATALOG_FILE
from nearsight.index.gallery.core import Gallery
from nearsight.index.gallery.files import EMBEDDINGS_FILE, INDEX_FILE
from nearsight.index.gallery.payload import PAYLOAD_FILE
from nearsight.index.gallery.write import write_gallery
from nearsight.index.vector_store import ApproximateVectorsWarning, keep_embeddings
from nearsight.search.evaluate import evaluate_gallery
from nearsight.search.route import item_vector

TINY_BUDGET = "1K"  # every gallery here is past it: evaluation gathers into a mapped file


def labelled_vectors(count: int = 600, classes: int = 6, dim: int = 16, seed: int = 0):
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, classes, count)
    centres = rng.standard_normal((classes, dim))
    vectors = centres[labels] + 0.8 * rng.standard_normal((count, dim))
    vectors = (vectors / np.linalg.norm(vectors, axis=1, keepdims=True)).astype(np.float32)
    labels[::17] = -1  # a few unlabelled items: evaluation leaves them out
    return vectors, labels


def items_of(labels) -> list[dict]:
    return [{"path": f"/v/{i}.jpg", "label": int(label)} for i, label in enumerate(labels)]


def build(folder, vectors, labels, index_type, embeddings, **options):
    return write_gallery(
        folder,
        vectors,
        items_of(labels),
        model_sha256="",
        index_type=index_type,
        max_index_memory=TINY_BUDGET,
        embeddings=embeddings,
        **options,
    )


def test_auto_drops_only_past_the_budget_with_exact_vectors_left():
    assert keep_embeddings("auto", 1000, 128, "flat", 1 << 30, False)  # fits
    assert not keep_embeddings("auto", 1000, 128, "hnsw", 1000, False)  # index holds them
    assert keep_embeddings("auto", 1000, 128, "opq", 1000, False)  # codes only: keep
    assert not keep_embeddings("auto", 1000, 128, "opq", 1000, True)  # the source is exact
    assert keep_embeddings("keep", 1000, 128, "hnsw", 1000, False)
    assert not keep_embeddings("drop", 1000, 128, "opq", 1 << 30, False)


@pytest.mark.parametrize("index_type", ["flat", "ivf", "hnsw"])
def test_a_gallery_without_embeddings_evaluates_and_searches_like_one_with(tmp_path, index_type):
    vectors, labels = labelled_vectors()
    kept = build(tmp_path / "kept", vectors, labels, index_type, "keep")
    dropped = build(tmp_path / "dropped", vectors, labels, index_type, "auto")
    assert sorted(p.name for p in dropped.iterdir()) == [CATALOG_FILE, INDEX_FILE, PAYLOAD_FILE]
    with Gallery.open(kept) as with_file, Gallery.open(dropped) as without:
        assert with_file.embeddings_kept and with_file.meta["embeddings_kept"] is True
        assert not without.embeddings_kept and without.meta["embeddings_kept"] is False
        assert without.vectors_exact
        np.testing.assert_allclose(without.embeddings, vectors, atol=1e-6)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # exact vectors: no warning
            expected, got = (
                evaluate_gallery(with_file, (1, 2, 4)),
                evaluate_gallery(without, (1, 2, 4)),
            )
        assert expected.keys() == got.keys()
        for key in expected:
            assert got[key] == pytest.approx(expected[key], abs=1e-6), key
        for item in (0, 17, 599):  # search by id reads the item's vector back
            np.testing.assert_allclose(
                item_vector(without, item), vectors[item : item + 1], atol=1e-6
            )
            d_with, i_with = with_file.search(item_vector(with_file, item), 5)
            d_without, i_without = without.search(item_vector(without, item), 5)
            np.testing.assert_array_equal(i_with, i_without)
            np.testing.assert_allclose(d_with, d_without, atol=1e-5)
        allowed = with_file.filter_ids("label=3")  # a filtered search's exact completion
        _, ids = without.search(vectors[:3], 8, ids=allowed)
        assert np.isin(ids, allowed).all()


def test_a_pq_gallery_without_embeddings_searches_and_warns_that_eval_is_approximate(
    tmp_path, capsys
):
    vectors, labels = labelled_vectors()
    folder = build(tmp_path / "pq", vectors, labels, "ivfpq", "drop")
    with Gallery.open(folder) as gallery:
        assert not gallery.vectors_exact
        _, ids = gallery.search(vectors[:4], 5)  # the codes' order, no re-rank
        assert (ids >= 0).all()
        decoded = item_vector(gallery, 3)[0]
        assert float(decoded @ vectors[3]) > 0.5  # the decoded code (3-bit PQ here), near it
        with pytest.warns(ApproximateVectorsWarning, match="approximate"):
            metrics = evaluate_gallery(gallery, (1, 2))
        assert 0 <= metrics["recall@1"] <= 1
    assert main(["eval", "--gallery", str(folder), "--k", "1", "2"]) == 0
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("nearsight: note: ") and "approximate" in err


def test_an_imported_pq_gallery_reads_exact_vectors_from_its_files(tmp_path, capsys):
    vectors, labels = labelled_vectors()
    (tmp_path / "chunks").mkdir()
    np.save(tmp_path / "chunks" / "a.npy", vectors[:250] * 3)  # import normalises them
    np.save(tmp_path / "chunks" / "b.npy", vectors[250:].astype(np.float64))
    with open(tmp_path / "meta.csv", "w") as handle:
        rows = [f"v{i}.jpg,{'' if x < 0 else x}\n" for i, x in enumerate(labels)]
        handle.write("path,label\n" + "".join(rows))
    common = ["index", "import", "--vectors", str(tmp_path / "chunks"), "--meta",
              str(tmp_path / "meta.csv"), "--index-type", "opq"]  # fmt: skip
    assert main([*common, "--out", str(tmp_path / "kept"), "--embeddings", "keep"]) == 0
    assert main([*common, "--out", str(tmp_path / "dropped"), "--max-index-memory", "1K"]) == 0
    capsys.readouterr()
    assert not (tmp_path / "dropped" / EMBEDDINGS_FILE).exists()
    with Gallery.open(tmp_path / "kept") as with_file, Gallery.open(tmp_path / "dropped") as g:
        assert g.meta["vector_source"]["files"] == [["a.npy", 250], ["b.npy", 350]]
        assert g.vectors_exact
        np.testing.assert_allclose(g.vectors_of([5, 400]), vectors[[5, 400]], atol=1e-6)
        expected, got = evaluate_gallery(with_file, (1, 2)), evaluate_gallery(g, (1, 2))
        for key in expected:
            assert got[key] == pytest.approx(expected[key], abs=1e-6), key
        np.testing.assert_array_equal(
            with_file.search(vectors[:5], 4)[1], g.search(vectors[:5], 4)[1]
        )
    assert main(["eval", "--gallery", str(tmp_path / "dropped")]) == 0
    assert capsys.readouterr().err == ""  # exact: no note
    (tmp_path / "chunks" / "b.npy").unlink()  # the files gone: the index's codes instead
    with Gallery.open(tmp_path / "dropped") as g:
        assert not g.vectors_exact
        assert (g.search(vectors[:2], 3)[1] >= 0).all()


@pytest.mark.parametrize("index_type", ["flat", "ivf", "hnsw", "ivfpq"])
def test_add_remove_and_compact_work_without_embeddings(tmp_path, index_type):
    vectors, labels = labelled_vectors()
    folder = build(tmp_path / "g", vectors[:500], labels[:500], index_type, "drop")
    with Gallery.open(folder) as gallery:
        new = gallery.add(vectors[500:510], items_of(labels[500:510]))
        assert new == list(range(500, 510))
        np.testing.assert_allclose(item_vector(gallery, 505), vectors[505:506], atol=1e-6)
        _, ids = gallery.search(item_vector(gallery, 505), 10)
        assert ids[0, 0] == 505 or (index_type == "ivfpq" and 505 in ids)  # codes' order
        gallery.remove([3, 504])
        assert len(gallery) == 508
        gallery.compact()
        assert sorted(p.name for p in folder.iterdir()) == [CATALOG_FILE, INDEX_FILE, PAYLOAD_FILE]
        assert gallery.meta["embeddings_kept"] is False and not gallery.meta["segments"]
        keep = np.setdiff1d(np.arange(510), [3, 504])
        np.testing.assert_array_equal(gallery.ids, keep)
        rows = gallery.vectors_of(keep)
        atol = 1e-6 if index_type != "ivfpq" else 0.6  # decoded PQ codes
        np.testing.assert_allclose(rows, vectors[keep], atol=atol)
        _, ids = gallery.search(vectors[keep[:20]], 1)
        if index_type != "ivfpq":
            np.testing.assert_array_equal(ids[:, 0], keep[:20])


def test_a_compaction_killed_before_its_rename_leaves_the_previous_gallery(tmp_path):
    """SIGKILL while the compacted index is written into the temporary folder: the gallery
    is the previous one (segment and removal still listed), and the next writer sweeps the
    temporary folder."""
    vectors, labels = labelled_vectors()
    folder = build(tmp_path / "g", vectors[:500], labels[:500], "ivf", "drop")
    with Gallery.open(folder) as gallery:
        gallery.add(vectors[500:505], items_of(labels[500:505]))
        gallery.remove([7])
    script = textwrap.dedent(
        f"""
        import os, signal
        import faiss
        from nearsight.index.gallery import write as gallery_write
        from nearsight.index.gallery.core import Gallery
        real = faiss.write_index
        def dying(index, path):
            real(index, path)
            os.kill(os.getpid(), signal.SIGKILL)
        gallery_write.faiss.write_index = dying
        Gallery.open({str(folder)!r}).compact()
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=120)
    assert done.returncode == -signal.SIGKILL, done.stderr.decode()
    with Gallery.open(folder) as gallery:
        assert len(gallery.meta["segments"]) == 1 and gallery.meta["removed"] == [7]
        assert len(gallery) == 504 and not gallery.embeddings_kept
        np.testing.assert_allclose(gallery.vectors_of([502]), vectors[502:503], atol=1e-6)
        gallery.compact()
    assert sorted(p.name for p in folder.iterdir()) == [CATALOG_FILE, INDEX_FILE, PAYLOAD_FILE]
    assert sorted(p.name for p in folder.parent.iterdir() if p.name != ".g.lock") == ["g"]
