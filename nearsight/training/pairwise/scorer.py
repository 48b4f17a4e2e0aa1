"""The pairwise scorer: (query, its top-N candidates) -> a score per candidate, in torch.

Exported whole to ONNX (features included), so search runs exactly this graph. Each pair
(q, c_i) is described by
- the pair itself, as in OML's ConcatSiamese head but on the embeddings: q * c_i and |q - c_i|;
- its place in the base ranking: cos(q, c_i), its gap to the first candidate's and to the mean,
  log(1 + rank);
- the candidates' agreement (the list context that Reranking Transformers and STIR get from
  attending over the top candidates, here as three numbers): c_i's mean cosine to the query's
  other top-K candidates, to all the other candidates, and log(1 + the number of candidates
  nearer to c_i than the query is), a soft k-reciprocal test.

The score is ``alpha * cos(q, c_i) + bias + mlp(features)`` with the MLP's last layer zero at
the start: an untrained scorer keeps the base order, and training moves away from it only as
far as the pairs ask.
"""

from __future__ import annotations

import torch
from torch import nn

CONTEXT_K = 5  # the query's top candidates whose agreement with each candidate is a feature
LIST_FEATURES = 11  # the per-candidate numbers beside the 2 * D elementwise ones
SIDE_FEATURES = 6  # the per-candidate numbers from a trunk stage's features (side_features)
SIDE_TEMPERATURE = 0.02  # of the soft ranks in the stage's space


def pair_features(
    query: torch.Tensor, candidates: torch.Tensor, elementwise: bool = True
) -> torch.Tensor:
    """[B, N, 2D + 8] features of ``query`` [B, D] with each of its ``candidates`` [B, N, D]
    (in the base search's order; a missing candidate is a zero vector). Written with shapes
    read from the tensors only, so the exported graph takes any B and N."""
    sims = torch.matmul(candidates, query.unsqueeze(-1)).squeeze(-1)  # [B, N]
    rank = torch.cumsum(torch.ones_like(sims), dim=1) - 1.0  # 0, 1, ... per row
    among = torch.matmul(candidates, candidates.transpose(1, 2))  # [B, N, N]
    others = 1.0 - (rank.unsqueeze(2) == rank.unsqueeze(1)).to(sims.dtype)  # j != i
    top = (rank < CONTEXT_K).to(sims.dtype).unsqueeze(1) * others
    context_top = (among * top).sum(2) / top.sum(2).clamp_min(1.0)
    context_all = (among * others).sum(2) / others.sum(2).clamp_min(1.0)
    # soft count (a hard comparison would flip on float noise, and the file must score as
    # torch does)
    nearer = (torch.sigmoid((among - sims.unsqueeze(2)) / 0.02) * others).sum(2)
    mean = sims.mean(dim=1, keepdim=True)
    first = sims[:, :1]
    # agreement weighted by how near each other candidate is to the query (softmax over j != i)
    weights = torch.exp(20.0 * (sims - first)).unsqueeze(1) * others
    context_near = (among * weights).sum(2) / weights.sum(2).clamp_min(1e-12)
    # contextual similarity: the correlation of the candidate's similarities to the list with
    # the query's (items of one class see the list alike)
    centred_q = sims - mean
    centred_c = among - among.mean(dim=2, keepdim=True)
    # (norms floored: a list of near-equal similarities must not amplify float noise)
    profile = torch.matmul(centred_c, centred_q.unsqueeze(-1)).squeeze(-1) / (
        centred_c.norm(dim=2).clamp_min(0.05) * centred_q.norm(dim=1, keepdim=True).clamp_min(0.05)
    )
    listed = torch.stack(
        [
            sims,
            sims - first,
            sims - mean,
            torch.log1p(rank),
            context_top,
            context_all,
            torch.log1p(nearer),
            sims * context_top,
            among[:, :, 0],
            context_near,
            profile,
        ],
        dim=2,
    )
    if not elementwise:
        return listed
    q = query.unsqueeze(1).expand_as(candidates)
    return torch.cat([q * candidates, (q - candidates).abs(), listed], dim=2)


