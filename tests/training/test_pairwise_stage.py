"""The pairwise re-ranker on a trunk stage's features: it learns from what the embedding lost,
its ONNX file (format 2) scores as torch does, it is refused without its features, and the
stage features read from an exported model are torch's."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from nearsight.core.errors import NearsightError
from nearsight.search.rerank import pairwise as served
from nearsight.search.rerank.evaluate import evaluate_reranked
from nearsight.search.rerank.spec import parse_rerank
from nearsight.training.pairwise import FitSettings, PairScorer, export_scorer, fit_scorer
from nearsight.training.pairwise import export as written


def lost_classes(classes: range, per_class: int, seed: int):
    """(embeddings, labels, stage features): the unit 8-d embedding is a nuisance (3 centres
    shared by all classes) plus a faint class signal, so its nearest items are mostly of
    other classes; the 16-d non-negative stage features (as a pooled post-ReLU map) hold the
    class clearly, as a class-specific pair of active channels over a shared base, for
    classes never trained on too."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(3, 8))
    vectors, labels, side = [], [], []
    for label in classes:
        channels = [label % 16, (label * 7 + 3) % 16]
        direction = np.random.default_rng(1000 + label).normal(size=8)
        for _ in range(per_class):
            vectors.append(centres[rng.integers(3)] + 0.3 * rng.normal(size=8) + 0.1 * direction)
            active = rng.uniform(0.0, 0.5, 16) + 1.0
            active[channels] += 2.0
            side.append(active)
            labels.append(label)
    vectors = np.asarray(vectors, dtype=np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    return vectors, np.asarray(labels), np.asarray(side, dtype=np.float32)


def test_a_stage_reranker_puts_the_true_neighbour_first_on_unseen_classes(tmp_path):
    train = lost_classes(range(0, 10), 20, seed=0)
    vectors, labels, side = lost_classes(range(10, 16), 20, seed=1)  # never trained on
    settings = FitSettings(depth=10, seed=0, epochs=10, batch=16, elementwise=False)
    scorer, report = fit_scorer(*train[:2], settings, log=print, side=train[2])
    assert report.helped, report
    out = tmp_path / "r.onnx"
    export_scorer(scorer, out, "a" * 64, {"side_stage": "layer3"})
    spec = parse_rerank(f"pairwise:model={out},depth=10")
    plain = evaluate_reranked(vectors, labels, (1,), parse_rerank("none"), with_nmi=False)
    reranked = evaluate_reranked(vectors, labels, (1,), spec, side=side, with_nmi=False)
    print(f"Recall@1 plain {plain['recall@1']:.3f} -> pairwise {reranked['recall@1']:.3f}")
    # measured at seed 0: plain 0.342, re-ranked 0.658
    assert plain["recall@1"] < 0.5
    assert reranked["recall@1"] >= plain["recall@1"] + 0.15
    # the queries the embedding gets wrong whose list holds a right answer: mostly fixed
    sims = vectors @ vectors.T
    np.fill_diagonal(sims, -np.inf)
    top = np.argsort(-sims, axis=1)[:, :10]
    wrong = np.flatnonzero((labels[top[:, 0]] != labels) & (labels[top] == labels[:, None]).any(1))
    with torch.inference_mode():
        scores = scorer(*map(torch.from_numpy, (vectors[wrong], vectors[top[wrong]],
                                                side[wrong], side[top[wrong]])))  # fmt: skip
    best = top[wrong, scores.argmax(1).numpy()]
    assert (labels[best] == labels[wrong]).mean() > 0.4  # all wrong before


def test_the_untrained_stage_scorer_keeps_the_base_order():
    vectors, _, side = lost_classes(range(4), 5, seed=3)
    scorer = PairScorer(8, side_dim=16).eval()
    order = np.argsort(-(vectors[:4] @ vectors.T), axis=1)[:, 1:9]
    args = map(torch.from_numpy, (vectors[:4], vectors[order], side[:4], side[order]))
    with torch.inference_mode():
        scores = scorer(*args).numpy()
    assert (np.diff(scores, axis=1) <= 0).all()


def test_the_format_2_file_scores_as_torch_does(tmp_path):
    import onnxruntime as ort

    train = lost_classes(range(0, 8), 10, seed=2)
    settings = FitSettings(depth=6, epochs=2, elementwise=False)
    scorer, _ = fit_scorer(*train[:2], settings, log=lambda line: None, side=train[2])
    out = tmp_path / "r.onnx"
    assert export_scorer(scorer, out, "b" * 64, {"side_stage": "layer3"}) <= 1e-5
    session = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    assert [i.name for i in session.get_inputs()] == [*served.INPUTS, *served.SIDE_INPUTS]
    exact = copy.deepcopy(scorer).double()
    rng = np.random.default_rng(0)
    for b, n in [(1, 1), (3, 6), (2, 33)]:
        query = rng.normal(size=(b, 8)).astype(np.float32)
        query /= np.linalg.norm(query, axis=1, keepdims=True)
        candidates = rng.normal(size=(b, n, 8)).astype(np.float32)
        candidates /= np.linalg.norm(candidates, axis=2, keepdims=True)
        query_side = rng.uniform(0, 3, size=(b, 16)).astype(np.float32)
        candidate_side = rng.uniform(0, 3, size=(b, n, 16)).astype(np.float32)
        candidate_side[:, -1] = 0.0  # a missing candidate
        arrays = (query, candidates, query_side, candidate_side)
        with torch.inference_mode():
            expected = exact(*map(torch.from_numpy, arrays)).numpy()
        (got,) = session.run(["scores"], dict(zip(session_names(session), arrays, strict=True)))
        np.testing.assert_allclose(got, expected, rtol=0, atol=1e-5)


def session_names(session) -> list[str]:
    return [i.name for i in session.get_inputs()]


def test_a_stage_reranker_without_its_features_is_refused_in_one_line(tmp_path):
    assert written.FORMAT_SIDE == served.FORMAT_SIDE
    out = tmp_path / "r.onnx"
    export_scorer(PairScorer(8, side_dim=16), out, "c" * 64, {"side_stage": "layer3"})
    opened = served.PairwiseReranker(out)
    assert (opened.side_dim, opened.side_stage, opened.meta["format"]) == (16, "layer3", "2")
    vectors, labels, side = lost_classes(range(4), 5, seed=5)
    spec = parse_rerank(f"pairwise:model={out},depth=5")
    with pytest.raises(NearsightError, match="layer3 features too") as error:
        evaluate_reranked(vectors, labels, (1,), spec, with_nmi=False)
    assert "\n" not in str(error.value)
    with pytest.raises(NearsightError, match="16-d stage features, got 4-d"):
        evaluate_reranked(vectors, labels, (1,), spec, side=side[:, :4], with_nmi=False)
    # an embeddings-only file ignores features given to it: one that re-orders (minus the
    # cosine: each list reversed) scores the same with them as without
    reversing = PairScorer(8)
    with torch.no_grad():
        reversing.alpha.fill_(-10.0)
    plain_file = tmp_path / "p.onnx"
    export_scorer(reversing, plain_file, "c" * 64)
    spec = parse_rerank(f"pairwise:model={plain_file},depth=5")
    with_side = evaluate_reranked(vectors, labels, (1,), spec, side=side, with_nmi=False)
    assert with_side == evaluate_reranked(vectors, labels, (1,), spec, with_nmi=False)
    plain = evaluate_reranked(vectors, labels, (1,), parse_rerank("none"), with_nmi=False)
    assert with_side["map@r"] < plain["map@r"]  # it did re-order (the worst first)


def test_stage_features_of_an_exported_model_are_torchs(onnx_gallery):
    from PIL import Image

    from nearsight.models.checkpoint import load_embedding_net
    from nearsight.models.loading import load_embedder
    from nearsight.search.rerank.stage_features import StageFeaturizer, embed_with_stage

    net = load_embedding_net(onnx_gallery.checkpoint).eval()
    embedder = load_embedder(onnx_gallery.model, device="cpu")
    paths = sorted(onnx_gallery.data.rglob("*.png"))[:5]
    images = np.stack([embedder.preprocess(Image.open(p)) for p in paths])
    embeddings, features = StageFeaturizer(onnx_gallery.model, "layer3").run(images)
    with torch.inference_mode():
        x = (torch.from_numpy(images) - net.mean) / net.std
        for name, layer in net.trunk.named_children():
            x = layer(x)
            if name == "layer3":
                break
        expected = x.mean(dim=(2, 3)).numpy()
    np.testing.assert_allclose(features, expected, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(embeddings, embedder.embed(images), rtol=0, atol=1e-5)
    result, side = embed_with_stage(onnx_gallery.model, "layer2", paths, desc="test")
    assert side.shape == (5, 128) and result.embeddings.shape == (5, embedder.dim)
    with pytest.raises(NearsightError, match="stage must be one of"):
        StageFeaturizer(onnx_gallery.model, "layer9")


def test_stage_features_equal_their_definition_on_centred_unit_rows():
    """side_features takes the stored rows and never forms the centred unit ones; its six
    numbers must be those of the definition (centre on the mean, a missing row stays zero,
    normalise, then cosines, ranks and the anchor), here in plain float64 loops."""
    from nearsight.training.pairwise.scorer import SIDE_TEMPERATURE, side_features

    rng = np.random.default_rng(5)
    b, n, f = 3, 7, 24
    mean = rng.uniform(0.5, 1.5, f)
    query_side = rng.uniform(0, 3, (b, f))
    candidate_side = rng.uniform(0, 3, (b, n, f))
    candidate_side[1, 4] = 0.0  # a missing candidate
    candidate_side[2, 2] = mean + 1e-3 * rng.normal(size=f)  # near the mean: a short row

    def unit(x):
        return x / max(np.linalg.norm(x), 1e-12)

    expected = np.zeros((b, n, 6))
    for row in range(b):
        q = unit(query_side[row] - mean)
        units = [np.zeros(f) if not c.any() else unit(c - mean) for c in candidate_side[row]]
        sims = np.array([u @ q for u in units])
        top = np.exp((sims - sims.max()) / SIDE_TEMPERATURE)
        top /= top.sum()
        anchor = sum(t * u for t, u in zip(top, units, strict=True))
        for i, u in enumerate(units):
            above = sum(1 / (1 + np.exp(-(s - sims[i]) / SIDE_TEMPERATURE)) for s in sims)
            expected[row, i] = [sims[i], sims[i] - sims.max(), sims[i] - sims.mean(),
                                np.log1p(above - 0.5), u @ anchor, sims.max()]  # fmt: skip
    unit_queries = torch.nn.functional.normalize(torch.from_numpy(query_side - mean), dim=-1)
    with torch.inference_mode():
        got = side_features(unit_queries, torch.from_numpy(candidate_side), torch.from_numpy(mean))
    np.testing.assert_allclose(got.numpy(), expected, rtol=0, atol=1e-9)


def test_the_stage_is_found_by_structure_on_a_multi_head_model(tmp_path):
    """On a multi-level model the last node scoped /layer3/ is the layer3 head's Gemm; the
    stage read is the feature map its blocks hand on, for single- and multi-head models
    alike: torch's layer3 output, pooled."""
    import onnx

    from nearsight.models.checkpoint import load_embedding_net, save_checkpoint
    from nearsight.models.embedding import EmbeddingConfig, build_embedding_net
    from nearsight.models.export import export_onnx
    from nearsight.search.rerank.stage_features import StageFeaturizer, stage_feature_map

    torch.manual_seed(0)
    config = EmbeddingConfig(dim=8, image_size=32, arch="resnet18",
                             heads=["layer2", "layer3", "layer4"], embedding="concat")  # fmt: skip
    checkpoint, model = tmp_path / "m.pt", tmp_path / "m.onnx"
    save_checkpoint(checkpoint, build_embedding_net(config))
    export_onnx(checkpoint, model)
    graph = onnx.load(str(model))
    last_named = [node for node in graph.graph.node if "/layer3/" in node.name][-1]
    assert last_named.op_type == "Gemm"  # what reading by name alone took
    found = stage_feature_map(graph, "layer3")
    assert found is not None and found != last_named.output[0]
    net = load_embedding_net(checkpoint).eval()
    images = np.random.default_rng(0).uniform(size=(3, 3, 32, 32)).astype(np.float32)
    for stage in ("layer2", "layer3"):
        _, features = StageFeaturizer(model, stage).run(images)
        with torch.inference_mode():
            x = (torch.from_numpy(images) - net.mean) / net.std
            for name, layer in net.trunk.named_children():
                x = layer(x)
                if name == stage:
                    break
        np.testing.assert_allclose(features, x.mean(dim=(2, 3)).numpy(), rtol=1e-4, atol=1e-4)


def test_a_model_without_the_stage_is_refused_in_one_line(tmp_path):
    """A graph with no ResNet stage (a foreign model), or a file that is no ONNX model."""
    import onnx
    from onnx import TensorProto, helper

    from nearsight.search.rerank.stage_features import stage_output_model

    node = helper.make_node("Identity", ["images"], ["embeddings"], name="/layer3/Identity")
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("images", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("embeddings", TensorProto.FLOAT, ["N", 4])],
    )  # fmt: skip
    foreign = tmp_path / "foreign.onnx"
    onnx.save(helper.make_model(graph), str(foreign))
    with pytest.raises(NearsightError, match="no trunk stage layer3") as error:
        stage_output_model(foreign, "layer3")
    assert "\n" not in str(error.value)
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"not a model")
    with pytest.raises(NearsightError, match="is not an ONNX model"):
        stage_output_model(junk, "layer3")
