"""Training the pairwise scorer on a training split's embeddings (``nearsight rerank train``).

The training split's classes are divided, by a seeded draw, into classes to fit on and
held-out classes to choose on; the test classes are never seen. Every fitting item queries the
other fitting items; its ``depth`` nearest (exact, by the embedding) are its candidate list,
and each (query, candidate) pair is labelled same-class or not: binary cross-entropy over all
the pairs, as OML's pairwise postprocessor and Reranking Transformers train theirs. After each
epoch the held-out classes are scored by the papers' leave-one-out protocol
(nearsight.data.metrics.retrieval.evaluate, re-ranked); the epoch kept is the one with the
best held-out Recall@1 (then MAP@R) among those that keep plain search's MAP@R. Epoch 0 is the
untrained scorer, which keeps the base order: when no epoch helps, that is what is kept, and
the report says so.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from nearsight.core.errors import NearsightError
from nearsight.training.pairwise.scorer import PairScorer

LIST_CHUNK = 512  # queries whose similarity rows are held at once (512 x N float32)
SCORE_CHUNK = 4096  # queries whose lists are scored (or standardised) at once


@dataclass
class FitSettings:
    depth: int = 20  # candidates per query, as the searches will re-rank them
    held_out: float = 0.2  # share of the training classes held out for the choice of epoch
    epochs: int = 30
    batch: int = 64  # queries per step (each with its depth candidates)
    lr: float = 1e-3
    weight_decay: float = 1e-4
    hidden: int = 32  # the cost of a search is mostly this layer times 2D (bench/rerank.py)
    elementwise: bool = True  # q * c and |q - c| beside the list features
    keep_low: float = 0.05  # each query keeps same-class items with p ~ U(keep_low, 1)
    seed: int = 0


@dataclass
class EpochRow:
    epoch: int
    loss: float
    recall_at_1: float
    mean_ap: float  # average precision within the candidate list


@dataclass
class FitReport:
    fit_classes: list[int]
    held_out_classes: list[int]
    fit_items: int
    held_out_items: int
    depth: int
    plain: EpochRow  # the held-out classes without re-ranking
    chosen: EpochRow
    rows: list[EpochRow] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def helped(self) -> bool:
        return self.chosen.epoch > 0


def split_classes(labels: np.ndarray, held_out: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(fit classes, held-out classes), a seeded draw; each side has at least 2 classes."""
    classes = np.unique(labels)
    if len(classes) < 4:
        raise NearsightError(
            f"the training split has {len(classes)} classes; a re-ranker needs at least 4 (2 "
            "to fit on, 2 held out to choose on)"
        )
    if not 0 < held_out < 1:
        raise NearsightError(f"--held-out must be between 0 and 1, got {held_out}")
    count = min(len(classes) - 2, max(2, round(held_out * len(classes))))
    order = np.random.default_rng(seed).permutation(classes)
    return np.sort(order[count:]), np.sort(order[:count])


def thinned_lists(
    vectors: np.ndarray, labels: np.ndarray, depth: int, keep_low: float, rng: np.random.Generator
) -> np.ndarray:
    """[N, depth] rows: each row's nearest other rows (exact inner product), best first, after
    hiding a random share of its own class: each query keeps each same-class item with a
    probability drawn from U(keep_low, 1) (hidden ones come last, only if nothing else is left).

    Why: the embedding was trained on these classes, so their lists are nearly all same-class;
    on unseen classes they are not. Hiding positives makes training lists where the right
    answers are few and the near wrong ones many, as on classes the embedding never saw."""
    out = np.empty((len(labels), depth), dtype=np.int64)
    keep = rng.uniform(keep_low, 1.0, size=len(labels)).astype(np.float32)
    for start in range(0, len(labels), LIST_CHUNK):  # [chunk, N] at a time: memory stays flat
        rows = np.arange(start, min(start + LIST_CHUNK, len(labels)))
        sims = vectors[rows] @ vectors.T
        same = labels[rows, None] == labels[None, :]
        hidden = same & (rng.random(sims.shape, dtype=np.float32) > keep[rows, None])
        sims = np.where(hidden, sims - 10.0, sims)  # cosines are >= -1: hidden ones go last
        sims[np.arange(len(rows)), rows] = -np.inf
        top = np.argpartition(-sims, depth - 1, axis=1)[:, :depth]
        order = np.argsort(-np.take_along_axis(sims, top, 1), axis=1, kind="stable")
        out[rows] = np.take_along_axis(top, order, 1)
    return out


