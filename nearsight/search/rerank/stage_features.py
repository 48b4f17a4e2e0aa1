"""A trunk stage's pooled features from an exported embedding model, for the pairwise re-ranker.

The model file is left as it is. Its ONNX graph is read, and a copy gets one more output,
``stage_features`` [N, C]: the global average of the feature map a trunk stage hands on
(``layer2``, ``layer3``), beside ``embeddings``. The stage is found by the graph's structure:
its residual blocks (the nodes the exporter scopes ``/layer3/layer3.K/``) and the one 4-d
feature map that leaves them, whatever else reads it (the next stage, or a multi-level
model's own pooling and head of that stage, whose nodes are no feature map). One onnxruntime run gives both. Mid-level features carry what a head trained on
few classes throws away (on the digits bench, layer3's pooled features find the right unseen
digit first far more often than the embedding does); the re-ranker scores a candidate by both.
No torch: this runs where searches run.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

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
    try:
        model = onnx.load(str(model_path))
    except Exception as error:  # protobuf's DecodeError, OSError: not a readable ONNX file
        raise NearsightError(
            f"{model_path} is not an ONNX model ({' '.join(str(error).split())[:120]})"
        ) from None
    feature_map = stage_feature_map(model, stage)
    if feature_map is None:
        raise NearsightError(
            f"{model_path} has no trunk stage {stage} that nearsight can read (its ResNet "
            "stages, as nearsight's export writes them)"
        )
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


def stage_feature_map(model: Any, stage: str) -> str | None:
    """The name of the 4-d feature map that trunk ``stage`` of ONNX ``model`` hands on, or
    None when the graph has no such stage (or more than one map leaves it)."""
    import onnx

    scope = f"/{stage}/{stage}."  # the stage's blocks: torchvision's and timm's layerN.K
    inside = [node for node in model.graph.node if scope in node.name]
    produced = {name for node in inside for name in node.output}
    names = {id(node) for node in inside}
    leaving: list[str] = []
    for node in model.graph.node:
        if id(node) not in names:
            leaving += [name for name in node.input if name in produced and name not in leaving]
    leaving += [o.name for o in model.graph.output if o.name in produced and o.name not in leaving]
    try:
        inferred = onnx.shape_inference.infer_shapes(model).graph
    except Exception:  # a graph shape inference cannot read: no stage nearsight can trust
        return None
    ranks = {
        value.name: len(value.type.tensor_type.shape.dim)
        for value in [*inferred.value_info, *inferred.output]
        if value.type.tensor_type.HasField("shape")
    }
    maps = [name for name in leaving if ranks.get(name) == 4]
    return maps[0] if len(maps) == 1 else None


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
        graph = stage_output_model(model_path, stage)
        try:
            self._session = ort.InferenceSession(graph, options, providers=["CPUExecutionProvider"])
        except Exception as error:  # onnxruntime's own types, for a graph it cannot run
            raise NearsightError(
                f"{model_path}: its {stage} features cannot be read "
                f"({' '.join(str(error).split())[:160]})"
            ) from None

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
