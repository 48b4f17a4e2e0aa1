"""A trunk stage's pooled features from an exported embedding model, for the pairwise re-ranker.

The model file is left as it is. Its ONNX graph is read, and a copy gets one more output,
``stage_features`` [N, C]: the global average of the last feature map of a trunk stage
(``layer2``, ``layer3``: the node names the exporter writes, ``/net/layer3/...``), beside
``embeddings``. One onnxruntime run gives both. Mid-level features carry what a head trained on
few classes throws away (on the digits bench, layer3's pooled features find the right unseen
digit first far more often than the embedding does); the re-ranker scores a candidate by both.
No torch: this runs where searches run.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from nearsight.core.errors import NearsightError

OUTPUT = "stage_features"
STAGES = ("layer1", "layer2", "layer3", "layer4")


def stage_output_model(model_path: str | os.PathLike[str], stage: str) -> bytes:
    """The serialised ONNX model of ``model_path`` with the pooled ``stage`` output added."""
    try:  # the graph is edited with the onnx package: the training install's, not serving's
        import onnx
        from onnx import helper
    except ImportError:
        raise NearsightError(
            "reading a trunk stage needs the onnx package: pip install 'nearsight[train]'"
        ) from None

    if stage not in STAGES:
        raise NearsightError(f"stage must be one of {', '.join(STAGES)}, got {stage!r}")
    model = onnx.load(str(model_path))
    marker = f"/{stage}/"
    last = None
    for node in model.graph.node:  # in topological order: the last one ends the stage
        if marker in node.name:
            last = node
    if last is None:
        raise NearsightError(
            f"{model_path} has no trunk stage {stage} that nearsight can read (a nearsight "
            "ResNet export names its nodes /net/layerN/...)"
        )
    feature_map = last.output[0]
    pooled, flat = f"{OUTPUT}_pooled", OUTPUT
    model.graph.node.extend(
        [
            helper.make_node("GlobalAveragePool", [feature_map], [pooled], name=f"/{OUTPUT}/pool"),
            helper.make_node("Flatten", [pooled], [flat], name=f"/{OUTPUT}/flatten", axis=1),
        ]
    )
    model.graph.output.append(
        helper.make_tensor_value_info(flat, onnx.TensorProto.FLOAT, ["N", None])
    )
    return model.SerializeToString()


class StageFeaturizer:
    """Embeddings and a stage's pooled features of images, in one onnxruntime run."""

    def __init__(self, model_path: str | os.PathLike[str], stage: str) -> None:
        import onnxruntime as ort

        from nearsight.core.threads import worker_threads

        self.path, self.stage = Path(model_path), stage
        options = ort.SessionOptions()
        options.intra_op_num_threads = worker_threads()
        options.inter_op_num_threads = 1
        options.log_severity_level = 3
        self._session = ort.InferenceSession(
            stage_output_model(model_path, stage), options, providers=["CPUExecutionProvider"]
        )

    def run(self, images: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(embeddings [N, D], stage features [N, C]) of images [N, 3, S, S] in [0, 1]."""
        embeddings, features = self._session.run(
            ["embeddings", OUTPUT], {"images": np.ascontiguousarray(images, dtype=np.float32)}
        )
        return np.asarray(embeddings, np.float32), np.asarray(features, np.float32)


def embed_with_stage(
    model_path: str | os.PathLike[str],
    stage: str,
    paths: Sequence[str | Path],
    *,
    batch_size: int = 64,
    workers: int = 0,
    desc: str = "embedding",
):
    """``embed_paths`` of ``paths`` through the model with its ``stage`` output: (the result,
    whose embeddings are the model's, and the stage features [ok rows, C])."""
    from nearsight.data.embed import embed_paths
    from nearsight.models.loading import load_embedder

    embedder = load_embedder(model_path, device="cpu")
    featurizer = StageFeaturizer(model_path, stage)
    dim = embedder.dim

    def both(images: np.ndarray) -> np.ndarray:
        embeddings, features = featurizer.run(images)
        return np.concatenate([embeddings, features], axis=1)

    result = embed_paths(both, paths, image_size=embedder.image_size, resize=embedder.resize,
                         interpolation=embedder.spec.interpolation, batch_size=batch_size,
                         workers=workers, desc=desc)  # fmt: skip
    features = np.ascontiguousarray(result.embeddings[:, dim:])
    result.embeddings = np.ascontiguousarray(result.embeddings[:, :dim])
    return result, features
