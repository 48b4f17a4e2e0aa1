"""``nearsight rerank train`` never hurts classes it never saw: a model trained on digits 0-4
(scikit-learn's digits at 32 px, a short RLL run, so its training classes are easy), a
re-ranker trained on its training split by the CLI, and the unseen digits 5-9 searched
leave-one-out. For each variant (the default, ``--stage layer3``) and three seeds, the file
either keeps the base order (the same Recall@1) or lifts it; never a drop over 0.005.

The training split's features are computed once for the module (``features_once``): the
seven ``rerank train`` runs here embed the same files with the same model, and the fits,
not the embedding, are what the test is about."""

from __future__ import annotations

import copy
import json
import shutil

import numpy as np
import pytest
from helpers import run
from helpers.galleries import write_digits

pytest.importorskip("torch")

MAX_DROP = 0.005
SEEDS = (0, 1, 2)
VARIANTS = {"default": (), "layer3": ("--stage", "layer3")}


@pytest.fixture(scope="module", autouse=True)
def features_once():
    """``embed_files`` and ``embed_with_stage`` remembered by (model, stage, files): a
    ``rerank train`` run after the first gets a copy of the first's result (the same ONNX
    model on the same files gives the same numbers); anything else is embedded as usual."""
    from nearsight.data import embed
    from nearsight.search.rerank import stage_features

    seen: dict[tuple, object] = {}
    real_files, real_stage = embed.embed_files, stage_features.embed_with_stage

    def remembered(key: tuple, compute):
        if key not in seen:
            seen[key] = compute()
        return copy.deepcopy(seen[key])

    def embed_files(embedder, paths, **options):
        key = ("files", embedder.model_sha256, tuple(map(str, paths)), options.get("untrusted"))
        return remembered(key, lambda: real_files(embedder, paths, **options))

    def embed_with_stage(model_path, stage, paths, **options):
        key = ("stage", str(model_path), stage, tuple(map(str, paths)))
        return remembered(key, lambda: real_stage(model_path, stage, paths, **options))

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(embed, "embed_files", embed_files)
        patch.setattr(stage_features, "embed_with_stage", embed_with_stage)
        yield


@pytest.fixture(scope="module")
def digits_model(tmp_path_factory):
    """(data root, model.onnx, the unseen test split's embeddings, labels, layer3 features)."""
    from nearsight.app.cli import main
    from nearsight.data.datasets import load_dataset
    from nearsight.search.rerank.stage_features import embed_with_stage

    root = tmp_path_factory.mktemp("digits-rerank")
    data = write_digits(root / "data", size=32)
    run_dir, model = root / "run", root / "model.onnx"
    train = ["train", "--dataset", "folder", "--root", str(data), "--loss", "rll", "--out",
             str(run_dir), "--image-size", "32", "--pretrained", "none", "--steps", "60",
             "--classes-per-batch", "5", "--per-class", "8", "--workers", "0",
             "--eval-every", "60", "--seed", "0", "--set", "model.arch=resnet18"]  # fmt: skip
    assert main(train) == 0
    assert main(["export", "--checkpoint", str(run_dir / "best.pt"), "--out", str(model)]) == 0
    test = load_dataset("folder", data, "test")  # digits 5-9: never trained on
    result, side = embed_with_stage(model, "layer3", [s.path for s in test.samples], desc="test")
    labels = np.asarray(test.labels)[result.ok]
    yield data, model, result.embeddings, labels, side
    shutil.rmtree(root, ignore_errors=True)


def recall_at_1(vectors, labels, spec: str = "none", side=None) -> float:
    from nearsight.search.rerank.evaluate import evaluate_reranked
    from nearsight.search.rerank.spec import parse_rerank

    metrics = evaluate_reranked(vectors, labels, (1,), parse_rerank(spec), side=side,
                                with_nmi=False)  # fmt: skip
    return float(metrics["recall@1"])


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_a_trained_file_never_lowers_unseen_class_recall(digits_model, variant, tmp_path, capsys):
    from nearsight.search.rerank.pairwise import load_reranker

    data, model, vectors, labels, side = digits_model
    plain = recall_at_1(vectors, labels)
    assert 0.5 < plain < 0.95  # unseen digits: far from solved, room to lift or to hurt
    outcomes = []
    for seed in SEEDS:
        out = tmp_path / f"{variant}-{seed}.onnx"
        code, text, err = run(capsys, "rerank", "train", "--model", model, "--dataset", "folder",
                              "--root", data, "--out", out, "--seed", seed, "--epochs", "10",
                              *VARIANTS[variant], "--json")  # fmt: skip
        assert code == 0, err
        report = json.loads(text)
        opened = load_reranker(out)
        assert opened.meta["kept"] == ("trained" if report["helped_on_held_out"] else "base order")
        spec = f"pairwise:model={out},depth={report['depth']}"
        got = recall_at_1(vectors, labels, spec, side if opened.side_dim else None)
        outcomes.append((seed, report["verdict"], round(got, 4)))
        if not report["helped_on_held_out"]:
            assert got == pytest.approx(plain, abs=1e-12)  # the base order, exactly
        assert got >= plain - MAX_DROP, (variant, seed, plain, got, report["verdict"])
    print(f"{variant}: plain Recall@1 {plain:.4f}; {outcomes}")


def test_the_printed_held_out_recall_is_leave_one_out(digits_model, tmp_path, capsys):
    """The held-out figure rerank train prints is the papers' Recall@1 of the held-out
    training classes: every one of their items querying all the others."""
    from nearsight.data.datasets import load_dataset
    from nearsight.data.embed import embed_files
    from nearsight.models.loading import load_embedder

    data, model, *_ = digits_model
    out = tmp_path / "r.onnx"
    code, text, err = run(capsys, "rerank", "train", "--model", model, "--dataset", "folder",
                          "--root", data, "--out", out, "--list-features-only", "--seeds", "1",
                          "--epochs", "1", "--json")  # fmt: skip
    assert code == 0, err
    report = json.loads(text)
    split = load_dataset("folder", data, "train")
    embedded = embed_files(load_embedder(model, device="cpu"), [s.path for s in split.samples])
    labels = np.asarray(split.labels)[embedded.ok]
    held = np.isin(labels, report["held_out_classes"])
    expected = recall_at_1(embedded.embeddings[held], labels[held])
    assert report["plain"]["recall_at_1"] == pytest.approx(expected, abs=1e-9)
