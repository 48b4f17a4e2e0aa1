"""Training the pairwise scorer on a training split's embeddings (``nearsight rerank train``).

The training split's classes are divided, by a seeded draw, into classes to fit on and
held-out classes to choose on; the test classes are never seen. Every fitting item queries the
other fitting items; its ``depth`` nearest (exact, by the embedding, with a random share of its
own class hidden) are its candidate list, and each (query, candidate) pair is labelled
same-class or not: binary cross-entropy over all the pairs, as OML's pairwise postprocessor and
Reranking Transformers train theirs.

The choice is made on the held-out classes alone, by the papers' leave-one-out protocol: every
held-out item queries all the other held-out items, its ``depth`` nearest are re-ordered, and
Recall@1 is the share whose first is of its class (plain search's figure is exactly the
leave-one-out Recall@1 of those classes). Each candidate feature set is fitted with several
seeds; the epoch is the one of the best Recall@1 averaged over the seeds, and the feature set
the one of the larger average lift there. The trained scorer is kept only when that lift is
larger than its spread across the seeds (the best seed's minus the worst's) and than one
held-out query's share: a lift within the noise of training, or what one query moves, is no
lift. Otherwise the untrained scorer is kept, which keeps the
base order, and the report says so.
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
    # q * c and |q - c| beside the list features: True, False, or None to choose on the
    # held-out classes between the two
    elementwise: bool | None = None
    keep_low: float = 0.05  # each query keeps same-class items with p ~ U(keep_low, 1)
    seed: int = 0  # the class split's, and the first fit's (then seed + 1, ...)
    seeds: int = 3  # fits per feature set: their spread is the noise a lift must exceed


@dataclass
class EpochRow:
    epoch: int
    loss: float
    recall_at_1: float  # leave-one-out, over the held-out classes
    mean_ap: float  # average precision within the candidate list


@dataclass
class Candidate:
    """One feature set's fits: its best epoch (by the seeds' mean held-out Recall@1) and each
    seed's lift over plain search there."""

    elementwise: bool
    epoch: int
    lifts: list[float]  # held-out Recall@1 minus plain search's, one per seed
    resolution: float  # one held-out query's share: no lift is measured finer

    @property
    def noise(self) -> float:
        """What a lift must exceed: the seeds' spread, and never less than one query."""
        return max(self.spread, self.resolution)

    @property
    def lift(self) -> float:
        return float(np.mean(self.lifts))

    @property
    def spread(self) -> float:
        return float(np.max(self.lifts) - np.min(self.lifts))

    @property
    def beats_noise(self) -> bool:
        return self.lift > self.noise + 1e-9  # (a float's rounding is no lift)


@dataclass
class FitReport:
    fit_classes: list[int]
    held_out_classes: list[int]
    fit_items: int
    held_out_items: int
    depth: int
    plain: EpochRow  # the held-out classes without re-ranking
    chosen: EpochRow  # the kept scorer's (epoch 0: the untrained one, the base order)
    elementwise: bool  # the kept scorer's feature set
    candidates: list[Candidate] = field(default_factory=list)
    rows: list[EpochRow] = field(default_factory=list)  # the kept seed's epochs
    seconds: float = 0.0

    @property
    def helped(self) -> bool:
        """Whether a trained scorer was kept (it beat plain search by more than its spread)."""
        return self.chosen.epoch > 0

    @property
    def verdict(self) -> str:
        if self.helped:
            return f"epoch {self.chosen.epoch} kept"
        return (
            "no trained scorer beat plain search there by more than its spread across seeds: "
            "the file keeps the base order"
        )


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


def nearest_lists(vectors: np.ndarray, depth: int) -> np.ndarray:
    """[N, depth] rows: each row's nearest other rows (exact inner product), best first: the
    leave-one-out candidate lists."""
    out = np.empty((len(vectors), depth), dtype=np.int64)
    for start in range(0, len(vectors), LIST_CHUNK):
        rows = np.arange(start, min(start + LIST_CHUNK, len(vectors)))
        sims = vectors[rows] @ vectors.T
        sims[np.arange(len(rows)), rows] = -np.inf
        out[rows] = _top(sims, depth)
    return out