def list_scores(
    scorer: PairScorer | None,
    vectors: np.ndarray,
    labels: np.ndarray,
    lists: np.ndarray,
    side: np.ndarray | None = None,
) -> tuple[float, float]:
    """(Recall@1, mean average precision within the list) of candidate ``lists`` re-ordered by
    ``scorer`` (None: as they are); lists without a same-class item count 0 for both.
    ``side``: the items' stage features, for a scorer that takes them."""
    if scorer is not None:
        scorer.eval()
        table, rows = torch.from_numpy(vectors), torch.from_numpy(lists)
        with torch.inference_mode():  # in chunks: [chunk, depth, features] at a time
            parts = [
                scorer(table[chunk], table[rows[chunk]], *_sides(side, chunk, rows)).numpy()
                for chunk in torch.arange(len(lists)).split(SCORE_CHUNK)
            ]
            scores = np.concatenate(parts)
        lists = np.take_along_axis(lists, np.argsort(-scores, axis=1, kind="stable"), 1)
    hits = (labels[lists] == labels[:, None]).astype(np.float64)
    ranks = np.arange(1, lists.shape[1] + 1)
    precision = np.cumsum(hits, 1) / ranks
    ap = (precision * hits).sum(1) / np.maximum(hits.sum(1), 1)
    return float(hits[:, 0].mean()), float(ap.mean())


def _sides(
    side: np.ndarray | torch.Tensor | None, queries: torch.Tensor, lists: torch.Tensor
) -> tuple[torch.Tensor, ...]:
    """The scorer's stage-feature arguments for ``queries`` (rows) and their ``lists``."""
    if side is None:
        return ()
    side = torch.as_tensor(side)
    return side[queries], side[lists[queries]]