def side_features(
    query_side: torch.Tensor, candidate_side: torch.Tensor, side_mean: torch.Tensor
) -> torch.Tensor:
    """[B, N, 6] numbers of each candidate in a second space: the trunk stage's features
    (query_side [B, F] already centred and unit; candidate_side [B, N, F] as stored, centred
    on ``side_mean`` [F] and made unit here, a missing candidate's zero row staying zero). As
    Reranking Transformers and STIR compare mid-level feature maps beside the global
    descriptor, here by the pooled map: its cosine, the gap to the list's best and mean, a
    soft rank among the candidates, and the same cosine against the query's top candidates'
    mean.

    Each centred unit row ``(c - m) / |c - m|`` is used only through inner products, so they
    are taken of the rows as given: ``c . x - m . x`` over ``|c - m|`` from ``|c|^2 - 2 c . m +
    |m|^2``. The [B, N, F] block is read by three products and one norm instead of being
    centred, masked and divided first (fewer passes over the widest tensor of a search)."""
    norms = candidate_side.norm(dim=-1)  # [B, N]; a zero row is a missing candidate
    both = torch.stack([query_side, side_mean.expand_as(query_side)], dim=2)  # [B, F, 2]
    dots = torch.matmul(candidate_side, both)  # [B, N, 2]: c . q and c . m
    mean_q = (query_side * side_mean).sum(-1, keepdim=True)  # [B, 1]
    centred_sq = norms.square() - 2.0 * dots[..., 1] + side_mean.square().sum()
    present = (norms > 0).to(dots.dtype)
    inverse = present / centred_sq.clamp_min(0.0).sqrt().clamp_min(1e-12)
    sims = (dots[..., 0] - mean_q) * inverse  # [B, N]
    best = sims.max(dim=1, keepdim=True).values
    mean = sims.mean(dim=1, keepdim=True)
    above = torch.sigmoid((sims.unsqueeze(1) - sims.unsqueeze(2)) / SIDE_TEMPERATURE).sum(2)
    soft_rank = torch.log1p(above - 0.5)  # j = i contributes sigmoid(0) = 0.5
    top = torch.softmax(sims / SIDE_TEMPERATURE, dim=1)  # the list's likeliest, in this space
    # the anchor sum_j top_j * unit_j, as (sum_j w_j c_j) - (sum_j w_j) m with w = top / |c - m|
    weights = top * inverse
    anchor = torch.matmul(weights.unsqueeze(1), candidate_side).squeeze(1)
    anchor = anchor - weights.sum(1, keepdim=True) * side_mean  # [B, F]
    to_anchor = torch.matmul(candidate_side, anchor.unsqueeze(-1)).squeeze(-1)
    to_anchor = (to_anchor - (anchor * side_mean).sum(-1, keepdim=True)) * inverse
    return torch.stack(
        [sims, sims - best, sims - mean, soft_rank, to_anchor, best.expand_as(sims)], dim=2
    )


class PairScorer(nn.Module):
    """Scores [B, N] of a query's candidates; higher: likelier the same class."""

    # buffers (registered in __init__): the features' standardisation and the stage mean
    shift: torch.Tensor
    scale: torch.Tensor
    side_mean: torch.Tensor

    def __init__(
        self,
        dim: int,
        hidden: int = 32,
        dropout: float = 0.1,
        elementwise: bool = True,
        side_dim: int = 0,
    ) -> None:
        """``side_dim``: the width of a trunk stage's pooled features given beside the
        embeddings (0: none; forward then takes query and candidates only)."""
        super().__init__()
        width = 2 * dim * elementwise + LIST_FEATURES + SIDE_FEATURES * (side_dim > 0)
        self.dim, self.elementwise, self.side_dim = dim, elementwise, side_dim
        # standardisation of the features, fitted on the training pairs (fit_scale)
        self.register_buffer("shift", torch.zeros(width))
        self.register_buffer("scale", torch.ones(width))
        # the stage features' training mean: post-ReLU maps all point one way until centred
        self.register_buffer("side_mean", torch.zeros(max(side_dim, 1)))
        self.mlp = nn.Sequential(
            nn.Linear(width, hidden),
            nn.ReLU(),
            nn.Dropout(dropout),
            nn.Linear(hidden, hidden),
            nn.ReLU(),
            nn.Dropout(dropout),
            nn.Linear(hidden, 1),
        )
        last = self.mlp[-1]
        assert isinstance(last, nn.Linear)
        nn.init.zeros_(last.weight)
        nn.init.zeros_(last.bias)
        self.alpha = nn.Parameter(torch.tensor(10.0))
        self.bias = nn.Parameter(torch.tensor(-5.0))

    @torch.no_grad()
    def fit_scale(
        self,
        query: torch.Tensor,
        candidates: torch.Tensor,
        query_side: torch.Tensor | None = None,
        candidate_side: torch.Tensor | None = None,
        side_mean: torch.Tensor | None = None,
    ) -> None:
        """Set the standardisation from (a sample of) the training lists, and the stage
        features' centre (``side_mean``, the training items' mean)."""
        if self.side_dim:
            assert side_mean is not None, "a scorer of stage features needs their mean"
            self.side_mean.copy_(side_mean)
        features = self.features(query, candidates, query_side, candidate_side)
        features = features.reshape(-1, self.shift.numel())
        self.shift.copy_(features.mean(0))
        self.scale.copy_(features.std(0).clamp_min(1e-6))

    def features(
        self,
        query: torch.Tensor,
        candidates: torch.Tensor,
        query_side: torch.Tensor | None = None,
        candidate_side: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """[B, N, width] unstandardised features of the pairs."""
        features = pair_features(query, candidates, self.elementwise)
        if not self.side_dim:
            return features
        if query_side is None or candidate_side is None:
            raise ValueError("this scorer takes the stage features of query and candidates")
        mean = self.side_mean
        query_side = nn.functional.normalize(query_side.to(mean.dtype) - mean, dim=-1)
        side = side_features(query_side, candidate_side.to(mean.dtype), mean)
        return torch.cat([features, side], dim=2)

    def forward(
        self,
        query: torch.Tensor,
        candidates: torch.Tensor,
        query_side: torch.Tensor | None = None,
        candidate_side: torch.Tensor | None = None,
    ) -> torch.Tensor:
        # float32 in and out; inside, the parameters' precision (float64 once exported)
        query, candidates = query.to(self.shift.dtype), candidates.to(self.shift.dtype)
        features = self.features(query, candidates, query_side, candidate_side)
        features = (features - self.shift) / self.scale
        sims = torch.matmul(candidates, query.unsqueeze(-1)).squeeze(-1)
        scores = self.alpha * sims + self.bias + self.mlp(features).squeeze(-1)
        return scores.to(torch.float32)