def _top(sims: np.ndarray, depth: int) -> np.ndarray:
    top = np.argpartition(-sims, depth - 1, axis=1)[:, :depth]
    order = np.argsort(-np.take_along_axis(sims, top, 1), axis=1, kind="stable")
    return np.take_along_axis(top, order, 1)


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
        out[rows] = _top(sims, depth)
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
    """Train :class:`PairScorer` s on the embeddings ``vectors`` [N, D] (unit rows) of a
    training split with class ``labels`` [N] and choose one on held-out classes (module
    docstring); return it (in eval mode) and the report. ``side`` [N, F]: a trunk stage's
    pooled features of the same items (the scorer then takes them too;
    nearsight.search.rerank.stage_features)."""
    settings = settings or FitSettings()
    if settings.seeds < 1 or settings.epochs < 1:
        raise NearsightError("a re-ranker needs at least one seed and one epoch")
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
    fit_vectors = vectors[fit_rows]
    fit = _Split(fit_vectors, labels[fit_rows], None if side is None else side[fit_rows],
                 nearest_lists(fit_vectors, depth))  # fmt: skip
    held_side = None if side is None else side[held_rows]
    held_vectors, held_labels = vectors[held_rows], labels[held_rows]
    held = (held_vectors, held_labels, nearest_lists(held_vectors, depth), held_side)
    plain = EpochRow(0, float("nan"), *list_scores(None, *held))
    log(
        f"re-ranker: fitting on {len(fit_classes)} classes ({len(fit_rows)} items), choosing on "
        f"{len(held_classes)} held-out classes ({len(held_rows)} items, each querying the "
        f"others): plain search leave-one-out Recall@1 {plain.recall_at_1:.4f}"
    )
    feature_sets = [True, False] if settings.elementwise is None else [settings.elementwise]
    seeds = [settings.seed + i for i in range(settings.seeds)]
    candidates, fits = [], {}
    for elementwise in feature_sets:
        runs = [_fit_one(fit, held, depth, settings, elementwise, seed, log) for seed in seeds]
        recall = np.array([[row.recall_at_1 for row in rows] for rows, _ in runs])
        mean_ap = np.array([[row.mean_ap for row in rows] for rows, _ in runs])
        # the epoch of the best mean Recall@1 over the seeds (then mean MAP), epoch 0 excluded
        epoch = 1 + max(range(settings.epochs),
                        key=lambda e: (recall[:, e + 1].mean(), mean_ap[:, e + 1].mean()))  # fmt: skip
        lifts = [float(r) for r in recall[:, epoch] - plain.recall_at_1]
        candidate = Candidate(elementwise, epoch, lifts, 1 / len(held_rows))
        candidates.append(candidate)
        fits[elementwise] = runs
        log(
            f"features {'embedding+list' if elementwise else 'list'}"
            f"{'+stage' if side is not None else ''}: epoch {epoch}, held-out Recall@1 lift "
            f"{candidate.lift:+.4f} (seeds {', '.join(f'{x:+.4f}' for x in candidate.lifts)}; "
            f"spread {candidate.spread:.4f})"
        )
    best = max(candidates, key=lambda c: c.lift)
    if best.beats_noise:
        runs = fits[best.elementwise]
        seed = max(range(len(runs)), key=lambda i: runs[i][0][best.epoch].recall_at_1)
        rows, states = runs[seed]
        scorer = _new_scorer(fit, settings, best.elementwise, seeds[seed])
        scorer.load_state_dict(states[best.epoch])
        chosen, elementwise = rows[best.epoch], best.elementwise
    else:
        # the untrained scorer keeps the base order; the cheapest feature set then
        elementwise = bool(settings.elementwise)
        scorer = _new_scorer(fit, settings, elementwise, settings.seed)
        rows, chosen = [plain], plain
    scorer.eval()
    return scorer, FitReport(
        fit_classes=[int(c) for c in fit_classes],
        held_out_classes=[int(c) for c in held_classes],
        fit_items=len(fit_rows),
        held_out_items=len(held_rows),
        depth=depth,
        plain=plain,
        chosen=chosen,
        elementwise=elementwise,
        candidates=candidates,
        rows=rows,
        seconds=time.perf_counter() - start,
    )