def fit_scorer(
    vectors: np.ndarray,
    labels: np.ndarray,
    settings: FitSettings | None = None,
    log: Callable[[str], None] = print,
    side: np.ndarray | None = None,
) -> tuple[PairScorer, FitReport]:
    """Train a :class:`PairScorer` on the embeddings ``vectors`` [N, D] (unit rows) of a
    training split with class ``labels`` [N]; return it (in eval mode) and the report.
    ``side`` [N, F]: a trunk stage's pooled features of the same items (the scorer then
    takes them too; nearsight.search.rerank.stage_features)."""
    settings = settings or FitSettings()
    start = time.perf_counter()
    vectors = np.ascontiguousarray(vectors, dtype=np.float32)
    labels = np.asarray(labels)
    if side is not None:
        side = np.ascontiguousarray(side, dtype=np.float32)
        if side.ndim != 2 or len(side) != len(vectors):
            raise NearsightError(f"stage features {side.shape} do not match {vectors.shape}")
    fit_classes, held_classes = split_classes(labels, settings.held_out, settings.seed)
    fit_rows = np.flatnonzero(np.isin(labels, fit_classes))
    held_rows = np.flatnonzero(np.isin(labels, held_classes))
    depth = min(settings.depth, len(fit_rows) - 1, len(held_rows) - 1)
    if depth < 2:
        raise NearsightError("too few training items for a re-ranker: it needs 3 per side")
    torch.manual_seed(settings.seed)
    rng = np.random.default_rng(settings.seed)
    fit_vectors, fit_labels = vectors[fit_rows], labels[fit_rows]
    held_vectors, held_labels = vectors[held_rows], labels[held_rows]
    fit_side = None if side is None else torch.from_numpy(side[fit_rows])
    held_side = None if side is None else side[held_rows]
    held_lists = thinned_lists(held_vectors, held_labels, depth, settings.keep_low, rng)
    table = torch.from_numpy(fit_vectors)

    def draw() -> tuple[torch.Tensor, torch.Tensor]:
        lists = thinned_lists(fit_vectors, fit_labels, depth, settings.keep_low, rng)
        same = (fit_labels[lists] == fit_labels[:, None]).astype(np.float32)
        return torch.from_numpy(lists), torch.from_numpy(same)

    lists, targets = draw()
    scorer = PairScorer(vectors.shape[1], hidden=settings.hidden, elementwise=settings.elementwise,
                        side_dim=0 if side is None else side.shape[1])  # fmt: skip
    sample = torch.randperm(len(table), generator=torch.Generator().manual_seed(settings.seed))
    sample = sample[:SCORE_CHUNK]  # the features' mean and spread, from a bounded sample
    centre = None if fit_side is None else fit_side.mean(0)
    scorer.fit_scale(table[sample], table[lists[sample]], *_sides(fit_side, sample, lists),
                     side_mean=centre)  # fmt: skip
    optimiser = torch.optim.AdamW(
        scorer.parameters(), lr=settings.lr, weight_decay=settings.weight_decay
    )
    positives = float(targets.mean())
    # same-class pairs are the rarer (or, with a strong embedding, the commoner) kind: weigh
    # the two kinds equally
    loss_fn = torch.nn.BCEWithLogitsLoss(pos_weight=torch.tensor((1 - positives) / positives))
    held = (held_vectors, held_labels, held_lists, held_side)
    plain = EpochRow(0, float("nan"), *list_scores(None, *held))
    first = EpochRow(0, float("nan"), *list_scores(scorer, *held))
    rows, best, best_state = [first], first, copy.deepcopy(scorer.state_dict())
    log(
        f"re-ranker: fitting on {len(fit_classes)} classes ({len(fit_rows)} items, "
        f"{positives:.0%} of the top-{depth} pairs same-class), choosing on "
        f"{len(held_classes)} held-out classes ({len(held_rows)} items): plain search "
        f"Recall@1 {plain.recall_at_1:.4f}, mAP {plain.mean_ap:.4f}"
    )
    generator = torch.Generator().manual_seed(settings.seed)
    for epoch in range(1, settings.epochs + 1):
        scorer.train()
        total, steps = 0.0, 0
        for batch in torch.randperm(len(table), generator=generator).split(settings.batch):
            logits = scorer(table[batch], table[lists[batch]], *_sides(fit_side, batch, lists))
            loss = loss_fn(logits, targets[batch])
            optimiser.zero_grad()
            loss.backward()
            optimiser.step()
            total, steps = total + float(loss.detach()), steps + 1
        row = EpochRow(epoch, total / steps, *list_scores(scorer, *held))
        rows.append(row)
        keeps = row.mean_ap >= plain.mean_ap
        if keeps and (row.recall_at_1, row.mean_ap) > (best.recall_at_1, best.mean_ap):
            best, best_state = row, copy.deepcopy(scorer.state_dict())
        log(
            f"epoch {epoch}: loss {row.loss:.4f}, held-out Recall@1 {row.recall_at_1:.4f}, "
            f"mAP {row.mean_ap:.4f}"
        )
        lists, targets = draw()  # a fresh draw of hidden positives each epoch
    scorer.load_state_dict(best_state)
    scorer.eval()
    return scorer, FitReport(
        fit_classes=[int(c) for c in fit_classes],
        held_out_classes=[int(c) for c in held_classes],
        fit_items=len(fit_rows),
        held_out_items=len(held_rows),
        depth=depth,
        plain=plain,
        chosen=best,
        rows=rows,
        seconds=time.perf_counter() - start,
    )
