"""A query image's trunk-stage features, for a pairwise re-ranker that scores by them.

A search by a gallery item reads the item's stored features (nearsight.search.rerank.
stage_store); a query image has none, so it is embedded by the gallery's stage model
(``stage_model.onnx``, written by ``nearsight rerank features`` beside the stored features):
the gallery's own model with the pooled stage output added. One onnxruntime run gives the
query's embedding, which the search uses, and its stage features, which the re-ranker takes.
The file is the gallery's model plus two nodes, so it runs where the model runs (onnxruntime
only: no onnx package, no torch). A raw vector has no image and so no stage features.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from nearsight.core.digest import file_sha256
from nearsight.core.errors import NearsightError
from nearsight.models.embedder import INPUT_NAME, OUTPUT_NAME, OnnxEmbedder
from nearsight.search.rerank.stage_features import OUTPUT

if TYPE_CHECKING:
    from PIL import Image

    from nearsight.search.rerank.stage_store import StageStore


class StageEmbedder(OnnxEmbedder):
    """A gallery's stage model: images -> (embeddings [N, D], stage features [N, C])."""

    stage: str = ""

    @classmethod
    def of_store(
        cls, store: StageStore, providers: Sequence[str] | None, optimization: str
    ) -> StageEmbedder:
        """The stage model of ``store``: one-line NearsightError when the store has none (it
        was written before query images could be re-ranked) or the file is not the one it
        records."""
        fix = f"nearsight rerank features --gallery {store.folder} --stage {store.stage}"
        if not store.stage_model:
            raise NearsightError(
                f"gallery {store.folder} stores {store.stage} features without the stage model "
                f"that gives a query image's (written by an older nearsight): run {fix} again"
            )
        path = store.folder / str(store.stage_model)
        try:
            found = file_sha256(path)
        except NearsightError as error:
            raise NearsightError(f"{error}: run {fix} again") from None
        if found != store.stage_model_sha256:
            raise NearsightError(f"{path} is not the stage model its features were stored with: "
                                 f"run {fix} again")  # fmt: skip
        model = cls(path, providers=providers, optimization=optimization)
        if OUTPUT not in [o.name for o in model.session.get_outputs()]:
            raise NearsightError(f"{path} has no {OUTPUT} output: run {fix} again")
        model.stage = store.stage
        return model

    def embed_with_stage(self, images: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(unit embeddings [N, D], stage features [N, C]) of model inputs [N, 3, S, S] in
        [0, 1], from one run."""
        self._check_batch(images)
        batch = np.ascontiguousarray(images, dtype=np.float32)
        embeddings, features = self.session.run([OUTPUT_NAME, OUTPUT], {INPUT_NAME: batch})
        embeddings = self._check_output(np.asarray(embeddings, np.float32), len(batch))
        return embeddings, np.asarray(features, np.float32)

    def images_with_stage(
        self, images: Sequence[Image.Image], batch_size: int = 32
    ) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`embed_with_stage` of decoded images, preprocessed as ``embed_images`` does."""
        if not len(images):
            raise ValueError("no images")
        parts = [
            self.embed_with_stage(
                np.stack([self.preprocess(i) for i in images[s : s + batch_size]])
            )
            for s in range(0, len(images), batch_size)
        ]
        return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])


def query_model(
    store: StageStore, providers: Sequence[str] | None = None, optimization: str = "all"
) -> StageEmbedder:
    """The stage model of ``store`` that embeds query images, opened once per store,
    providers and optimisation (:meth:`StageEmbedder.of_store`)."""
    key = (tuple(providers) if providers is not None else None, optimization)
    with store.query_lock:
        if key not in store.query_models:
            store.query_models[key] = StageEmbedder.of_store(store, providers, optimization)
        return store.query_models[key]