@dataclass
class _Split:
    vectors: np.ndarray
    labels: np.ndarray
    side: np.ndarray | None
    lists: np.ndarray  # each item's nearest others (the standardisation's sample)


def _new_scorer(fit: _Split, settings: FitSettings, elementwise: bool, seed: int) -> PairScorer:
    """An untrained scorer (it keeps the base order) standardised on the fitting lists."""
    torch.manual_seed(seed)
    side = None if fit.side is None else torch.from_numpy(fit.side)
    scorer = PairScorer(fit.vectors.shape[1], hidden=settings.hidden, elementwise=elementwise,
                        side_dim=0 if side is None else side.shape[1])  # fmt: skip
    table = torch.from_numpy(fit.vectors)
    lists = torch.from_numpy(fit.lists)
    sample = torch.randperm(len(table), generator=torch.Generator().manual_seed(seed))
    sample = sample[:SCORE_CHUNK]  # the features' mean and spread, from a bounded sample
    centre = None if side is None else side.mean(0)
    sides = _sides(side, sample, lists)
    query_side, candidate_side = sides if sides else (None, None)
    scorer.fit_scale(table[sample], table[lists[sample]], query_side, candidate_side, centre)
    return scorer


def _fit_one(
    fit: _Split,
    held: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None],
    depth: int,
    settings: FitSettings,
    elementwise: bool,
    seed: int,
    log: Callable[[str], None],
) -> tuple[list[EpochRow], list[dict[str, torch.Tensor]]]:
    """One scorer fitted for ``settings.epochs`` epochs: each epoch's held-out row and
    weights (epoch 0: the untrained scorer)."""
    rng = np.random.default_rng(seed)
    table = torch.from_numpy(fit.vectors)
    side = None if fit.side is None else torch.from_numpy(fit.side)

    def draw() -> tuple[torch.Tensor, torch.Tensor]:
        lists = thinned_lists(fit.vectors, fit.labels, depth, settings.keep_low, rng)
        same = (fit.labels[lists] == fit.labels[:, None]).astype(np.float32)
        return torch.from_numpy(lists), torch.from_numpy(same)

    scorer = _new_scorer(fit, settings, elementwise, seed)
    lists, targets = draw()
    optimiser = torch.optim.AdamW(
        scorer.parameters(), lr=settings.lr, weight_decay=settings.weight_decay
    )
    positives = float(targets.mean())
    # same-class pairs are the rarer (or, with a strong embedding, the commoner) kind: weigh
    # the two kinds equally
    loss_fn = torch.nn.BCEWithLogitsLoss(pos_weight=torch.tensor((1 - positives) / positives))
    rows = [EpochRow(0, float("nan"), *list_scores(scorer, *held))]
    states = [copy.deepcopy(scorer.state_dict())]
    generator = torch.Generator().manual_seed(seed)
    for epoch in range(1, settings.epochs + 1):
        scorer.train()
        total, steps = 0.0, 0
        for batch in torch.randperm(len(table), generator=generator).split(settings.batch):
            logits = scorer(table[batch], table[lists[batch]], *_sides(side, batch, lists))
            loss = loss_fn(logits, targets[batch])
            optimiser.zero_grad()
            loss.backward()
            optimiser.step()
            total, steps = total + float(loss.detach()), steps + 1
        rows.append(EpochRow(epoch, total / steps, *list_scores(scorer, *held)))
        states.append(copy.deepcopy(scorer.state_dict()))
        lists, targets = draw()  # a fresh draw of hidden positives each epoch
    log(
        f"  seed {seed}: held-out Recall@1 by epoch "
        + " ".join(f"{row.recall_at_1:.4f}" for row in rows[1:])
    )
    return rows, states
